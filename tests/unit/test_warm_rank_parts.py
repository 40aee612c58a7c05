"""Warm ranks' pure parts and their hand-off on a real socketpair (elasticjob/spares.py, wire/spare_handoff.py,
elastic/spare.py). The spares themselves, becoming ranks of a restarted job, are tested end to end in
tests/elastic/test_warm_ranks.py."""
import os
import socket

from trainrun.elastic.spare import preload
from trainrun.wire.spare_handoff import Handoff, fd_env, recv_handoff, send_handoff
from trainrun.elasticjob.spares import late_bound, startup_env, warmable


def test_late_bound_variables_are_trainruns_contract_and_communication_settings():
    for name in ("TRAINRUN_RANK", "HOROVOD_FUSION_THRESHOLD", "PMI_FD", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "SLURM_PROCID"):
        assert late_bound(name), name
    # read by the interpreter or a library at import: a spare must have started with the same value
    for name in ("PYTHONPATH", "OMP_NUM_THREADS", "LD_PRELOAD", "PATH", "CUDA_VISIBLE_DEVICES", "KERAS_BACKEND"):
        assert not late_bound(name), name
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "RANK": "3", "TRAINRUN_JOB_ID": "abc"}
    assert startup_env(env) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}


def test_warmable_commands():
    assert warmable(("/venv/bin/python", "train.py", "--lr", "1"))
    assert warmable(("python3.11", "-m", "pkg.train"))
    assert not warmable(("python", "-m"))
    assert not warmable(("python", "-u", "train.py"))  # interpreter options: started cold
    assert not warmable(("./train.sh",))
    assert not warmable(("bash", "train.py"))


def test_preload_reads_the_programs_imports():
    assert preload("import torch\nimport trainrun.torch as hvd\n") == ["torch", "torch._dynamo"]
    assert preload("import horovod.torch as hvd\n") == ["torch", "torch._dynamo"]
    assert preload("from horovod.tensorflow import keras\n") == ["tensorflow"]
    assert preload("import tensorflow as tf\nimport numpy as np\n") == ["tensorflow", "numpy"]
    assert preload("from trainrun import keras\n") == ["keras"]  # `from trainrun import keras` is trainrun.keras
    assert preload("def f():\n    import numpy\n") == ["numpy"]  # imported later, still what the program needs
    assert preload("import mpi4py.MPI\nimport os\n") == []  # never MPI: it would initialise without the rank's PMI
    assert preload("from . import torch\n") == []  # a relative import is the program's own module
    assert preload("this is not python(") == []


def test_fd_env_names_the_descriptor_variables_by_position():
    env = {"PMI_FD": "7", "TRAINRUN_DIAG_FD": "9:1234", "TRAINRUN_CTL_FD": "11", "OTHER": "7"}
    assert fd_env(env, (7, 9, 11)) == {"PMI_FD": 0, "TRAINRUN_DIAG_FD": 1, "TRAINRUN_CTL_FD": 2}
    assert fd_env(env, (9,)) == {"TRAINRUN_DIAG_FD": 0}  # a variable naming a descriptor not passed is left


def test_handoff_carries_descriptors_and_renumbers_their_variables():
    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    try:
        env = {"PATH": "/bin", "TRAINRUN_DIAG_FD": f"{w}:{os.fstat(w).st_ino}", "BIG": "x" * 200_000}
        handoff = Handoff(("python", "t.py", "a"), "/tmp", env, (0, 1), fd_env(env, (w,)))
        import threading

        sender = threading.Thread(target=send_handoff, args=(ours, handoff, (w,)))
        sender.start()  # the message is larger than the socket buffer: sent while it is read
        got, fds = recv_handoff(theirs)
        sender.join()
        assert got == handoff and len(fds) == 1
        new_env = got.with_fds(fds)
        number, _, inode = new_env["TRAINRUN_DIAG_FD"].partition(":")
        assert int(number) == fds[0] and int(inode) == os.fstat(w).st_ino
        os.write(fds[0], b"through the passed descriptor")
        assert os.read(r, 100) == b"through the passed descriptor"
        os.close(fds[0])
        ours.close()
        assert recv_handoff(theirs) is None  # the owner gave the spare up: EOF
    finally:
        for f in (r, w):
            os.close(f)
        theirs.close()


def test_a_dash_m_programs_source_is_found_without_running_its_package(tmp_path, monkeypatch):
    """`python -m pkg.train`: the spare reads pkg/train.py's imports, and pkg/__init__.py does not run before
    the hand-off (it might read the rank's variables, which the spare does not have yet)."""
    import sys

    from trainrun.elastic.spare import _program_source

    pkg = tmp_path / "warmpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('ran')\n")
    (pkg / "train.py").write_text("import torch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert preload(_program_source(["-m", "warmpkg.train"])) == ["torch", "torch._dynamo"]
    assert "warmpkg" not in sys.modules
    assert _program_source(["-m", "no_such_pkg_anywhere.train"]) == ""
