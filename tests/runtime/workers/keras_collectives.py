"""trainrun.keras's collectives on Keras values, on the Keras backend KERAS_BACKEND names (torch or
tensorflow): every op the module exposes, with Horovod's defaults, checked against NumPy (run by
tests/runtime/test_keras_collectives.py, once per backend)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.keras as hvd  # noqa: E402
import keras  # noqa: E402
from harness import case, main  # noqa: E402

assert keras.backend.backend() == os.environ["KERAS_BACKEND"], keras.backend.backend()


def value(rank, shape=(5, 3)):
    """Rank-dependent float32 data, the same formula on every rank."""
    return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 10 * rank + 1).astype("float32")


def numpy_of(out):
    assert keras.ops.is_tensor(out), type(out)  # a tensor of the backend, as Horovod's Keras ops return
    return keras.ops.convert_to_numpy(out)


def my_rows(rows, n, me):
    """This rank's rows of `rows` in a reducescatter (the first rows % n ranks get one more)."""
    counts = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    start = sum(counts[:me])
    return slice(start, start + counts[me])


@case
def reducescatter_default_averages():
    n, me = hvd.size(), hvd.rank()
    every = np.stack([value(r).astype(np.float64) for r in range(n)])
    got = numpy_of(hvd.reducescatter(value(me), name="kc.rs.default"))
    np.testing.assert_allclose(got, every.mean(0)[my_rows(5, n, me)], rtol=1e-6)
    got = numpy_of(hvd.reducescatter(keras.Variable(value(me)), name="kc.rs.none", op=None))
    np.testing.assert_allclose(got, every.mean(0)[my_rows(5, n, me)], rtol=1e-6)


@case
def reducescatter_ops():
    n, me = hvd.size(), hvd.rank()
    every = np.stack([value(r).astype(np.float64) for r in range(n)])
    for op, ref in [(hvd.Sum, every.sum(0)), (hvd.Average, every.mean(0))]:
        got = numpy_of(hvd.reducescatter(value(me), name=f"kc.rs.{op}", op=op))
        np.testing.assert_allclose(got, ref[my_rows(5, n, me)], rtol=1e-6)


@case
def allreduce_ops():
    n, me = hvd.size(), hvd.rank()
    every = np.stack([value(r).astype(np.float64) for r in range(n)])
    np.testing.assert_allclose(numpy_of(hvd.allreduce(value(me), name="kc.ar")), every.mean(0), rtol=1e-6)
    for op, ref in [(hvd.Sum, every.sum(0)), (hvd.Average, every.mean(0)), (hvd.Min, every.min(0)),
                    (hvd.Max, every.max(0)), (hvd.Product, every.prod(0))]:
        got = numpy_of(hvd.allreduce(keras.Variable(value(me)), name=f"kc.ar.{op}", op=op))
        np.testing.assert_allclose(got, ref, rtol=1e-5)
    got = numpy_of(hvd.allreduce(value(me), name="kc.ar.scaled", op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0))
    np.testing.assert_allclose(got, every.sum(0) * 1.5, rtol=1e-6)
    got = numpy_of(hvd.allreduce(value(me), name="kc.ar.avg", average=False))
    np.testing.assert_allclose(got, every.sum(0), rtol=1e-6)


@case
def allgather_uneven():
    n, me = hvd.size(), hvd.rank()
    got = numpy_of(hvd.allgather(np.full((me + 1, 2), me, dtype="int32"), name="kc.ag"))
    np.testing.assert_array_equal(got, np.concatenate([np.full((r + 1, 2), r) for r in range(n)]))


@case
def broadcast_and_variables():
    n, me = hvd.size(), hvd.rank()
    root = n - 1
    np.testing.assert_array_equal(numpy_of(hvd.broadcast(value(me), root, name="kc.b")), value(root))
    v = keras.Variable(value(me), name="kc_v")
    hvd.broadcast_variables([v], root_rank=root, prefix="kc.bv")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), value(root))


@case
def tf_keras_module_ops():
    """trainrun.tensorflow.keras (tf.keras) shares these collectives on the tensorflow backend."""
    if keras.backend.backend() != "tensorflow":
        return
    import trainrun.tensorflow.keras as tfhvd
    n, me = hvd.size(), hvd.rank()
    every = np.stack([value(r).astype(np.float64) for r in range(n)])
    np.testing.assert_allclose(numpy_of(tfhvd.reducescatter(value(me), name="kc.tfk.rs")),
                               every.mean(0)[my_rows(5, n, me)], rtol=1e-6)
    np.testing.assert_allclose(numpy_of(tfhvd.allreduce(value(me), name="kc.tfk.ar", op=tfhvd.Sum)), every.sum(0),
                               rtol=1e-6)


if __name__ == "__main__":
    main(hvd)
