"""`python -m trainrun.rayexec.worker`: what each rank of a RayExecutor runs. It joins the executor's Ray
cluster, finds its mailbox (mailbox.py) and runs the commands posted there in order, keeping between them
what a Horovod Ray worker keeps: the executable_cls instance, and the process with its MPI world (so
`hvd.init()` in one call and collectives in the next work). A command that raises sends the rank's failure
and ends the rank with exit 1 at once, as trainrun.run's ranks do: the launcher then ends the others (fail
fast), and the caller raises RankError naming the rank. "stop" ends the loop; the rank exits 0.

Commands (cloudpickled by the caller): ("start", cls, args, kwargs), ("execute", fn) -> fn(instance),
("run", fn, args, kwargs) -> fn(*args, **kwargs), ("stop",)."""
from __future__ import annotations

import os
import signal
import socket
import sys

ENV_ADDRESS = "TRAINRUN_RAYEXEC_ADDRESS"  # the Ray cluster's GCS address
ENV_MAILBOX = "TRAINRUN_RAYEXEC_MAILBOX"  # the mailbox actor's name, also its namespace
POLL_S = 30.0


class _Logger:
    """What ray_logger.log sends through: the rank's mailbox handle."""

    box = None

    @classmethod
    def send(cls, record) -> bool:
        """Send `record` to the caller's run(callbacks=...); False outside a RayExecutor's rank."""
        if cls.box is None:
            env = os.environ  # a rank of an elastic executor runs trainrun.run's task: join the cluster now
            if not (env.get(ENV_ADDRESS) and env.get(ENV_MAILBOX)):
                return False
            cls.box = _connect(env[ENV_ADDRESS], env[ENV_MAILBOX])
        import cloudpickle
        import ray

        ray.get(cls.box.send_log.remote(cloudpickle.dumps(record)))  # kept when the rank ends right after
        return True


def _connect(address: str, name: str):
    import logging

    import ray

    if ray.is_initialized():  # rank code joined the cluster itself (as a Horovod worker may)
        return ray.get_actor(name, namespace=name)
    ray.init(address=address, namespace=name, logging_level=logging.ERROR, log_to_driver=False,
             configure_logging=False)
    # Ray's core worker prints a stack on SIGTERM; the launcher's teardown sends one: end as a plain process
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return ray.get_actor(name, namespace=name)


def serve(box, rank: int, host: str) -> int:
    """Run the mailbox's commands until "stop"; the rank's exit code."""
    import cloudpickle
    import ray

    from trainrun.runfunc.task import _failure
    from trainrun.rayexec.mailbox import ERROR, OK

    ray.get(box.join.remote(rank, host))
    _Logger.box = box
    instance = None
    seq = 0
    while True:
        posted = ray.get(box.take.remote(seq, POLL_S, rank))
        if posted is None:
            continue
        blob, ranks = posted
        seq += 1
        if rank not in ranks:
            continue
        failed = False
        try:
            import pickle

            paths, inner = pickle.loads(blob)  # two layers: the caller's import path first, then the call
            sys.path += [p for p in paths if p not in sys.path]
            command = cloudpickle.loads(inner)
            if command[0] == "stop":
                return 0
            if command[0] == "start":
                cls, args, kwargs = command[1:]
                instance = cls(*args, **kwargs) if cls is not None else None
                value = None
            elif command[0] == "execute":
                value = command[1](instance)
            else:
                fn, args, kwargs = command[1:]
                value = fn(*args, **kwargs)
            try:
                outcome = cloudpickle.dumps((OK, value))
            except Exception as err:
                raise TypeError(f"the return value of rank {rank} cannot be pickled: {err}") from err
        except Exception as exc:
            import traceback

            sys.stderr.write("".join(traceback.format_exception(exc)))
            outcome, failed = cloudpickle.dumps((ERROR, _failure(exc, rank, host))), True
        ray.get(box.put.remote(seq - 1, rank, outcome, failed))
        if failed:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)  # as trainrun.run's ranks: the others may wait in a collective for this one


def main() -> int:
    env = os.environ
    rank = int(env.get("RANK", "0"))
    host = env.get("TRAINRUN_HOSTNAME") or socket.gethostname()
    box = _connect(env[ENV_ADDRESS], env[ENV_MAILBOX])
    return serve(box, rank, host)


if __name__ == "__main__":
    # run as the importable module, so the mailbox handle set here is the one horovod.ray.ray_logger imports
    from trainrun.rayexec import worker

    sys.exit(worker.main())
