"""Variable and object helpers of horovod.tensorflow: make every rank start from root's state.

`broadcast_variables` works eagerly (assigns now) and in graphs (returns the op that assigns); all
variables travel in one step (async broadcasts started together, then one wait), named after their
position and name so that every rank must pass the same list.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import trainrun.runtime as rt
from trainrun.runtime.process_sets import global_process_set


def _broadcast_arrays(arrays, root_rank, names, process_set) -> list:
    """root_rank's arrays on every rank (fresh, writeable copies of the inputs, broadcast in place)."""
    bufs = [np.array(a, order="C", copy=True) for a in arrays]
    handles = [rt.broadcast_async_(b, root_rank, name=n, process_set=process_set) for b, n in zip(bufs, names)]
    for h in handles:
        rt.synchronize(h)
    return bufs


def _var_name(v) -> str:
    return str(getattr(v, "path", None) or getattr(v, "name", "var"))


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False,
                        prefix="broadcast_variables"):
    """Assign root_rank's values to `variables` (tf.Variables or Keras variables) on every rank.
    Eagerly this happens now (returns None); in a graph the returned op does it when run."""
    variables = list(variables)
    names = [f"{prefix}.{i}.{_var_name(v)}" for i, v in enumerate(variables)]
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    if tf.executing_eagerly():
        values = _broadcast_arrays([np.asarray(v.numpy()) for v in variables], root_rank, names, process_set)
        for v, value in zip(variables, values):
            v.assign(value)
        return None
    reads = [tf.convert_to_tensor(v) for v in variables]
    outs = tf.numpy_function(lambda *a: _broadcast_arrays(a, root_rank, names, process_set), reads,
                             [r.dtype for r in reads], stateful=True, name="TrainrunBroadcastVariables")
    return tf.group(*[v.assign(tf.reshape(o, r.shape)) for v, o, r in zip(variables, outs, reads)])


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: root_rank's values assigned to `variables` on every rank; returns
    their values after it (eagerly now; in a graph, tensors that read them once the assignment ran)."""
    variables = list(variables)
    op = broadcast_variables(variables, root_rank, process_set, prefix=name or "broadcast_")
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(v) for v in variables]
    with tf.control_dependencies([op]):
        return [tf.identity(v.read_value() if hasattr(v, "read_value") else v) for v in variables]


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function that broadcasts its argument (any picklable object) from root_rank, as Horovod's."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def broadcast_global_variables(root_rank, process_set=global_process_set):
    """The op that assigns root_rank's values to every global variable (TF1 graphs only)."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution; "
                           "use hvd.broadcast_variables(<model/optimizer variables>) instead")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank, process_set,
                               prefix="broadcast_global_variables")


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """SessionRunHook that broadcasts every global variable from root_rank once the session exists
    (after initialization or a restore from a checkpoint), so all ranks start alike."""

    def __init__(self, root_rank, device="", process_set=global_process_set):
        super().__init__()
        self.root_rank, self.device, self.process_set = root_rank, device, process_set
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank, self.process_set)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """root_rank's `obj` (any picklable object) on every rank. `session` is accepted for compatibility."""
    return rt.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set) -> list:
    """Every rank's `obj`, in rank order (of `process_set`)."""
    return rt.allgather_object(obj, name, process_set)
