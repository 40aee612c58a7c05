"""Collectives as TensorFlow graph nodes (tf.function, TF1 graphs): one native asynchronous kernel each.

Why asynchronous: TF's executor runs a graph's nodes on a small pool of inter-op threads (2 on a
2-core host). A collective that blocks inside its node holds one of them until the other ranks reach
it; ranks run independent collectives in different orders, so a graph with more independent
collectives than threads can wait for good. Horovod's kernels are asynchronous for that reason.

Contract: `collective(start, finish, inputs, tout, op_name, in_place=None)` builds one TrainrunCollective
node (native/collective_op.cc) per collective. When it runs, the kernel calls `_submit` (a ctypes
callback: one C call into Python, no numpy_function, no tensor conversion) with the op's buffers:
  * in place (`in_place` given; allreduce, a one-dtype grouped allreduce, broadcast): one buffer that
    already holds the inputs and whose views are the node's outputs -- a single input's own output, with
    its shape; a group's inputs fused into one flat buffer (the ranks then compare its length, not the
    members' shapes) -- and `in_place(buffer, blocking)` reduces in it: started, returning (runtime
    handle, engine), or with `blocking` run to completion. Nothing is copied out.
  * result (the other ops): NumPy views of the input tensors' own buffers; `start(*arrays)` ->
    (handle, engine), or `start(*arrays, blocking=True)` -> the result; `finish(result)` -> the output
    array(s), which are written into outputs the kernel allocates then (one copy, as TF needs its own).
The node completes through `trainrun_complete` once the runtime is done: `WAITER`, one thread per
process, sleeps on the engine's completions and finishes each op (in the order they complete, never
waiting for one in particular: an op may complete only after this rank runs nodes that need another
op's result). No node holds a TF thread while its op is in flight.
The one exception, for the latency of a lone collective: where the graph holds one collective (counted
per graph as they are built: a graph of one cannot wait on itself) and no other graph collective is in
flight on this rank, the op runs to completion inside the callback (the runtime's blocking path, its
lone-op fast path included): at most one TF thread per rank ever blocks.
A failure completes the node with Horovod's TF error type (failures.py: FailedPreconditionError for
a mismatch between ranks, ...), as eager ops raise.

Where the kernels cannot be built (no compiler; TRAINRUN_TF_NATIVE=0) each collective is one blocking
numpy_function (start, synchronize, finish): TF reports its errors as UnknownError, and the limit
above applies (more inter-op threads, or control dependencies between the collectives, avoid it).

bfloat16 is reduced as float32 (cast in the graph before and after the node, rounded once), as the
runtime's bfloat16 is a bit pattern.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np
import tensorflow as tf

from trainrun.runtime import lifecycle
from trainrun.tensorflow import failures, native

# What a numpy_function node runs is called plainly: the code building these nodes is often converted by
# autograph (a user's tf.function calls hvd.allreduce), and a converted closure's calls each go through
# autograph's converted_call when the node runs (~40 us a submit node, measured: scripts/bench_tf_graph_nodes.py).
_plain = tf.autograph.experimental.do_not_convert
_POLL_S = 0.05  # the waiter's longest sleep (it is woken by completions; this only bounds a missed one)
_UNKNOWN = 2    # TF's error code for an error failures.py does not type


class _Waiter:
    """Ops in flight: their runtime handles until they complete; then `on_done(outcome)`, outcome
    (True, result) or (False, exception). Thread-safe."""

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: dict[int, tuple] = {}   # key -> (runtime handle, engine, on_done)
        self._solo = threading.Lock()          # held by the one op run to completion in its node
        self._thread: threading.Thread | None = None

    def submit(self, key: int, start, alone: bool, run, on_done) -> None:
        """Run the op: with `alone` (its graph holds no other collective) and nothing else in flight,
        `run()` to completion here; otherwise `start()` -> (handle, engine), finished by the waiter
        thread. `on_done(outcome)` is called once either way (here for a failed start)."""
        if alone and not self._pending and self._solo.acquire(blocking=False):
            try:
                outcome = (True, run())
            except Exception as e:  # noqa: BLE001 (the node reports it, typed)
                outcome = (False, e)
            finally:
                self._solo.release()
            on_done(outcome)
            return
        try:
            handle, eng = start()
        except Exception as e:  # noqa: BLE001
            on_done((False, e))
            return
        with self._cv:
            self._pending[key] = (handle, eng, on_done)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainrun-tf-waiter", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending:
                    self._cv.wait()
                items = list(self._pending.items())
            ready = [(key, entry) for key, entry in items if _polled(entry[0])]
            if not ready:
                eng = items[0][1][1]
                one = len({id(e) for _, (_, e, _) in items}) == 1
                eng.sleep_until(lambda: any(_polled(h) for _, (h, _, _) in items), _POLL_S if one else 0.002)
                continue
            for key, (handle, _, on_done) in ready:
                try:
                    outcome = (True, lifecycle.synchronize(handle))
                except BaseException as e:  # noqa: BLE001 (handed to the node)
                    outcome = (False, e)
                with self._cv:
                    del self._pending[key]
                on_done(outcome)


def _polled(handle) -> bool:
    try:
        return lifecycle.poll(handle)
    except ValueError:  # forgotten (a reset runtime): synchronize reports it
        return True


WAITER = _Waiter()
_COUNTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> [its collectives]


class _Node:
    """What one TrainrunCollective node runs (its `spec` attr names it in `_NODES`)."""
    __slots__ = ("start", "finish", "in_place", "many", "count", "dtypes")

    def __init__(self, start, finish, in_place, many, count, dtypes):
        self.start, self.finish, self.in_place, self.many, self.count = start, finish, in_place, many, count
        self.dtypes = dtypes  # the node's output dtypes (NumPy): a result is written as exactly these


_NODES: dict[bytes, _Node] = {}  # spec -> node, for the life of the process (as numpy_function's registry)
_NP_DTYPES: dict[int, np.dtype] = {}  # TF DataType enum -> NumPy dtype


def _np_dtype(enum: int) -> np.dtype:
    dt = _NP_DTYPES.get(enum)
    if dt is None:
        dt = _NP_DTYPES[enum] = np.dtype(tf.dtypes.as_dtype(enum).as_numpy_dtype)
    return dt


def _array(ptr, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """A NumPy view of `prod(shape)` items at address `ptr` (TF's buffer: alive until the node is done)."""
    n = 1
    for d in shape:
        n *= d
    if n == 0 or not ptr:
        return np.empty(shape, dtype)
    return np.frombuffer((ctypes.c_char * (n * dtype.itemsize)).from_address(ptr), dtype).reshape(shape)


def _error(e: BaseException) -> tuple[int, bytes]:
    if isinstance(e, failures.CAUGHT):
        code, message = failures.code_of(e)
        return int(code), bytes(message)
    return _UNKNOWN, f"{type(e).__name__}: {e}".encode(errors="replace")


def _submit(kid, spec, in_place, n, ptrs, dtypes, ranks, dims) -> None:
    """The kernel's callback (module docstring). Never raises: every failure completes the node."""
    lib = _LIB
    assert lib is not None  # (registered with the library by _kernel before any node exists)
    try:
        node = _NODES[spec]
        arrays, k = [], 0
        for i in range(n):
            shape = tuple(dims[k:k + ranks[i]])
            k += ranks[i]
            arrays.append(_array(ptrs[i], _np_dtype(dtypes[i]), shape))
        alone = node.count[0] == 1
        if in_place:
            flat, work = arrays[0], node.in_place
            WAITER.submit(kid, lambda: work(flat, False), alone, lambda: work(flat, True),
                          lambda outcome: _finish_in_place(lib, kid, outcome))
        else:
            start = node.start
            WAITER.submit(kid, lambda: start(*arrays), alone, lambda: start(*arrays, blocking=True),
                          lambda outcome: _finish_result(lib, kid, node, outcome))
    except BaseException as e:  # noqa: BLE001 (a ctypes callback must not raise)
        lib.trainrun_complete(kid, *_error(e))


def _finish_in_place(lib, kid: int, outcome: tuple) -> None:
    ok, value = outcome
    lib.trainrun_complete(kid, *((0, None) if ok else _error(value)))


def _finish_result(lib, kid: int, node: _Node, outcome: tuple) -> None:
    ok, value = outcome
    try:
        if not ok:
            raise value
        outs = node.finish(value)
        for i, out in enumerate(outs if node.many else [outs]):
            out = np.ascontiguousarray(out)
            if out.dtype != node.dtypes[i]:  # (TF allocated the output for its own dtype: never write past it)
                raise TypeError(f"output {i} is {out.dtype}, the node's is {node.dtypes[i]}")
            dims = (ctypes.c_int64 * max(out.ndim, 1))(*out.shape)
            ptr = lib.trainrun_output(kid, i, out.ndim, dims)
            if out.size:
                if not ptr:
                    raise RuntimeError(f"TensorFlow could not allocate output {i} of shape {out.shape}")
                np.copyto(_array(ptr, out.dtype, out.shape), out)
    except BaseException as e:  # noqa: BLE001
        lib.trainrun_complete(kid, *_error(e))
        return
    lib.trainrun_complete(kid, 0, None)


_SUBMIT_T = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64))
_CALLBACK = _SUBMIT_T(_submit)  # (kept alive for the process's life: the kernel holds its address)
_LIB = None
_registered = threading.Lock()


