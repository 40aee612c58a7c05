"""The fan-out seam: how the launcher reaches hosts and runs trainrun there. Declarations only.

A **FanoutEngine** (SSH: ssh_engine.py; Slurm's srun: srun_engine.py; a local pipe for tests: pipe_engine.py)
does three things for the rest of the launcher, which never sees SSH or srun:

    reach(hosts)                  make every host usable, in parallel; per-host HostErrors for those that are not
    start_agent(host)             `python -m trainrun.agent` there, as an AgentLink (framed channel on stdin/stdout)
    run_module(host, module, ...) `python -m MODULE ARGS` there, as a ModuleChannel (--check's facts, the NIC probe)
    close()                       release every connection (agents' channels first: they end their agents)
    sweep(host, job, mark, agent) over a NEW connection, kill a lost host's agent tree and the job's processes
                                  there, then its /dev/shm segments and stack files (supervisor/reaper.py's main);
                                  None when no process is left, else why not (called from a thread)

Contract: no engine opens a listening port; the channel is the engine's own transport (an SSH session,
a pipe, srun's stdin/stdout). A host is named by `HostSpec.name`, unique within a job.
The one exception is Spark's (spark_engine.py), which has no transport into a running task: the tasks connect
back to ONE listening socket, which the Spark driver opens (sparkrun/driver.py, not an engine) for the stage's
start only, and every connection proves the job's secret (HMAC challenge-response, wire/spark_link.py) before
any byte of it is trusted; the engine itself only inherits the connected sockets.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional, Protocol

from trainrun.errors import HostError
from trainrun.plan.hosts import HostSpec


class AgentLink(Protocol):
    """The channel to one host's agent (AgentRanks reads and writes it)."""

    host: str
    peer_address: str    # the host's address as this machine reached it
    local_address: str   # this machine's address on that route

    def fileno(self) -> int: ...
    def read(self) -> tuple[bytes, bytes, bool]: ...  # (stdout bytes, stderr bytes, ended)
    def write(self, data: bytes) -> None: ...
    def shutdown(self) -> None: ...              # EOF to the agent: it kills what is left and exits
    def wait(self, timeout: float) -> None: ...  # until the agent has ended (or timeout)
    def close(self, wait: float) -> None: ...    # shutdown, then wait
    def disconnect(self) -> None: ...

    def why_ended(self) -> str | None:
        """What the kernel said of the connection once it ended (timed out, reset), for the line naming a lost
        host; None where the engine cannot know (a pipe, an srun step)."""
        ...


# FanoutEngine.sweep(host, job_id, mark_host, agent), as AgentRanks holds it (Optional: this runs on Python 3.9)
Sweeper = Callable[[str, str, str, Optional[str]], Optional[str]]


class ModuleChannel(Protocol):
    """A `python -m MODULE ARGS` process on a host; ends when its stdin closes or it exits."""

    def readline(self) -> bytes: ...
    def read(self) -> bytes: ...                 # stdout until EOF
    def send(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def exit_status(self) -> int: ...            # waits for the exit
    def stderr_text(self) -> str: ...            # what it wrote to stderr so far
    def close(self) -> None: ...


class FanoutEngine(Protocol):
    name: str
    reaches_local: bool  # can also run modules on this machine's host (srun can; SSH to ourselves is not assumed)

    def reach(self, hosts: list[HostSpec]) -> dict[str, HostError]: ...
    def start_agent(self, host: str) -> AgentLink: ...
    def run_module(self, host: str, module: str, *args: str, python: str | None = None,
                   timeout: float = 30.0) -> ModuleChannel: ...
    def sweep(self, host: str, job_id: str, mark_host: str, agent: str | None) -> str | None: ...
    def close(self) -> None: ...
