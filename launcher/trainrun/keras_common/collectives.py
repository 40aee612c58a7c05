"""Collectives on Keras values (variables, backend tensors, NumPy arrays) for every Keras backend trainrun
supports: Keras 3 on torch or tensorflow, and tf-keras. `for_backend(name)` gives the backend's `KerasCollectives`.

Horovod's Keras signatures and defaults (allreduce: Average; reducescatter: Average) are written once, in
`KerasCollectives`, for all backends; a backend supplies only what truly differs (`_TorchBackend`,
`_TensorFlowBackend`): how a Keras value becomes its tensor, its binding's mpi_ops, in-place broadcast of
variables, how the optimizer's gradients are reduced and copied, and whether a step runs as a graph. (Two
per-backend modules with their own public functions once let `reducescatter`'s default drift apart:
`op=None` reached torch's binding, which refuses it.) Importing this module imports no framework.
"""
from __future__ import annotations

from trainrun.runtime.ops import Average
from trainrun.runtime.process_sets import global_process_set


class _TorchBackend:
    """Keras 3's torch backend: variables hold torch tensors; steps run eagerly."""

    name = "torch"

    def __init__(self):
        import keras
        import torch

        from trainrun.torch import Compression, mpi_ops
        self._keras, self._torch, self.mpi_ops, self.Compression = keras, torch, mpi_ops, Compression

    def tensor(self, value):
        if isinstance(value, self._keras.Variable):
            value = value.value
        return self._keras.ops.convert_to_tensor(value).detach()

    def broadcast_variables(self, variables, root_rank: int, prefix: str) -> None:
        handles = []
        for v in variables:
            value = v.value
            data = value.data if isinstance(value, self._torch.nn.Parameter) else value
            handles.append(self.mpi_ops.broadcast_async_(data, root_rank, name=f"{prefix}.{v.path}"))
        for h in handles:
            self.mpi_ops.synchronize(h)

    def clone(self, g):
        return g.detach().clone()

    def reduce_gradients(self, grads, variables, *, name, op, pre, post, compression, sparse_as_dense,
                         process_set) -> list:
        present = [i for i, g in enumerate(grads) if g is not None]
        pairs = [compression.compress(grads[i].detach().contiguous()) for i in present]
        reduced = self.mpi_ops.grouped_allreduce([t for t, _ in pairs], name=name, op=op, prescale_factor=pre,
                                                 postscale_factor=post, process_set=process_set)
        out = list(grads)
        for i, r, (_, ctx) in zip(present, reduced, pairs):
            out[i] = compression.decompress(r, ctx)
        return out

    def in_graph(self) -> bool:
        return False

    accumulate_in_graph = None  # torch runs the train step eagerly: passes accumulate Python-side (optimizer.py)