def _kernel():
    """The TrainrunCollective op, registering this module's callback with the library once; None
    where the kernels cannot be built."""
    global _LIB
    loaded = native.load()
    if loaded is None:
        return None
    ops, lib = loaded
    with _registered:
        if _LIB is None:
            lib.trainrun_set_submit(ctypes.cast(_CALLBACK, ctypes.c_void_p))
            _LIB = lib
    return ops.trainrun_collective


@_plain
def collective(start, finish, inputs, tout, op_name, in_place=None):
    """The graph node of one collective (module docstring); its output tensor(s), `tout` a dtype or a
    list of them. `start(*arrays)` -> (runtime handle, engine); `start(*arrays, blocking=True)` -> the
    result; `finish(result)` -> the output array(s). `in_place(flat, blocking)`: the in-place form,
    used where every output has its input's dtype and shape and the inputs share one dtype."""
    bf16 = tf.bfloat16
    inputs = [tf.cast(t, tf.float32) if t.dtype == bf16 else t for t in inputs]
    many = isinstance(tout, (list, tuple))
    touts = list(tout) if many else [tout]
    node_touts = [tf.float32 if t == bf16 else t for t in touts]
    kernel = _kernel()
    if kernel is None:
        outs = _blocking(lambda *a: finish(start(*a, blocking=True)), inputs, node_touts, many, op_name)
    else:
        count = _COUNTS.setdefault(tf.compat.v1.get_default_graph(), [0])
        count[0] += 1  # (read when the graph runs: complete by then)
        use_in_place = in_place is not None and len({t.dtype for t in inputs}) == 1
        spec = f"{op_name}/{len(_NODES)}".encode()
        _NODES[spec] = _Node(start, finish, in_place if use_in_place else None, many, count,
                             [np.dtype(t.as_numpy_dtype) for t in node_touts])
        outs = kernel(inputs, node_touts, spec=spec, in_place=use_in_place, name=op_name)
    outs = [tf.cast(o, bf16) if t == bf16 else o for o, t in zip(outs, touts)]
    return outs if many else outs[0]


def _blocking(fn, inputs, node_touts, many, op_name) -> list:
    """One stateful, blocking numpy_function running `fn` (the fallback without the kernels)."""
    outs = tf.numpy_function(_plain(fn), inputs, node_touts, stateful=True, name=op_name)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]
