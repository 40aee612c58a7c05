"""Facts about the host this code runs on, gathered here (agent HELLO, `--check`), as HostFacts."""
from __future__ import annotations

import os
import socket
import sys
from typing import Any

from trainrun.version import __version__
from trainrun.plan.facts import HostFacts, Nic
from trainrun.mpiworld.shm import shm_free


WORKER_PORTS = 8  # ports reported for TF_CONFIG's workers; local ranks beyond take the next numbers up


def free_port() -> int:
    """A TCP port free on this host now (MASTER_PORT for torch's env:// rendezvous)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on this host now (all held open together while asked, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch_facts(with_nics: bool = False) -> HostFacts:
    """The small set every agent reports before its ranks start (NICs: for MASTER_ADDR on the chosen NIC)."""
    from trainrun.facts.gpus import local_gpu_pool

    ports = free_ports(1 + WORKER_PORTS)
    nics: tuple[Nic, ...] = ()
    if with_nics:
        from trainrun.net.nics import local_nics

        nics = tuple(local_nics())
    return HostFacts(hostname=socket.gethostname(), cpus=len(os.sched_getaffinity(0)), python=sys.executable,
                     trainrun=__version__, gpus=local_gpu_pool(), free_port=ports[0], worker_ports=tuple(ports[1:]),
                     nics=nics, shm_free=shm_free())


def mpi_facts() -> dict[str, Any]:
    """Which MPI the ranks would use here (imports mpi4py: only for --check), as HostFacts fields. MPI is
    not initialized: MPI_Get_library_version needs no MPI_Init, and a singleton world would leave a
    /dev/shm segment behind when this process ends without MPI_Finalize (the probe server ends with
    os._exit)."""
    try:
        import mpi4py

        mpi4py.rc.initialize = mpi4py.rc.finalize = False
        from mpi4py import MPI

        version = MPI.Get_library_version().splitlines()[0].strip()
        return {"mpi4py": mpi4py.__version__, "mpi": version, "vendor": MPI.get_vendor()[0]}
    except Exception as err:  # any import or load problem is a fact to report, not a crash
        return {"mpi4py": None, "mpi": None, "mpi_error": f"{type(err).__name__}: {err}"}


def check_facts() -> HostFacts:
    """Everything `trainrun --check` shows per host."""
    import platform
    from dataclasses import replace

    from trainrun.facts.gpus import query_nvidia_smi
    from trainrun.net.nics import local_nics

    gpus = query_nvidia_smi()
    return replace(
        launch_facts(), nics=tuple(local_nics()), os=f"{platform.system()} {platform.release()}", distro=_distro(),
        python_version=platform.python_version(), gpu_models=tuple(g.name for g in gpus),
        gpu_memory_mib=tuple(g.memory_mib for g in gpus), **mpi_facts(), **version_facts(),
    )


def version_facts() -> dict[str, Any]:
    """Installed versions of the frameworks a job may use, as HostFacts fields. From package metadata,
    not imports: torch or TensorFlow would cost seconds to import, and a version is all --check needs."""
    from importlib import metadata

    def version(*dists: str) -> str | None:
        for dist in dists:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return None

    return {"numpy": version("numpy"), "torch": version("torch"),
            "tensorflow": version("tensorflow", "tensorflow-cpu", "tf-nightly"),
            "nccl": version("nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl-cu13"),
            "cuda_driver": _cuda_driver()}


def _cuda_driver() -> str | None:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def _distro() -> str:
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return ""


def main(argv: list[str]) -> int:
    """`python -m trainrun.facts [--workdir DIR]`: print check_facts() as JSON. `... serve HOST NONCE`:
    also serve the NIC probe (nics.serve, with the facts as "facts" on its first line) until stdin closes,
    so `--check` needs one remote process per host before the probe round, not two. With --workdir, a DIR
    that is not a directory here is reported as "workdir_missing" beside the facts (the ranks' cwd)."""
    import json
    import os

    missing = {}
    if argv[:1] == ["--workdir"] and len(argv) >= 2:
        if not os.path.isdir(argv[1]):
            missing = {"workdir_missing": argv[1]}
        argv = argv[2:]
    if not argv:
        print(json.dumps({**check_facts().to_json(), **missing}))
        return 0
    if len(argv) == 3 and argv[0] == "serve":
        from trainrun.net.nics import serve

        serve(argv[1], argv[2], extra={"facts": check_facts().to_json(), **missing})
        return 0
    print("usage: python -m trainrun.facts [--workdir DIR] [serve HOST NONCE]", file=sys.stderr)
    return 2
