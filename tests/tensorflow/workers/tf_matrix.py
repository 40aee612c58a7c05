"""The TensorFlow conformance matrix (run by tests/tensorflow/test_tf_matrix.py, one launch per world size):
every op x dtype x mode (eager, tf.function, TF1 graph in a session) x process set (the global set, and
`sub`: the even ranks when the size is odd, else the odd ones) against float64 NumPy references built from
every rank's reproducible data; and each differentiable op's gradient in every mode and set against the
float64 reference of Horovod's TensorFlow convention (see trainrun/tensorflow/mpi_ops.py's docstring).

Ops: allreduce (Sum, Average, Min, Max, Product; prescale/postscale), grouped_allreduce (one dtype, mixed
dtypes), allgather and grouped_allgather (first dimension differing per rank), broadcast (root the set's
last rank), alltoall (without splits: the output alone; with uneven splits: output and received splits),
reducescatter and grouped_reducescatter (Sum, Average; rows not divisible by the size). In tf.function and
TF1 graph modes a whole section is one function/graph: 60-120 independent collectives in one step, in
whatever order the executor picks. Names are left to trainrun (name=None), as most programs do.

Each case collects every failing combination and reports them together; rank 0 prints the number of
checks each case made ("checks <case> <n>")."""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "workers"))
import tensorflow as tf  # noqa: E402
import trainrun.tensorflow as hvd  # noqa: E402
from harness import case, main  # noqa: E402

INTS = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64]
FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
NUMERIC = INTS + FLOATS
MOVING = NUMERIC + [tf.bool]  # ops that only move data (allgather, broadcast, alltoall)
TOL = {tf.float16: 2e-3, tf.bfloat16: 1e-2, tf.float32: 1e-6, tf.float64: 1e-12}
REDUCE = {"Sum": lambda s: s.sum(0), "Average": lambda s: s.mean(0), "Min": lambda s: s.min(0),
          "Max": lambda s: s.max(0), "Product": lambda s: s.prod(0)}
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
_sets: dict = {}
_clock = [time.monotonic()]


def process_sets():
    """(label, process set, its global ranks): the global set and `sub` (made once, on every rank)."""
    n = hvd.size()
    if "sub" not in _sets:
        _sets["sub"] = hvd.add_process_set([r for r in range(n) if r % 2 == (0 if n % 2 else 1)])
    return [("global", hvd.global_process_set, list(range(n))), ("sub", _sets["sub"], list(_sets["sub"].ranks))]


def data(rank, seed, shape, dtype) -> np.ndarray:
    """Rank `rank`'s reproducible input, as float64 values exactly representable in `dtype`."""
    g = np.random.default_rng(seed * 7919 + rank)
    if dtype == tf.bool:
        return g.integers(0, 2, shape).astype(np.float64)
    return g.integers(0 if dtype == tf.uint8 else -3, 4, shape).astype(np.float64)


def const(rank, seed, shape, dtype):
    return tf.constant(data(rank, seed, shape, dtype).astype(dtype.as_numpy_dtype))


