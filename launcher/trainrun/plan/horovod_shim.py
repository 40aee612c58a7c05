"""Horovod's import names for ranks that trainrun starts: `import horovod.torch as hvd` gives trainrun.torch.

trainrun/_horovod/ holds a package named `horovod` (_horovod/horovod/) whose modules re-export trainrun's
(`hvd.allreduce is trainrun.torch.allreduce`). Nothing imports it by that name unless this directory is on
`sys.path`, and only the host that starts a rank puts it there: `rank_env` prepends it to the rank's
PYTHONPATH (supervisor/local.py for every rank trainrun starts itself, over SSH, Slurm and elastic jobs alike;
mpiworld/ompi_rank.py under `--mpi openmpi`). The path is that directory on that host, so a remote rank gets
its own host's trainrun install. This module is the rule (pure), in plan/ where the env contract is made; the
shim's directory holds only the shim. A plain `python -c 'import horovod'` is untouched.

Which `horovod` a rank gets (TRAINRUN_HOROVOD, set by `trainrun --horovod`, or in the launcher's environment):
- `trainrun` (default): this shim, first on the path, so it wins over a Horovod installed beside it;
- `installed`: no shim; `import horovod` finds whatever is installed (a real Horovod), or fails as usual.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

SHIM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_horovod")
VARIABLE = "TRAINRUN_HOROVOD"
CHOICES = ("trainrun", "installed")
DEFAULT = "trainrun"


def choice(environ: Mapping[str, str], given: str | None = None) -> str:
    """`given` (the --horovod option), else TRAINRUN_HOROVOD, else the default. ValueError for another value. Pure."""
    value = given if given is not None else environ.get(VARIABLE) or DEFAULT
    if value not in CHOICES:
        raise ValueError(f"{VARIABLE}={value!r}: use one of {', '.join(CHOICES)}")
    return value


def describe(which: str) -> str:
    """One line for --dry-run: what `import horovod` gives a rank."""
    if which == "installed":
        return "import horovod gives the Horovod installed on each host, if any (--horovod installed)"
    return "import horovod.* gives trainrun's modules (trainrun's shim first on PYTHONPATH; --horovod installed for a real Horovod)"


def rank_env(env: dict[str, str], shim_dir: str = SHIM_DIR) -> dict[str, str]:
    """`env` (a rank's full environment) with the shim first on PYTHONPATH; with TRAINRUN_HOROVOD=installed, without
    it (a launch from inside a rank inherits the shim on its PYTHONPATH). A value that is not a choice counts as
    the default here (the launcher refused it before starting). Pure."""
    path = env.get("PYTHONPATH")
    parts = [p for p in (path or "").split(os.pathsep) if p and p != shim_dir]
    if env.get(VARIABLE) == "installed":
        if path is None or parts == path.split(os.pathsep):
            return env
        return {**env, "PYTHONPATH": os.pathsep.join(parts)}
    return {**env, "PYTHONPATH": os.pathsep.join([shim_dir, *parts])}
