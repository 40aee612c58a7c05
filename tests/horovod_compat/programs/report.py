"""What each Horovod-shaped program reports at its end, for the test: one `REPORT {json}` line per rank."""
import hashlib
import json
import sys


def report(rank: int, losses, weights, **extra) -> None:
    import horovod

    digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()[:16]
    print("REPORT " + json.dumps({"rank": rank, "losses": [float(x) for x in losses], "weights": digest,
                                  "horovod": horovod.__file__, **extra}), flush=True)
    sys.stdout.flush()
