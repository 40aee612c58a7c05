"""The TensorFlow kernel trainrun builds from source on first use (collective_op.cc: TrainrunCollective).

The library is compiled once per TensorFlow version and source with the compiler and flags TensorFlow
reports (tf.sysconfig), into TRAINRUN_CACHE_DIR (default ~/.cache/trainrun), under a file lock so
that the ranks of a job on one host compile it once. Where it cannot be built (no C++ compiler, no
TensorFlow headers), or with TRAINRUN_TF_NATIVE=0, `load()` is None and graph collectives keep
their pure-Python behaviour (graph_ops.py).
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tensorflow as tf

_SOURCE = Path(__file__).with_name("collective_op.cc")
_UNSET = object()
_loaded = _UNSET


def cache_dir() -> Path:
    # (here, not in the runtime's settings: the kernel's build cache is the process's; runtime/horovod_env.py lists it)
    return Path(os.environ.get("TRAINRUN_CACHE_DIR") or Path.home() / ".cache" / "trainrun")


def _flags() -> list[str]:
    return [*tf.sysconfig.get_compile_flags(), "-shared", "-fPIC", "-O2", "-w"]


def library_path() -> Path:
    """Where the compiled library for this TensorFlow and this source lives."""
    key = hashlib.sha1(_SOURCE.read_bytes() + tf.__version__.encode() + " ".join(_flags()).encode()).hexdigest()[:16]
    return cache_dir() / f"trainrun_tf_ops.{tf.__version__}.{key}.so"


def _build(target: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++/g++) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank on this host may be building it
        if target.exists():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            proc = subprocess.run([cxx, *_flags(), str(_SOURCE), "-o", tmp, *tf.sysconfig.get_link_flags()],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"{cxx} failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
            os.replace(tmp, target)  # atomic: a reader sees no file or the whole library
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _load():
    """(the op module, the library through ctypes), or None where it cannot be built (said once)."""
    global _loaded
    if _loaded is _UNSET and os.environ.get("TRAINRUN_TF_NATIVE") == "0":
        _loaded = None  # the user's choice: no kernels
    if _loaded is _UNSET:
        try:
            path = library_path()
            if not path.exists():
                _build(path)
            ops = tf.load_op_library(str(path))
            lib = ctypes.CDLL(str(path))  # the same loaded library: its C entry points (collective_op.cc)
            lib.trainrun_set_submit.argtypes, lib.trainrun_set_submit.restype = [ctypes.c_void_p], None
            lib.trainrun_output.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
            lib.trainrun_output.restype = ctypes.c_void_p
            lib.trainrun_complete.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_char_p]
            lib.trainrun_complete.restype = None
            _loaded = (ops, lib)
        except Exception as e:  # noqa: BLE001 (any failure: fall back, and say why)
            print(f"trainrun: warning: cannot build trainrun's TensorFlow kernel ({e}): graph collectives "
                  f"run through numpy_function nodes (slower), TensorFlow errors in graphs stay UnknownError, "
                  f"and each collective holds an inter-op thread while it waits", file=sys.stderr)
            _loaded = None
    return _loaded


def load():
    """(the op module, the library through ctypes), or None where the kernel cannot be built (said
    once on stderr) or TRAINRUN_TF_NATIVE=0."""
    return _load()
