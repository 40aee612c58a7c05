"""The shim's modules, imported as a rank would (its directory first on PYTHONPATH, one subprocess each):
every Horovod module name that Horovod's examples and elastic code import resolves, to trainrun's objects;
Horovod's build probes answer; and `--mpi openmpi`'s rank shim puts the directory on the path too."""
import json
import os
import subprocess
import sys

from trainrun.plan.horovod_shim import SHIM_DIR

CHECK_COMMON = r"""
import json
import horovod
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.process_sets import ProcessSet, global_process_set, add_process_set, remove_process_set
from horovod.common import util
import trainrun.runtime.exceptions, trainrun.elastic.state
from trainrun.runtime.process_sets import global_process_set as trainruns_global_set
assert HorovodInternalError is trainrun.runtime.exceptions.HorovodInternalError
assert HostsUpdatedInterrupt is trainrun.elastic.state.HostsUpdatedInterrupt
assert global_process_set is trainruns_global_set
probes = {n: getattr(util, n)() for n in ("mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
                                          "mpi_enabled", "gloo_enabled", "cuda_built", "rocm_built", "sycl_built")}
probes.update({f"ext_{n}": util.extension_available(n) for n in ("torch", "tensorflow", "mxnet")})
print(json.dumps({"version": horovod.__version__, "probes": probes, "split": util.split_list(list(range(5)), 2),
                  "pow2": [util.num_rank_is_power_2(n) for n in (1, 2, 3, 4)],
                  "ver": [util.is_version_greater_equal_than(v, t) for v, t in
                          (("2.21.0", "2.6.0"), ("2.9.0rc1", "2.9.0"), ("1.15.5", "2.0.0"), ("2.10.0", "2.9.0"))]}))
"""

CHECK_TORCH = r"""
import horovod.torch as hvd
import horovod.torch.elastic
from horovod.torch.elastic import TorchState, run
from horovod.torch import mpi_ops, compression, functions, optimizer, sync_batch_norm
from horovod.torch import *  # noqa
import trainrun.torch, trainrun.torch.elastic
for name in ("init", "allreduce", "allreduce_async_", "grouped_allreduce", "broadcast_parameters",
             "broadcast_optimizer_state", "DistributedOptimizer", "Compression", "SyncBatchNorm", "Average", "Adasum",
             "join", "ProcessSet"):
    assert getattr(hvd, name) is getattr(trainrun.torch, name), name
assert hvd.elastic is horovod.torch.elastic and TorchState is trainrun.torch.elastic.TorchState
assert run is trainrun.torch.elastic.run and hvd.elastic.run is run
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.elastic.state import TorchState as StateTorchState
import trainrun.torch.sampler
assert ElasticSampler is trainrun.torch.sampler.ElasticSampler is hvd.elastic.ElasticSampler
assert StateTorchState is TorchState
assert mpi_ops.allreduce is trainrun.torch.allreduce and allreduce is trainrun.torch.allreduce  # noqa: F405
assert hvd.sycl_built() is False and hvd.ddl_built() is False and hvd.ccl_built() is False and hvd.mpi_built()
print("TORCH OK")
"""


def run_python(code: str, **env):
    full = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": SHIM_DIR, **env}
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_common_modules_and_build_probes():
    got = json.loads(run_python(CHECK_COMMON))
    assert got["version"] == "0.28.1"
    p = got["probes"]
    assert (p["mpi_built"], p["mpi_enabled"], p["gloo_built"], p["gloo_enabled"], p["ddl_built"], p["ccl_built"],
            p["rocm_built"], p["sycl_built"]) == (True, True, False, False, False, False, False, False)
    assert p["ext_torch"] is True and p["ext_mxnet"] is False
    assert got["split"] == [[0, 1, 2], [3, 4]] and got["pow2"] == [True, True, False, True]
    assert got["ver"] == [True, False, False, True]


def test_torch_modules_are_trainruns():
    assert "TORCH OK" in run_python(CHECK_TORCH)


def test_tensorflow_and_keras_modules_are_trainruns():
    code = r"""
import horovod.tensorflow as hvd, horovod.tensorflow.keras as hk, horovod.keras as kk
import horovod.tensorflow.elastic, horovod.tensorflow.keras.elastic, horovod.tensorflow.keras.callbacks, horovod.keras.callbacks
import trainrun.tensorflow, trainrun.tensorflow.keras, trainrun.keras
assert hvd.DistributedGradientTape is trainrun.tensorflow.DistributedGradientTape
assert hvd.broadcast_variables is trainrun.tensorflow.broadcast_variables
assert hk.DistributedOptimizer is trainrun.tensorflow.keras.DistributedOptimizer
assert hk.callbacks.BroadcastGlobalVariablesCallback is trainrun.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback
assert hk.elastic.KerasState is trainrun.tensorflow.keras.elastic.KerasState
assert hvd.elastic.TensorFlowKerasState is trainrun.tensorflow.elastic.TensorFlowKerasState
assert kk.DistributedOptimizer is trainrun.keras.DistributedOptimizer and kk.callbacks.MetricAverageCallback
assert hk.sycl_built() is False and hk.mpi_built() and hvd.ccl_built() is False
assert kk.PartialDistributedOptimizer is trainrun.keras.PartialDistributedOptimizer
assert hk.PartialDistributedOptimizer is trainrun.tensorflow.keras.PartialDistributedOptimizer
from horovod.tensorflow.util import _executing_eagerly, _cache, vars_to_refs, refs_to_vars
assert hvd._executing_eagerly is _executing_eagerly and hvd.vars_to_refs is vars_to_refs  # as Horovod imports them
import tensorflow as tf
assert _executing_eagerly() is True and tf.function(lambda: tf.constant(_executing_eagerly()))().numpy() == False
v = [tf.Variable(1.0), tf.Variable(2.0)]
assert refs_to_vars(vars_to_refs(v))[1] is v[1]
calls = []
twice = _cache(lambda a: calls.append(a) or a * 2)
assert twice(3) == 6 and twice(3) == 6 and calls == [3]
print("TF OK")
"""
    assert "TF OK" in run_python(code, TF_CPP_MIN_LOG_LEVEL="2")


def test_open_mpi_rank_shim_puts_the_horovod_shim_first(tmp_path):
    from trainrun.plan.envcontract import JobInfo

    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "PYTHONPATH": "/user"}
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **ompi}
    code = "import os, horovod; print(os.environ['PYTHONPATH']); print(horovod.__file__)"
    proc = subprocess.run([sys.executable, "-m", "trainrun.mpiworld.ompi_rank", "2", JobInfo("j", "h", 1).to_arg(),
                           sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{SHIM_DIR}{os.pathsep}/user", os.path.join(SHIM_DIR, "horovod", "__init__.py")]
