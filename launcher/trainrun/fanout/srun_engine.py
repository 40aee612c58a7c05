"""The Slurm fan-out engine: inside an allocation, every remote host's agent runs in a job step of its
own, started by `srun`, and the framed channel rides that step's stdin/stdout. No SSH, no port.

One step per host, not one step for all agents: a step's stdin goes to every task and its tasks' output
interleaves in srun's stdout, so one step cannot carry several binary channels; a step per host
(`srun --overlap -N1 -n1 -w HOST -u`) is a byte-exact pipe, starting N of them together costs about what
one N-node step costs, and a lost host is known by which srun ended. `-u`: srun would otherwise hold
bytes until a newline. `--overlap`: the steps share the allocation's CPUs with the ranks.

The interpreter is picked on the host as over SSH (python_pick.py): the --python rule, and one line when the
host has none.

Teardown: the agent's stdin EOF (the launcher closed it, or died) makes it kill its ranks and exit, which
ends its step. A step that does not end is cancelled with `scancel JOB.STEP` (found by the step's unique
name): a SIGKILL to srun's process group would leave the tasks running. A lost host (its agent silent) is
cleaned up by `sweep`: a new step on that host runs the reaper (supervisor/reaper.py), as SSH's sweep does over a
new connection; slurmd, not the stopped agent, starts it.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess

from trainrun.errors import HostError
from trainrun.fanout.pipe_engine import PipeLink, PipeModuleChannel
from trainrun.fanout.python_pick import EarlyStderr, python_module_argv
from trainrun.plan.hosts import HostSpec
from trainrun.slurm.allocation import Allocation


def srun_argv(job_id: str, host: str, step_name: str, argv: list[str]) -> list[str]:
    """One single-task step on `host` of job `job_id`, unbuffered. Pure."""
    return ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "-u",
            f"--job-name={step_name}", "--kill-on-bad-exit=1", *argv]


def route_addresses(host: str) -> tuple[str, str]:
    """(host's address, this machine's address on the route to it). A UDP socket's connect() picks the route
    without sending anything."""
    try:
        peer = socket.gethostbyname(host)
    except OSError:
        return host, "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))
            return peer, s.getsockname()[0]
    except OSError:
        return peer, "127.0.0.1"


class SrunLink(PipeLink):
    """An agent in its own job step: srun's stdin/stdout are the channel."""

    def __init__(self, host: str, argv: list[str], job_id: str, step_name: str):
        super().__init__(host, argv, new_session=True)  # Ctrl-C on the terminal is the launcher's, not srun's
        self.job_id, self.step_name = job_id, step_name
        self.peer_address, self.local_address = route_addresses(host)
        self._first_err = EarlyStderr(host)  # a no-python line there ends the start at once

    def read(self) -> tuple[bytes, bytes, bool]:
        out, err, ended = super().read()
        self._first_err.feed(err)
        return out, err, ended

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            cancel_step(self.job_id, self.step_name)
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # srun alone (not its group): Slurm then cancels the step
                self.proc.wait()


def cancel_step(job_id: str, step_name: str) -> bool:
    """`scancel JOB.STEP` for the step of job `job_id` named `step_name`; False if it is gone already."""
    try:
        out = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    steps = [line.split()[0] for line in out.splitlines() if line.split()[1:] == [step_name]]
    for step in steps:
        subprocess.run(["scancel", step], capture_output=True, timeout=10)
    return bool(steps)


class SrunEngine:
    """FanoutEngine through `srun` inside the Slurm allocation `alloc`. `python`: the interpreter asked for on
    the hosts; `strict_python`: it was given with --python, so no other is taken in its place."""

    name = "slurm"
    reaches_local = True

    def __init__(self, alloc: Allocation, python: str, strict_python: bool = False):
        self.alloc, self.python, self.strict_python = alloc, python, strict_python
        self._nonce = os.urandom(4).hex()
        self._links: list[SrunLink] = []

    def reach(self, hosts: list[HostSpec]) -> dict[str, HostError]:
        if shutil.which("srun") is None:
            return {h.name: HostError(h.name, "srun", "no srun on PATH", hint="run trainrun where Slurm's commands are")
                    for h in hosts}
        names = set(self.alloc.names)
        return {h.name: HostError(h.name, "srun", f"not in Slurm job {self.alloc.job_id}'s allocation "
                                  f"({', '.join(self.alloc.names)})", hint="drop -H/--hostfile, or use --engine ssh")
                for h in hosts if h.name not in names}

    def start_agent(self, host: str) -> SrunLink:
        name = f"trainrun-agent-{self._nonce}-{host}"
        link = SrunLink(host, srun_argv(self.alloc.job_id, host, name,
                                  python_module_argv(self.python, "trainrun.agent", strict=self.strict_python)),
                        self.alloc.job_id, name)
        self._links.append(link)
        return link

    def run_module(self, host: str, module: str, *args: str, python: str | None = None,
                   timeout: float = 30.0) -> PipeModuleChannel:
        name = f"trainrun-{module.rsplit('.', 1)[-1]}-{self._nonce}-{host}"
        pick = python_module_argv(python or self.python, module, *args, strict=self.strict_python and not python)
        return PipeModuleChannel(srun_argv(self.alloc.job_id, host, name, pick))

    def sweep(self, host: str, job_id: str, mark_host: str, agent: str | None, timeout: float = 15.0) -> str | None:
        """In a new step on `host` (slurmd starts it: the stopped or cut-off agent plays no part), kill the tree
        of agent `agent` ("PID:START") and every process of job `job_id` marked for `mark_host`
        (supervisor/reaper.py). None when nothing is left, else why not."""
        name = f"trainrun-reaper-{self._nonce}-{host}"
        argv = srun_argv(self.alloc.job_id, host, name, python_module_argv(
            self.python, "trainrun.supervisor.reaper", job_id, mark_host, *([agent] if agent else []), strict=self.strict_python))
        try:
            # in the launcher's session: a child in another one, started after the ranks, is one of their
            # adopted orphans to LocalRanks' teardown, which would SIGKILL it while it cleans up
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            cancel_step(self.alloc.job_id, name)
            return f"the cleanup step did not end in {timeout:g}s"
        except OSError as err:
            return f"cannot start srun: {err}"
        if p.returncode == 0:
            return None
        said = p.stdout.strip() or (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[0]
        return f"processes left after the cleanup: {said}" if p.returncode == 1 else f"cleanup step failed: {said}"

    def close(self) -> None:
        """Steps still running (an agent that did not end) are cancelled."""
        for link in self._links:
            if link.proc.poll() is None:
                link.wait(0.0)
        self._links.clear()