def rows_of(total, n, i):
    """Set rank i's rows of `total` in a reducescatter: the first total % n get one more."""
    counts = [total // n + (1 if k < total % n else 0) for k in range(n)]
    return slice(sum(counts[:i]), sum(counts[:i + 1]))


def run(mode, build):
    """Build the checks (`build()` -> [(tag, tensor, want, dtype)]) and evaluate their tensors in `mode`:
    eagerly, as one tf.function, or as one TF1 graph in a session. Returns [(tag, value, want, dtype)]."""
    checks = []

    def body():
        checks.clear()
        outs = []
        for tag, tensor, want, dtype in build():
            checks.append((tag, want, dtype))
            outs.append(tensor)
        return outs
    if mode == "eager":
        values = [t.numpy() for t in body()]
    elif mode == "tf.function":  # (without autograph: converting every function the body calls, trainrun's
        # included, made tracing the slowest part; tests/tensorflow/test_horovod_tf.py keeps autograph on)
        values = [t.numpy() for t in tf.function(body, autograph=False)()]
    else:
        with tf.Graph().as_default():
            outs = body()
            with tf.compat.v1.Session() as sess:
                values = sess.run(outs)
    return [(tag, v, want, dtype) for (tag, want, dtype), v in zip(checks, values)]


def compare(results, failures) -> int:
    for tag, got, want, dtype in results:
        got = np.asarray(got)
        try:
            assert got.dtype == np.dtype(dtype.as_numpy_dtype), f"dtype {got.dtype}"
            assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
            tol = TOL.get(dtype, 0.0)
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
        except AssertionError as e:
            failures.append(f"{tag}: {str(e).strip().splitlines()[0]}")
    return len(results)


def report(name, failures, count):
    if hvd.rank() == 0:
        now = time.monotonic()
        print(f"checks {name} {count} in {now - _clock[0]:.1f} s", flush=True)
        _clock[0] = now
    assert not failures, f"{len(failures)} of {count} failing combinations:\n" + "\n".join(failures[:30])


# ---- forward ops ----------------------------------------------------------------------------------
def reductions(ps, ranks, seed):
    """allreduce (every op, scaled), grouped_allreduce, reducescatter, grouped_reducescatter."""
    me, n = hvd.rank(), len(ranks)
    mine, checks = ranks.index(me), []
    for dtype in NUMERIC:
        for opname, reduce in REDUCE.items():
            if opname == "Average" and dtype not in FLOATS:
                continue  # (integer averages truncate, as Horovod's)
            seed += 1
            want = reduce(np.stack([data(r, seed, (3, 4), dtype) for r in ranks]))
            checks.append((f"allreduce {dtype.name} {opname}",
                           hvd.allreduce(const(me, seed, (3, 4), dtype), op=OPS[opname], process_set=ps), want, dtype))
        seed += 1
        shapes = [(2,), (3, 2), (1,)]
        outs = hvd.grouped_allreduce([const(me, seed + i, s, dtype) for i, s in enumerate(shapes)], op=hvd.Sum,
                                     process_set=ps)
        for i, (s, out) in enumerate(zip(shapes, outs)):
            want = np.stack([data(r, seed + i, s, dtype) for r in ranks]).sum(0)
            checks.append((f"grouped_allreduce {dtype.name} [{i}]", out, want, dtype))
        seed += len(shapes)
        rows = 2 * n + 1
        for opname in ("Sum", "Average") if dtype in FLOATS else ("Sum",):
            full = REDUCE[opname](np.stack([data(r, seed, (rows, 2), dtype) for r in ranks]))
            want = full[rows_of(rows, n, mine)]
            checks.append((f"reducescatter {dtype.name} {opname}",
                           hvd.reducescatter(const(me, seed, (rows, 2), dtype), op=OPS[opname], process_set=ps),
                           want, dtype))
            out = hvd.grouped_reducescatter([const(me, seed, (rows, 2), dtype), const(me, seed + 1, (n, 3), dtype)],
                                            op=OPS[opname], process_set=ps)
            checks.append((f"grouped_reducescatter {dtype.name} {opname} [0]", out[0], want, dtype))
            want1 = REDUCE[opname](np.stack([data(r, seed + 1, (n, 3), dtype) for r in ranks]))[mine:mine + 1]
            checks.append((f"grouped_reducescatter {dtype.name} {opname} [1]", out[1], want1, dtype))
        seed += 2
        if dtype in FLOATS:  # (sum of x * 0.5) * 3, and the average of x * 2 then / 4
            full = np.stack([data(r, seed, (4,), dtype) for r in ranks])
            checks.append((f"allreduce {dtype.name} Sum pre 0.5 post 3",
                           hvd.allreduce(const(me, seed, (4,), dtype), op=hvd.Sum, prescale_factor=0.5,
                                         postscale_factor=3.0, process_set=ps), full.sum(0) * 1.5, dtype))
            checks.append((f"allreduce {dtype.name} Average pre 2 post 0.25",
                           hvd.allreduce(const(me, seed, (4,), dtype), op=hvd.Average, prescale_factor=2.0,
                                         postscale_factor=0.25, process_set=ps), full.mean(0) * 0.5, dtype))
            seed += 1
    seed += 1  # one group of mixed dtypes
    mixed = [tf.float32, tf.int32, tf.float64, tf.float32]
    outs = hvd.grouped_allreduce([const(me, seed + i, (2, i + 1), d) for i, d in enumerate(mixed)], op=hvd.Sum,
                                 process_set=ps)
    for i, (d, out) in enumerate(zip(mixed, outs)):
        want = np.stack([data(r, seed + i, (2, i + 1), d) for r in ranks]).sum(0)
        checks.append((f"grouped_allreduce mixed [{i}] {d.name}", out, want, d))
    return checks


def movements(ps, ranks, seed):
    """allgather, grouped_allgather, broadcast, alltoall with and without splits."""
    me, n = hvd.rank(), len(ranks)
    mine, checks = ranks.index(me), []
    for dtype in MOVING:
        seed += 1
        want = np.concatenate([data(r, seed, (i + 1, 2), dtype) for i, r in enumerate(ranks)])
        checks.append((f"allgather {dtype.name}", hvd.allgather(const(me, seed, (mine + 1, 2), dtype), process_set=ps),
                       want, dtype))
        outs = hvd.grouped_allgather([const(me, seed, (mine + 1, 2), dtype), const(me, seed + 1, (1, 3), dtype)],
                                     process_set=ps)
        checks.append((f"grouped_allgather {dtype.name} [0]", outs[0], want, dtype))
        checks.append((f"grouped_allgather {dtype.name} [1]", outs[1],
                       np.concatenate([data(r, seed + 1, (1, 3), dtype) for r in ranks]), dtype))
        root = ranks[-1]
        checks.append((f"broadcast {dtype.name}", hvd.broadcast(const(me, seed, (3, 2), dtype), root, process_set=ps),
                       data(root, seed, (3, 2), dtype), dtype))
        seed += 2
        # without splits: equal parts (2 rows per rank); with splits: 1 + (i + set rank) % 2 rows to set rank i
        x = [data(r, seed, (2 * n, 2), dtype) for r in ranks]
        want = np.concatenate([x[i][2 * mine:2 * mine + 2] for i in range(n)])
        checks.append((f"alltoall {dtype.name}", hvd.alltoall(const(me, seed, (2 * n, 2), dtype), process_set=ps),
                       want, dtype))
        splits = [[1 + (i + k) % 2 for i in range(n)] for k in range(n)]  # splits[k][i]: set rank k -> i
        sizes = [sum(s) for s in splits]
        x = [data(r, seed + 1, (sizes[k], 2), dtype) for k, r in enumerate(ranks)]
        want = np.concatenate([x[k][sum(splits[k][:mine]):sum(splits[k][:mine + 1])] for k in range(n)])
        out, received = hvd.alltoall(const(me, seed + 1, (sizes[mine], 2), dtype), splits=splits[mine],
                                     process_set=ps)
        checks.append((f"alltoall splits {dtype.name}", out, want, dtype))
        checks.append((f"alltoall splits {dtype.name} received", received,
                       np.array([splits[k][mine] for k in range(n)], np.float64), tf.int64))
        seed += 2
    return checks


def forward_case(mode, section):
    failures, count = [], 0
    me = hvd.rank()
    for label, ps, ranks in process_sets():
        if me not in ranks:
            continue
        results = run(mode, lambda: [(f"{mode} {label} {tag}", *rest) for tag, *rest in section(ps, ranks, 0)])
        count += compare(results, failures)
    return failures, count


# ---- gradients (Horovod's TensorFlow convention) --------------------------------------------------
def gradients(mode, ps, ranks):
    """Upstream gradient w_r (this rank's reproducible weights); the float64 reference of the gradient
    Horovod 0.28.1 gives: allreduce: allreduce(w, op); allgather: this rank's rows of the average of the
    w_r; broadcast: that average on the root, 0 elsewhere; reducescatter: every rank's w gathered (times
    the set size for Sum); alltoall: the w rows sent back by the received splits."""
    me, n = hvd.rank(), len(ranks)
    mine, checks = ranks.index(me), []

    def grad(f, x, dy):
        if mode == "graph":
            return tf.gradients(f(x), x, grad_ys=dy)[0]
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        return tape.gradient(y, x, output_gradients=dy)

    def w(rank, seed, shape, dtype):
        return data(rank, 1000 + seed, shape, dtype) + 0.5

    for dtype in (tf.float32, tf.float64):
        t = dtype.name
        for seed, (opname, op) in enumerate((("Sum", hvd.Sum), ("Average", hvd.Average))):
            ws = np.stack([w(r, seed, (3,), dtype) for r in ranks])
            want = REDUCE[opname](ws)
            checks.append((f"allreduce {opname} {t}",
                           grad(lambda x: hvd.allreduce(x, op=op, process_set=ps), const(me, seed, (3,), dtype),
                                tf.constant(w(me, seed, (3,), dtype), dtype)), want, dtype))

            def two(x, op=op):
                return hvd.grouped_allreduce([x, x * 2.0], op=op, process_set=ps)[1]
            checks.append((f"grouped_allreduce {opname} {t}", grad(two, const(me, seed, (3,), dtype),
                                                                   tf.constant(w(me, seed, (3,), dtype), dtype)),
                           want * 2.0, dtype))
            rows = 2 * n + 1
            ws = [w(r, 10 + seed, (rows_of(rows, n, i).stop - rows_of(rows, n, i).start, 2), dtype)
                  for i, r in enumerate(ranks)]
            want = np.concatenate(ws) * (n if opname == "Sum" else 1)
            checks.append((f"reducescatter {opname} {t}",
                           grad(lambda x: hvd.reducescatter(x, op=op, process_set=ps), const(me, 10 + seed, (rows, 2), dtype),
                                tf.constant(ws[mine], dtype)), want, dtype))
        total = sum(i + 1 for i in range(n))
        ws = np.stack([w(r, 20, (total, 2), dtype) for r in ranks])
        want = ws.mean(0)[sum(i + 1 for i in range(mine)):sum(i + 1 for i in range(mine + 1))]
        checks.append((f"allgather {t}", grad(lambda x: hvd.allgather(x, process_set=ps),
                                              const(me, 20, (mine + 1, 2), dtype),
                                              tf.constant(w(me, 20, (total, 2), dtype), dtype)), want, dtype))
        root = ranks[-1]
        ws = np.stack([w(r, 21, (3,), dtype) for r in ranks])
        checks.append((f"broadcast {t}", grad(lambda x: hvd.broadcast(x, root, process_set=ps), const(me, 21, (3,), dtype),
                                              tf.constant(w(me, 21, (3,), dtype), dtype)),
                       ws.mean(0) * (me == root), dtype))
        ws = [w(r, 22, (2 * n, 2), dtype) for r in ranks]
        want = np.concatenate([ws[i][2 * mine:2 * mine + 2] for i in range(n)])
        checks.append((f"alltoall {t}", grad(lambda x: hvd.alltoall(x, process_set=ps), const(me, 22, (2 * n, 2), dtype),
                                             tf.constant(ws[mine], dtype)), want, dtype))
        splits = [[1 + (i + k) % 2 for i in range(n)] for k in range(n)]  # set rank k -> i
        received = [[splits[k][i] for k in range(n)] for i in range(n)]  # rows set rank i gets from each k
        ws = [w(r, 23, (sum(received[i]), 2), dtype) for i, r in enumerate(ranks)]
        # the rows this rank sent to set rank i come back from i's gradient, at i's offset for this rank
        want = np.concatenate([ws[i][sum(received[i][:mine]):sum(received[i][:mine + 1])] for i in range(n)])
        checks.append((f"alltoall splits {t}",
                       grad(lambda x: hvd.alltoall(x, splits=splits[mine], process_set=ps)[0],
                            const(me, 23, (sum(splits[mine]), 2), dtype), tf.constant(ws[mine], dtype)), want, dtype))
    return checks


def gradient_case(mode):
    failures, count = [], 0
    me = hvd.rank()
    for label, ps, ranks in process_sets():
        if me not in ranks:
            continue
        results = run(mode, lambda: [(f"{mode} {label} gradient {tag}", *rest) for tag, *rest in gradients(mode, ps, ranks)])
        count += compare(results, failures)
    return failures, count


def _define(mode):
    slug = mode.replace(".", "_")

    def forward():
        failures, count = [], 0
        for section in (reductions, movements):
            f, c = forward_case(mode, section)
            failures += f
            count += c
        report(f"matrix_{slug}", failures, count)

    def backward():
        report(f"gradients_{slug}", *gradient_case(mode))
    forward.__name__, backward.__name__ = f"matrix_{slug}", f"gradients_{slug}"
    case(forward)
    case(backward)


for _mode in ("eager", "tf.function", "graph"):
    _define(_mode)


if __name__ == "__main__":
    main(hvd)
