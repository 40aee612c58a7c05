"""`python -m trainrun.runfunc.task`: what each rank of trainrun.run / horovod.run runs. Loads the call
(wire.py), runs it, sends its value back (streamed through the caller's socket where it can reach it,
channel.py; else as outcome lines, up to wire.max_lines_bytes()) and exits 0; on an exception prints the
traceback on stderr (as a script would, so the launcher's summary shows it), sends it as the outcome and
exits 1 at once -- trainrun then ends the other ranks (fail fast)."""
from __future__ import annotations

import os
import socket
import sys
import traceback


def _outcome(record) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(record)


def _traceback(exc: BaseException) -> str:
    """The traceback from the user's function down (main()'s own frame left out)."""
    tb = exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, tb.tb_next if tb and tb.tb_next else tb))


def _failure(exc: BaseException, rank: int, host: str):
    from trainrun.wire.runfunc_lines import RankFailure

    text = _traceback(exc)
    plain = RankFailure(rank, host, type(exc).__name__, str(exc), text)
    try:
        import cloudpickle

        cloudpickle.loads(cloudpickle.dumps(exc))
        return RankFailure(rank, host, type(exc).__name__, str(exc), text, exc)
    except Exception:
        return plain


def _send_value(env, attempt: int, rank: int, host: str, record) -> bytes | None:
    """Send an ("ok", ...) outcome: through the caller's socket if this rank reaches it (None: sent), else
    the pickled outcome for the lines, or a ("too big", ...) one in its place above the lines' limit.
    TypeError if the value does not pickle."""
    from trainrun.runfunc.channel import send_outcome
    from trainrun.wire.runfunc_lines import ENV_NONCE, ENV_SOCKET, max_lines_bytes

    try:
        if env.get(ENV_SOCKET) and send_outcome(env[ENV_SOCKET], env[ENV_NONCE], attempt, rank, record):
            return None
        blob = _outcome(record)
    except Exception as err:
        raise TypeError(f"the return value of rank {rank} cannot be pickled: {err}") from err
    limit = max_lines_bytes(env)
    if len(blob) > limit:
        return _outcome(("too big", len(blob), limit, host))
    return blob


def main() -> int:
    from trainrun.wire.runfunc_lines import ENV_NONCE, outcome_lines, read_call

    env = os.environ
    rank = int(env.get("RANK", "0"))
    attempt = int(env.get("TRAINRUN_RESTART_COUNT", "0"))
    host = env.get("TRAINRUN_HOSTNAME") or socket.gethostname()
    code = 0
    try:
        import pickle

        import cloudpickle

        paths, call = pickle.loads(read_call(env))
        sys.path += [p for p in paths if p not in sys.path]  # the caller's import path, after the rank's own
        func, args, kwargs = cloudpickle.loads(call)
        value = func(*args, **kwargs)
        blob = _send_value(env, attempt, rank, host, ("ok", value, int(env.get("WORLD_SIZE", "1"))))
    except Exception as exc:
        sys.stderr.write(_traceback(exc))
        blob, code = _outcome(("error", _failure(exc, rank, host))), 1
    sys.stdout.flush()
    sys.stderr.flush()
    if blob is None:  # the value went through the socket
        return code
    data = outcome_lines(env[ENV_NONCE], attempt, rank, blob)
    while data:
        data = data[os.write(1, data):]
    if code:
        # as an unhandled exception would, but without its wait: the runtime's exit-time shutdown is
        # collective, and the other ranks may be waiting in a collective for this one; the launcher
        # sees the exit and ends them
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
