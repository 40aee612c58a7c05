"""horovod.tensorflow.util: Horovod 0.28.1's small TensorFlow helpers, which programs and Horovod's own tests
import (`from horovod.tensorflow.util import _executing_eagerly`)."""
from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """Whether ops run eagerly here (not while a tf.function or a TF1 graph is built)."""
    return tf.executing_eagerly()


def _has_eager() -> bool:
    return True  # TensorFlow 2


def _make_subgraph(f):
    return tf.function(f)


def _cache(f):
    """`f` memoized on its arguments and on whether it runs eagerly."""
    results: dict = {}

    def cached(*args):
        key = (args, _executing_eagerly())
        if key not in results:
            results[key] = f(*args)
        return results[key]

    return cached


def vars_to_refs(variables):
    """A variable's `.ref()` (hashable), a list's as a tuple of them."""
    return tuple(vars_to_refs(v) for v in variables) if isinstance(variables, list) else variables.ref()


def refs_to_vars(refs):
    return [refs_to_vars(r) for r in refs] if isinstance(refs, tuple) else refs.deref()
