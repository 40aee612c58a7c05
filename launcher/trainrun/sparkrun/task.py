"""The Spark barrier task of a trainrun job (runs in the executors' Python workers; pickled by reference, so the
executors need trainrun importable).

Every task of the stage runs `barrier_task`. The lowest partition on each host connects to the driver's one
listening socket, proves the secret (wire/spark_link.py), says its host, its host's task count (the slots) and
the host count, and waits for the launcher: START_AGENT -> it runs `python -m trainrun.agent` with the socket
as the agent's stdin and stdout (PR_SET_PDEATHSIG: when Spark kills this task's worker, the agent gets SIGTERM
and ends its ranks); EOF -> nothing runs there (the launcher's own machine). Every task then waits at the
stage's barrier, so the host's other tasks hold their slots until the job is over everywhere. A task returns
nothing: the ranks' values travel as runfunc's outcome lines through the agents.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator

CONNECT_TIMEOUT_S = 60.0


def barrier_task(address: str, port: int, secret: bytes, _partition: Iterable) -> Iterator:
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]  # by partition id
    me = ctx.partitionId()
    if me == hosts.index(hosts[me]):
        host_task(address, port, secret, hosts.count(hosts[me]), len(set(hosts)))
    ctx.barrier()
    return iter(())


def _nic_of(address: str) -> str | None:
    """The NIC holding `address` (this end of the route to the driver)."""
    try:
        import psutil
    except ImportError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addrs):
            return name
    return None


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def host_task(address: str, port: int, secret: bytes, slots: int, hosts: int) -> int | None:
    """Connect, prove the secret, then run this host's agent on the socket when the launcher asks; its exit
    status (None: no agent was asked for)."""
    from trainrun.wire.spark_link import START_AGENT, Hello, task_handshake

    sock = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
    try:
        hello = Hello(socket.gethostname(), slots, hosts, _nic_of(sock.getsockname()[0]))
        task_handshake(sock, secret, secrets.token_bytes(32), hello)
        sock.settimeout(None)
        if sock.recv(1) != START_AGENT:
            return None
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # trainrun's parent
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        proc = subprocess.Popen([sys.executable, "-m", "trainrun.agent"], stdin=sock.fileno(), stdout=sock.fileno(),
                                env=env, preexec_fn=_die_with_parent)
    finally:
        sock.close()  # the agent holds it now: its end is the launcher's EOF
    return proc.wait()
