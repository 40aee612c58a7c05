"""A rank for fail-fast / signal / teardown tests.

Writes DIR/pid.RANK (JSON: pid, grandchild pid) once it is set up, then sleeps "forever" unless told
otherwise. Options:
  --grandchild         start a child (same process group) that sleeps forever; its pid goes in the file
  --ignore-term        ignore SIGTERM
  --term-cleanup FILE  on SIGTERM: spend 0.5 s "cleaning up", write FILE.RANK, exit 0
  --fail-rank R        rank R waits until all ranks wrote their pid file, writes 15 stderr lines, then ends:
  --code C             ... with exit code C (default 3)
  --signal S           ... by killing itself with signal number S instead
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--grandchild", action="store_true")
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--term-cleanup")
p.add_argument("--fail-rank", type=int)
p.add_argument("--code", type=int, default=3)
p.add_argument("--signal", type=int)
args = p.parse_args()
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.term_cleanup:
    def cleanup(*_):
        time.sleep(0.5)
        with open(f"{args.term_cleanup}.{rank}", "w") as f:
            f.write("cleaned up\n")
        os._exit(0)
    signal.signal(signal.SIGTERM, cleanup)

gc = None
if args.grandchild:
    gc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(60)"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
record = json.dumps({"pid": os.getpid(), "grandchild": gc and gc.pid})
tmp = os.path.join(args.dir, f".tmp.{rank}")
with open(tmp, "w") as f:
    f.write(record)
os.rename(tmp, os.path.join(args.dir, f"pid.{rank}"))
print(f"rank {rank} ready", flush=True)

if rank == args.fail_rank:
    while len([n for n in os.listdir(args.dir) if n.startswith("pid.")]) < size:
        time.sleep(0.02)
    for i in range(1, 16):
        print(f"rank {rank} stderr line {i}", file=sys.stderr)
    sys.stderr.flush()
    if args.signal:
        os.kill(os.getpid(), args.signal)
    sys.exit(args.code)

while True:
    time.sleep(60)
