"""Rank-side checks of the NumPy API against a float64 reference (run by tests/runtime/test_numpy_ops.py)."""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import trainrun.runtime as hvd  # noqa: E402
from harness import case, main  # noqa: E402
from trainrun.runtime import lifecycle  # noqa: E402

DTYPES = ["float16", "float32", "float64", "int32", "int64"]
SHAPES = [(0,), (1,), (7,), (1000,), (3, 5)]
OPS = {hvd.Average: "avg", hvd.Sum: "sum", hvd.Min: "min", hvd.Max: "max", hvd.Product: "prod"}


def data(rank, seed, shape, dtype):
    """Small integers (exact in every dtype, no overflow in products) as `dtype`."""
    rng = np.random.default_rng(seed * 7919 + rank)
    return rng.integers(-3, 4, size=shape).astype(dtype)


def reference(op, arrays, dtype):
    stack = np.stack([a.astype(np.float64) for a in arrays])
    if op == hvd.Min:
        return stack.min(0)
    if op == hvd.Max:
        return stack.max(0)
    if op == hvd.Product:
        return stack.prod(0)
    total = stack.sum(0)
    if op == hvd.Average:
        total = total * (1.0 / len(arrays))
        if np.dtype(dtype).kind == "i":
            total = np.trunc(total)  # Horovod scales integer results and truncates
    return total


def all_data(seed, shape, dtype):
    return [data(r, seed, shape, dtype) for r in range(hvd.size())]


def close(got, want, dtype):
    tol = 1e-3 if dtype == "float16" else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@case
