"""horovod.tensorflow: trainrun.tensorflow"""
from .._trainrun import reexport

reexport(__name__, "trainrun.tensorflow", probes=True)

# Horovod's horovod.tensorflow imports these helpers from its util module (its tests call hvd._executing_eagerly())
from .util import _cache, _executing_eagerly, _make_subgraph, refs_to_vars, vars_to_refs  # noqa: E402,F401
