"""`horovodrun --check-build`: what this install supports, in Horovod's layout ([X] / [ ]).

The probes look for installed packages without importing the frameworks (find_spec), except NCCL:
whether libnccl.so.2 loads (runtime/backends/nccl.available). Gloo, MXNet, DDL and CCL are never
there: trainrun's collectives are MPI's (CPU) and NCCL's (GPU).
"""
from __future__ import annotations

import importlib.util


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def build_facts() -> dict[str, bool]:
    """What trainrun's runtime can do here, by Horovod's names (the shim's build probes may use it too)."""
    from trainrun.runtime.backends.nccl import available as nccl_available

    mpi = _found("mpi4py")
    return {"tensorflow": _found("tensorflow"), "torch": _found("torch"), "mxnet": False,
            "mpi": mpi, "gloo": False, "nccl": nccl_available(), "ddl": False, "ccl": False}


def check_build_text(facts: dict[str, bool], version: str, trainrun_version: str) -> str:
    """Horovod's --check-build text for `facts` (build_facts())."""
    def x(key):
        return "X" if facts[key] else " "
    return "\n".join([
        f"Horovod v{version} (trainrun {trainrun_version}):",
        "",
        "Available Frameworks:",
        f"    [{x('tensorflow')}] TensorFlow",
        f"    [{x('torch')}] PyTorch",
        f"    [{x('mxnet')}] MXNet",
        "",
        "Available Controllers:",
        f"    [{x('mpi')}] MPI",
        f"    [{x('gloo')}] Gloo",
        "",
        "Available Tensor Operations:",
        f"    [{x('nccl')}] NCCL",
        f"    [{x('ddl')}] DDL",
        f"    [{x('ccl')}] CCL",
        f"    [{x('mpi')}] MPI",
        f"    [{x('gloo')}] Gloo",
    ])