class _TensorFlowBackend:
    """Keras 3's tensorflow backend or tf-keras: trainrun.tensorflow's ops, which also run inside the
    tf.function that `fit` compiles."""

    name = "tensorflow"

    def __init__(self):
        import tensorflow as tf

        from trainrun.tensorflow import mpi_ops
        from trainrun.tensorflow.compression import Compression
        self._tf, self.mpi_ops, self.Compression = tf, mpi_ops, Compression

    def tensor(self, value):
        value = getattr(value, "value", value)  # a Keras 3 variable's tf.Variable
        return self._tf.convert_to_tensor(value() if callable(value) else value)

    def broadcast_variables(self, variables, root_rank: int, prefix: str) -> None:
        from trainrun.tensorflow.functions import broadcast_variables
        broadcast_variables(list(variables), root_rank, global_process_set, prefix=prefix)

    def clone(self, g):
        return self._tf.identity(g)

    def reduce_gradients(self, grads, variables, *, name, op, pre, post, compression, sparse_as_dense,
                         process_set) -> list:
        from trainrun.tensorflow.reduce import reduce_gradients
        return reduce_gradients(grads, variables, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                                op=op, gradient_predivide_factor=post if op == Average else 1.0,
                                process_set=process_set)

    def in_graph(self) -> bool:
        """Inside a tf.function being traced (fit's step): Python runs once, the graph every step."""
        return not self._tf.executing_eagerly()

    def accumulate_in_graph(self, settings, grads, apply) -> None:
        """backward_passes_per_step inside a tf.function: add `grads` to accumulator variables and, on every
        `settings.passes`-th call, run apply(accumulated) -- reduce over ranks and update -- then zero them,
        in a tf.cond: every rank takes the branch on the same steps, so its collectives match. The
        variables are made on the first trace (outside the function, as tf.function requires) and kept in
        `settings.graph`; IndexedSlices gradients accumulate dense."""
        tf = self._tf
        if settings.graph is None:
            with tf.init_scope():
                accs = [None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False)
                        for g in grads]
                settings.graph = (accs, tf.Variable(0, dtype=tf.int64, trainable=False))
        accs, count = settings.graph
        for a, g in zip(accs, grads):
            if a is not None and g is not None:
                a.assign_add(tf.convert_to_tensor(g))
        passes = settings.passes

        def update():
            scale = 1.0 / passes if settings.average_aggregated else 1.0
            apply([None if a is None else (a.read_value() * scale if scale != 1.0 else a.read_value()) for a in accs])
            for a in accs:
                if a is not None:
                    a.assign(tf.zeros_like(a))
            count.assign(0)
            return tf.constant(True)

        tf.cond(count.assign_add(1) >= passes, update, lambda: tf.constant(False))


class KerasCollectives:
    """Horovod's Keras collectives (horovod.keras / horovod.tensorflow.keras signatures) on one backend.
    Each returns a backend tensor; `broadcast_variables` assigns in place. Also what the optimizer
    wrapper and callbacks need: Compression, reduce_gradients, clone, in_graph, accumulate_in_graph."""

    def __init__(self, backend):
        self._b = backend
        self.backend = backend.name
        self.Compression = backend.Compression
        self.clone, self.reduce_gradients, self.in_graph = backend.clone, backend.reduce_gradients, backend.in_graph
        self.accumulate_in_graph = backend.accumulate_in_graph

    def allreduce(self, value, name=None, average=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
        """`value` reduced over ranks (default: averaged)."""
        return self._b.mpi_ops.allreduce(self._b.tensor(value), average=average, name=name, op=op,
                                         prescale_factor=prescale_factor, postscale_factor=postscale_factor)

    def allgather(self, value, name=None):
        """Every rank's `value` concatenated along the first dimension (which may differ per rank)."""
        return self._b.mpi_ops.allgather(self._b.tensor(value), name=name)

    def broadcast(self, value, root_rank, name=None):
        """`root_rank`'s `value` on every rank."""
        return self._b.mpi_ops.broadcast(self._b.tensor(value), root_rank, name=name)

    def reducescatter(self, value, name=None, op=Average):
        """`value` reduced over ranks (default: averaged), this rank's slice of its first dimension.
        `op=None` means the default, as it does for allreduce."""
        return self._b.mpi_ops.reducescatter(self._b.tensor(value), name=name, op=Average if op is None else op)

    def broadcast_variables(self, variables, root_rank: int, prefix: str = "broadcast_variables") -> None:
        """Assign `root_rank`'s values to `variables` (Keras variables) on every rank, in place, now.
        Every rank must pass the same variables."""
        self._b.broadcast_variables(list(variables), root_rank, prefix)


_BACKENDS = {"torch": _TorchBackend, "tensorflow": _TensorFlowBackend}
_MADE: dict[str, KerasCollectives] = {}


def for_backend(name: str) -> KerasCollectives:
    """The collectives for Keras backend `name` ("torch" or "tensorflow"; tf-keras is "tensorflow"),
    made once per process (importing that framework)."""
    if name not in _BACKENDS:
        raise ValueError(f"trainrun's Keras collectives support the torch and tensorflow backends, not {name!r}")
    if name not in _MADE:
        _MADE[name] = KerasCollectives(_BACKENDS[name]())
    return _MADE[name]
