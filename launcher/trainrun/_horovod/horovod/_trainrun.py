"""How each module of this `horovod` shim becomes trainrun's: `reexport(__name__, "trainrun.torch")`.

The shim module gets every public name of the trainrun module (the same objects: `hvd.allreduce is
trainrun.torch.allreduce`), Horovod's build probes that the trainrun module lacks (every Horovod framework
module has them), and a module `__getattr__`: a submodule of the shim first (`hvd.elastic` is
`horovod.torch.elastic`), then the trainrun module's own names, lazy ones included.
"""
from __future__ import annotations

import __future__
import importlib
import importlib.util
import sys
from types import ModuleType


def sycl_built() -> bool:
    """Horovod's probe for Intel GPUs (SYCL): trainrun has no such backend."""
    return False


def _probes() -> dict:
    from trainrun.runtime import lifecycle

    names = ("init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
             "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
             "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline",
             "stop_timeline")
    return {**{n: getattr(lifecycle, n) for n in names}, "sycl_built": sycl_built}


def reexport(name: str, target: str, probes: bool = False) -> None:
    """Make shim module `name` (already in sys.modules) show trainrun module `target`'s names; `probes`:
    also Horovod's basics (init, rank, ..., the *_built probes) where `target` has none of its own."""
    module, source = sys.modules[name], importlib.import_module(target)
    public = getattr(source, "__all__", None)
    if public is None:
        public = [n for n, v in vars(source).items() if not n.startswith("_") and not isinstance(v, (ModuleType, __future__._Feature))]
    values = {n: getattr(source, n) for n in public}
    if probes:
        values = {**{n: v for n, v in _probes().items() if not hasattr(source, n)}, **values}
    # (through the module's namespace: these names are made here, not declared on ModuleType)
    vars(module).update(values, __all__=sorted(values), __trainrun__=target)
    is_package = hasattr(module, "__path__")

    def __getattr__(attr: str):
        if is_package and not attr.startswith("_") and importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")
        try:
            return getattr(source, attr)
        except AttributeError:
            raise AttributeError(f"module {name!r} (trainrun's {target}) has no attribute {attr!r}") from None

    vars(module)["__getattr__"] = __getattr__