def topology():
    """One host (tests/runtime) or TRAINRUN_TEST_HOSTS hosts with the same slots each (tests/cluster)."""
    hosts = int(os.environ.get("TRAINRUN_TEST_HOSTS", "1"))
    per_host = hvd.size() // hosts
    assert hvd.size() == int(os.environ["PMI_SIZE"]) and hvd.rank() == int(os.environ["PMI_RANK"])
    assert (hvd.local_size(), hvd.local_rank()) == (per_host, hvd.rank() % per_host)
    assert (hvd.cross_size(), hvd.cross_rank()) == (hosts, hvd.rank() // per_host)
    assert hvd.is_homogeneous() and hvd.is_initialized()


@case
def allreduce_every_op_dtype_shape():
    seed = 0
    for op in OPS:
        for dtype in DTYPES:
            for shape in SHAPES:
                seed += 1
                mine = data(hvd.rank(), seed, shape, dtype)
                got = hvd.allreduce(mine, op=op)
                assert got.dtype == np.dtype(dtype) and got.shape == shape, (got.dtype, got.shape)
                close(got, reference(op, all_data(seed, shape, dtype), dtype), dtype)


@case
def allreduce_scaling():
    for dtype in ("float16", "float32", "float64"):
        mine = data(hvd.rank(), 1, (33,), dtype)
        got = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
        close(got, reference(hvd.Sum, all_data(1, (33,), dtype), dtype) * 2.0, dtype)
        got = hvd.allreduce(mine, op=hvd.Average, prescale_factor=2.0)
        close(got, reference(hvd.Average, all_data(1, (33,), dtype), dtype) * 2.0, dtype)


@case
def allreduce_in_place_and_non_contiguous():
    base = data(hvd.rank(), 5, (6, 8), "float32")
    view = base[:, ::2]  # non-contiguous
    untouched = base[:, 1::2].copy()
    out = hvd.allreduce_(view, op=hvd.Sum)
    assert out is view
    want = sum(data(r, 5, (6, 8), "float64") for r in range(hvd.size()))
    np.testing.assert_allclose(base[:, ::2], want[:, ::2])
    np.testing.assert_array_equal(base[:, 1::2], untouched)
    t = data(hvd.rank(), 6, (5, 4), "float64").T  # transposed input, out-of-place
    np.testing.assert_allclose(hvd.allreduce(t, op=hvd.Max), reference(hvd.Max, [a.T for a in all_data(6, (5, 4), "float64")], "float64"))
    flat = data(hvd.rank(), 7, (10,), "int64")
    hvd.allreduce_(flat, op=hvd.Sum)
    np.testing.assert_array_equal(flat, reference(hvd.Sum, all_data(7, (10,), "int64"), "int64"))


@case
def async_handles():
    hs = [hvd.allreduce_async(data(hvd.rank(), 100 + i, (17,), "float32"), name=f"async.{i}", op=hvd.Sum)
          for i in range(20)]
    for i, h in enumerate(hs):
        close(hvd.synchronize(h), reference(hvd.Sum, all_data(100 + i, (17,), "float32"), "float32"), "float32")
    h = hvd.allreduce_async(np.ones(3))
    while not hvd.poll(h):
        pass
    np.testing.assert_array_equal(hvd.synchronize(h), np.ones(3))
    for bad in (h, 123456):
        try:
            hvd.synchronize(bad)
        except ValueError:
            continue
        raise AssertionError("synchronize of a used handle did not raise ValueError")


@case
def fusion_of_hundreds_in_different_orders():
    n = 300
    dtypes = ["float32", "float64", "int32", "float16"]
    specs = [(f"fuse.{i}", (1 + (i * 37) % 700,), dtypes[i % 4]) for i in range(n)]
    order = np.random.default_rng(hvd.rank() + 10).permutation(n)  # differs per rank
    before = lifecycle.engine().reductions
    handles = {i: hvd.allreduce_async(data(hvd.rank(), 1000 + i, specs[i][1], specs[i][2]), name=specs[i][0], op=hvd.Sum)
               for i in order}
    for i in range(n):
        name, shape, dtype = specs[i]
        close(hvd.synchronize(handles[i]), reference(hvd.Sum, all_data(1000 + i, shape, dtype), dtype), dtype)
    used = lifecycle.engine().reductions - before
    assert used < n / 3, f"{n} tensors took {used} reductions: fusion is not working"


@case
def grouped_allreduce():
    arrays = [data(hvd.rank(), 200 + i, (i + 1, 3), "float32") for i in range(10)]
    before = lifecycle.engine().reductions
    outs = hvd.grouped_allreduce(arrays, op=hvd.Average)
    assert lifecycle.engine().reductions - before == 1
    for i, out in enumerate(outs):
        close(out, reference(hvd.Average, all_data(200 + i, (i + 1, 3), "float32"), "float32"), "float32")


@case
def grouped_allreduce_shapes_dtypes_scales():
    """Groups of mixed shapes and layouts (one entry, outputs views of one buffer), of mixed dtypes
    (one request per tensor), float16 and scaled (packed through the fusion buffer); repeated, so
    the second round runs from the response cache."""
    me = hvd.rank()
    for _ in range(2):
        base = data(me, 600, (6, 4), "float32")
        arrays = [base[:, ::2], data(me, 601, (5,), "float32"), data(me, 602, (), "float32"), base.T]
        outs = hvd.grouped_allreduce(arrays, op=hvd.Sum, name="g.mixed.shapes")
        ref_base = [data(r, 600, (6, 4), "float64") for r in range(hvd.size())]
        wants = [sum(b[:, ::2] for b in ref_base), reference(hvd.Sum, all_data(601, (5,), "float32"), "float32"),
                 reference(hvd.Sum, all_data(602, (), "float32"), "float32"), sum(b.T for b in ref_base)]
        for out, want, a in zip(outs, wants, arrays):
            assert out.shape == a.shape and out.dtype == np.float32
            close(out, want, "float32")
        mixed = [data(me, 603, (3,), "float64"), data(me, 604, (2, 2), "int32")]
        outs = hvd.grouped_allreduce(mixed, op=hvd.Max, name="g.mixed.dtypes")
        close(outs[0], reference(hvd.Max, all_data(603, (3,), "float64"), "float64"), "float64")
        close(outs[1], reference(hvd.Max, all_data(604, (2, 2), "int32"), "int32"), "int32")
        halves = [data(me, 605 + i, (7,), "float16") for i in range(3)]
        outs = hvd.grouped_allreduce(halves, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5, name="g.half")
        for i, out in enumerate(outs):
            assert out.dtype == np.float16
            close(out, reference(hvd.Average, all_data(605 + i, (7,), "float16"), "float16"), "float16")
    assert hvd.grouped_allreduce([], name="g.empty") == []


@case
def grouped_allreduce_while_a_rank_has_joined():
    me, n = hvd.rank(), hvd.size()
    if me == n - 1:
        hvd.join()
        return
    for i in range(3):  # the second and third from the response cache
        outs = hvd.grouped_allreduce([np.full(4, float(me + 1)), np.full((2, 3), 1.0)], op=hvd.Sum, name=f"gj.{i % 2}")
        np.testing.assert_array_equal(outs[0], np.full(4, float(sum(range(1, n)))))
        np.testing.assert_array_equal(outs[1], np.full((2, 3), float(n - 1)))
    hvd.join()


@case
def cached_signatures_in_different_orders():
    """Names run before (response cache) issued in a different order on every rank still match."""
    names = [f"order.{i}" for i in range(6)]
    for round_ in range(3):
        order = np.random.default_rng(hvd.rank() * 31 + round_).permutation(len(names))
        handles = {names[i]: hvd.allreduce_async(np.full(3, float(i)), name=names[i], op=hvd.Sum) for i in order}
        for i, name in enumerate(names):
            np.testing.assert_array_equal(hvd.synchronize(handles[name]), np.full(3, float(i * hvd.size())))
        h = hvd.allreduce_async(np.ones(2), name=f"order.async.{hvd.rank()}")  # pending on one rank only
        for k in range(2):  # blocking ones (cached after the first round) while it is pending
            np.testing.assert_array_equal(hvd.allreduce(np.ones(2), name=f"order.sync.{k}", op=hvd.Sum),
                                          np.full(2, hvd.size()))
        hvd.barrier()
        for r in range(hvd.size()):  # now every rank submits every rank's name: all complete
            if r != hvd.rank():
                hvd.synchronize(hvd.allreduce_async(np.ones(2), name=f"order.async.{r}"))
        hvd.synchronize(h)


@case
def allgather_ragged():
    for dtype in DTYPES + ["uint8", "bool"]:
        shape = (hvd.rank(), 3)  # rank 0 contributes nothing
        got = hvd.allgather(data(hvd.rank(), 300, shape, dtype))
        want = np.concatenate([data(r, 300, (r, 3), dtype) for r in range(hvd.size())])
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(hvd.allgather(np.array([hvd.rank()])), np.arange(hvd.size()))


@case
def broadcast_from_every_root():
    for root in range(hvd.size()):
        for dtype in DTYPES:
            mine = data(hvd.rank(), 400 + root, (4, 3), dtype)
            want = data(root, 400 + root, (4, 3), dtype)
            np.testing.assert_array_equal(hvd.broadcast(mine, root), want)
            np.testing.assert_array_equal(mine, data(hvd.rank(), 400 + root, (4, 3), dtype))  # input untouched
            hvd.broadcast_(mine, root)
            np.testing.assert_array_equal(mine, want)


@case
def alltoall_with_and_without_splits():
    n, me = hvd.size(), hvd.rank()
    x = np.arange(2 * n, dtype=np.float32) + 100 * me
    got = hvd.alltoall(x)
    np.testing.assert_array_equal(got, np.concatenate([np.arange(2 * me, 2 * me + 2) + 100 * r for r in range(n)]))
    splits = [(me + r) % 3 for r in range(n)]  # rank me sends (me + r) % 3 rows to rank r
    rows = np.stack([np.full(4, me * 10 + j, dtype=np.int64) for j in range(sum(splits))]) if sum(splits) else np.zeros((0, 4), np.int64)
    out, received = hvd.alltoall(rows, splits=splits)
    want_recv = [(r + me) % 3 for r in range(n)]
    np.testing.assert_array_equal(received, want_recv)
    want = []
    for r in range(n):
        start = sum((r + k) % 3 for k in range(me))
        want += [r * 10 + j for j in range(start, start + want_recv[r])]
    np.testing.assert_array_equal(out[:, 0], want)


@case
def reducescatter_uneven():
    n, me = hvd.size(), hvd.rank()
    for dtype, op in (("float32", hvd.Sum), ("float64", hvd.Average), ("float16", hvd.Sum), ("int32", hvd.Max)):
        dim0 = 2 * n + 1
        got = hvd.reducescatter(data(me, 500, (dim0, 3), dtype), op=op)
        full = reference(op, all_data(500, (dim0, 3), dtype), dtype)
        rows = [dim0 // n + (1 if r < dim0 % n else 0) for r in range(n)]
        start = sum(rows[:me])
        assert got.shape == (rows[me], 3) and got.dtype == np.dtype(dtype)
        close(got, full[start:start + rows[me]], dtype)


@case
def objects_barrier():
    assert hvd.broadcast_object({"from": hvd.rank(), "x": [1, 2]}, root_rank=hvd.size() - 1) == {"from": hvd.size() - 1, "x": [1, 2]}
    assert hvd.allgather_object(("r", hvd.rank())) == [("r", r) for r in range(hvd.size())]
    hvd.barrier()


@case
def join_contributes_zeros():
    me, n = hvd.rank(), hvd.size()
    if me == n - 1:  # the last rank joins at once; the others keep reducing
        last = hvd.join()
    else:
        for i in range(3):
            got = hvd.allreduce(np.full(4, float(me + 1)), name=f"join.{i}", op=hvd.Sum)
            np.testing.assert_array_equal(got, np.full(4, float(sum(range(1, n)))))  # joined rank adds 0
        got = hvd.allreduce(np.full(2, 6.0), name="join.avg")
        np.testing.assert_allclose(got, np.full(2, 6.0 * (n - 1) / n))  # Average divides by the full size
        last = hvd.join()
    # the last rank to reach the coordinator; the same answer everywhere, and never the early joiner
    assert hvd.allgather_object(last) == [last] * n and last != n - 1 and 0 <= last < n


@case
def lone_and_general_paths_mix():
    """One rank's blocking ops take the engine's lone-op shortcut while another's, with other ops
    outstanding, take the general path: they must still make the same MPI calls (a blocking call
    on one rank against a nonblocking one on another deadlocks)."""
    me, n = hvd.rank(), hvd.size()
    x = np.empty(1000, np.float32)
    hvd.allreduce_(x, name="mix.lone", op=hvd.Sum)  # cached from now on
    h = hvd.allreduce_async(np.ones(3), name="mix.extra") if me % 2 else None
    for i in range(30):
        x[:] = me + i
        hvd.allreduce_(x, name="mix.lone", op=hvd.Sum)
        np.testing.assert_array_equal(x, np.full(1000, float(sum(range(n)) + n * i)))
    if h is None:
        h = hvd.allreduce_async(np.ones(3), name="mix.extra")
    np.testing.assert_array_equal(hvd.synchronize(h), np.ones(3))
    for i in range(4):  # Average; a rank late by more than the shortcut's spin (the general loop takes over)
        if me == n - 1 and i % 2:
            time.sleep(0.05)
        x[:] = me
        hvd.allreduce_(x, name="mix.avg")
        np.testing.assert_allclose(x, np.full(1000, sum(range(n)) / n))


@case
def concurrent_threads():
    """Blocking ops from several threads at once, plus async ops from the main thread."""
    import threading
    errors = []

    def worker(k):
        try:
            for i in range(50):
                out = hvd.allreduce(np.full(10, float(k + hvd.rank())), name=f"thread{k}.{i}", op=hvd.Sum)
                np.testing.assert_array_equal(out, np.full(10, float(k * hvd.size() + sum(range(hvd.size())))))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    handles = [hvd.allreduce_async(np.ones(100), name=f"main.{i}") for i in range(100)]
    results = [hvd.synchronize(h) for h in handles]
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert all(np.array_equal(r, np.ones(100)) for r in results)


@case
def argument_errors():
    for call in (lambda: hvd.allreduce(np.ones(2, np.int32), op=hvd.Adasum), lambda: hvd.allreduce(np.ones(2), op=42),
                 lambda: hvd.reducescatter(np.ones(2), op=hvd.Adasum),
                 lambda: hvd.broadcast(np.ones(2), root_rank=hvd.size()),
                 lambda: hvd.alltoall(np.ones(hvd.size() + 1)),
                 lambda: hvd.allreduce(np.array(["a"]))):
        try:
            call()
        except ValueError:
            continue
        raise AssertionError("expected ValueError")


if __name__ == "__main__":
    main(hvd)
