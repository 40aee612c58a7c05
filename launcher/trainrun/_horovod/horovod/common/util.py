"""horovod.common.util: Horovod's build probes and small helpers, answered for trainrun.

Horovod asks its compiled extensions (in a forked process) what they were built with; trainrun builds
nothing, so the answers are what this install can do: MPI always (mpi4py), NCCL when libnccl.so.2 loads,
no Gloo, DDL or oneCCL; a framework's "extension" is available when the framework is installed
(trainrun.torch / trainrun.tensorflow need nothing else). `verbose` is accepted and prints one line.
"""
from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager

EXTENSIONS = ["tensorflow", "torch", "mxnet"]
_FRAMEWORKS = {"tensorflow": "tensorflow", "torch": "torch"}  # Horovod's extension name -> the package trainrun binds


def _say(verbose: bool, what: str, result) -> None:
    if verbose:
        print(f"trainrun: {what}: {result}")


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether trainrun's binding for `ext_base_name` ('torch', 'tensorflow', 'mxnet') can be used here."""
    package = _FRAMEWORKS.get(ext_base_name)
    result = package is not None and importlib.util.find_spec(package) is not None
    _say(verbose, f"extension {ext_base_name} available", result)
    return result


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether `ext_base_name` sees a GPU here (imports the framework)."""
    result = False
    if extension_available(ext_base_name):
        if ext_base_name == "torch":
            import torch

            result = torch.cuda.is_available()
        else:
            import tensorflow as tf

            result = bool(tf.config.list_physical_devices("GPU"))
    _say(verbose, f"extension {ext_base_name} running with GPU", result)
    return result


def _built(what: str, result: bool, verbose: bool) -> bool:
    _say(verbose, f"built with {what}", result)
    return result


def mpi_built(verbose: bool = False) -> bool:
    return _built("MPI", True, verbose)


def gloo_built(verbose: bool = False) -> bool:
    return _built("Gloo", False, verbose)


def nccl_built(verbose: bool = False) -> bool:
    from trainrun.runtime.lifecycle import nccl_built as probe

    return _built("NCCL", probe(), verbose)


def ddl_built(verbose: bool = False) -> bool:
    return _built("DDL", False, verbose)


def ccl_built(verbose: bool = False) -> bool:
    return _built("oneCCL", False, verbose)


def mpi_enabled() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def cuda_built() -> bool:
    from trainrun.runtime.lifecycle import cuda_built as probe

    return probe()


def rocm_built() -> bool:
    return False


def sycl_built() -> bool:
    return False


@contextmanager
def env(**kwargs):
    """Set these environment variables (None: leave alone) for the block, then put back what was there."""
    changed = {k: v for k, v in kwargs.items() if v is not None}
    before = {k: os.environ.get(k) for k in changed}
    os.environ.update(changed)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def num_rank_is_power_2(num_rank: int) -> bool:
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def split_list(items, n: int) -> list:
    """`items` in `n` contiguous chunks whose lengths differ by at most one, the longer ones first."""
    size, extra = divmod(len(items), n)
    bounds = [i * size + min(i, extra) for i in range(n + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(n)]


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Whether version string `ver` is at least `target` ("major.minor.patch"), by PEP 440 (Horovod's helper,
    which its tests and examples use for TensorFlow's version)."""
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"This function only accepts string arguments. Received: {ver!r}, {target!r}")
    if len(target.split(".")) != 3:
        raise ValueError(f"We only accepts target version values in the form of: major.minor.patch. Received: {target}")
    from packaging import version

    return version.parse(ver) >= version.parse(target)


def is_iterable(x) -> bool:
    try:
        iter(x)
    except TypeError:
        return False
    return True
