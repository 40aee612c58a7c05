"""Collectives as TensorFlow graph nodes (tf.function, TF1 graphs) that never hold a TF thread while they wait.

Why: TF's executor runs a graph's nodes on a small pool of inter-op threads (2 on a 2-core host). A
collective that blocks inside its node holds one of them until the other ranks reach it; ranks run
independent collectives in different orders, so a graph with more independent collectives than
threads can wait for good (every thread of a rank blocked on ops that another rank, itself blocked,
has not started yet). Horovod's kernels are asynchronous for that reason.

Contract: `collective(start, finish, inputs, touts, op_name)` builds, per collective:
  1. submit -- a stateful numpy_function: `start(*arrays)` hands the op to trainrun's engine (an
     `*_async` call) and keeps (runtime handle, engine); the node returns (id, empty outputs) at once.
     A `start` that raises (a bad argument) still returns an id, whose finish raises that error.
     The one exception, for the latency of a lone collective: where the graph holds one collective
     (counted per graph as they are built: a graph of one cannot wait on itself) and no other graph
     collective is in flight on this rank (so at most one TF thread per rank ever blocks, and with two
     or more inter-op threads every rank keeps one for the submits of concurrent graphs),
     `start(*arrays, blocking=True)` runs the op to completion in the submit node (the runtime's
     blocking path, the lone-op fast path included), which returns (0, the result itself) (a failure:
     an id, as above).
  2. a tf.cond on id == 0 (lowered to Switch/Merge): the result where it is 0; otherwise
  3. wait -- the TrainrunWait kernel (native/check_op.cc), asynchronous: it holds no thread while the
     op is in flight and passes the id on once the waiter thread releases it; then
  4. finish -- a stateful numpy_function: the op's result (or error) through `finish(result)`, never
     blocking (the op is done); a failure becomes (code, message) for TrainrunCheck (Horovod's error
     types, failures.py), as every graph collective reports it.
So a lone collective crosses into Python once (as before the asynchronous ops), and an op left in
flight twice; the untaken branch's nodes are dead, they hold nothing.
No node blocks, so every rank's executor starts every submit it reaches whatever the order, each op
completes once all ranks submitted it (the engine negotiates whatever is ready on every rank), and
any number of collectives in any executor order complete; the data dependencies between
collectives (one's result feeding another) are the graph's own. Nothing is added between collectives
(no control edges): a TF1 `session.run` runs only the collectives its fetches need, as before.

One waiter thread per process (`_Waiter`) watches the runtime handles of submitted ops: it sleeps on
the engine's completions (Engine.sleep_until), takes each completed op's result (synchronize, which
no longer blocks) and releases its id. It waits for whichever op completes first (never for one in
particular): an op may complete only after this rank runs nodes that need another op's result.

Known gap: a step that fails (another node's error) after some submit nodes ran but before their finish
nodes did leaves those ops' outcomes (results included) in the waiter's table, and their ids in the
kernel's released set, until the process ends.

Where the kernels cannot be built (no compiler; TRAINRUN_TF_NATIVE=0) each collective is one blocking
numpy_function (start, synchronize, finish): the limit above applies then (more inter-op threads, or
control dependencies between the collectives, avoid it).

bfloat16 crosses numpy_function nodes as float32 (numpy_function hands bfloat16 back as zeros in TF
2.21), so such values are reduced in float32 and rounded once.
"""
from __future__ import annotations

import itertools
import threading
import weakref

import numpy as np
import tensorflow as tf

from trainrun.runtime import lifecycle
from trainrun.tensorflow import failures, native

_OK, _NO_MESSAGE = np.int32(failures.OK), np.bytes_(b"")
# What a numpy_function node runs is called plainly: the code building these nodes is often converted by
# autograph (a user's tf.function calls hvd.allreduce), and a converted closure's calls each go through
# autograph's converted_call when the node runs (~40 us a submit node, measured: scripts/bench_tf_graph_nodes.py).
_plain = tf.autograph.experimental.do_not_convert
_POLL_S = 0.05  # the waiter's longest sleep (it is woken by completions; this only bounds a missed one)


class _Waiter:
    """Submitted graph ops by id: their runtime handles until they complete, then their outcomes
    until a finish node takes them. Thread-safe."""

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: dict[int, tuple] = {}   # id -> (runtime handle, engine)
        self._solo = threading.Lock()          # held by the one op a submit node runs to completion
        self._outcomes: dict[int, tuple] = {}  # id -> (True, result) | (False, exception)
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._release = None

    def submit(self, start, arrays, alone: bool, run):
        """Start the op (`start(*arrays)` -> (handle, engine)); (its id, None) (a failed start: done at
        once). `alone`: the op's graph holds no other collective: if nothing else is in flight, run it
        here to completion (`run()`) and hand back (0, its output), or, where it raised, (an id, None)
        with that error as the id's outcome."""
        if alone and not self._pending and self._solo.acquire(blocking=False):
            try:
                return 0, run()
            except Exception as e:  # noqa: BLE001 (the finish node reports it, typed)
                error = e
            finally:
                self._solo.release()
            tid = self._next_id()
            self._done(tid, (False, error))
            return tid, None
        tid = self._next_id()
        try:
            handle, eng = start(*arrays)
        except Exception as e:  # noqa: BLE001 (the finish node reports it, typed)
            self._done(tid, (False, e))
            return tid, None
        with self._cv:
            self._pending[tid] = (handle, eng)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainrun-tf-waiter", daemon=True)
                self._thread.start()
            self._cv.notify()
        return tid, None

    def _next_id(self) -> int:
        self._release = native.wait_op()[1]
        return next(self._ids)

    def take(self, tid) -> object:
        """The completed op's result (raises its error); the id is forgotten."""
        with self._cv:
            ok, value = self._outcomes.pop(int(tid))
        if not ok:
            raise value
        return value

    def _done(self, tid: int, outcome: tuple) -> None:
        with self._cv:
            self._outcomes[tid] = outcome
        self._release(tid)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending:
                    self._cv.wait()
                items = list(self._pending.items())
            ready = [(tid, handle) for tid, (handle, _) in items if _polled(handle)]
            if not ready:
                eng = items[0][1][1]
                one = len({id(e) for _, (_, e) in items}) == 1
                eng.sleep_until(lambda: any(_polled(h) for _, (h, _) in items), _POLL_S if one else 0.002)
                continue
            for tid, handle in ready:
                try:
                    outcome = (True, lifecycle.synchronize(handle))
                except BaseException as e:  # noqa: BLE001 (handed to the finish node)
                    outcome = (False, e)
                with self._cv:
                    del self._pending[tid]
                self._done(tid, outcome)


def _polled(handle) -> bool:
    try:
        return lifecycle.poll(handle)
    except ValueError:  # forgotten (a reset runtime): synchronize reports it
        return True


WAITER = _Waiter()
_COUNTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> [its collectives]


@_plain
def collective(start, finish, inputs, tout, op_name):
    """The graph nodes of one collective (module docstring); its output tensor(s), `tout` a dtype or a
    list of them. `start(*arrays)` -> (runtime handle, engine); `finish(result)` -> the output array(s)."""
    bf16 = tf.bfloat16
    inputs = [tf.cast(t, tf.float32) if t.dtype == bf16 else t for t in inputs]
    many = isinstance(tout, (list, tuple))
    touts = list(tout) if many else [tout]
    node_touts = [tf.float32 if t == bf16 else t for t in touts]
    check, wait = native.check_op(), native.wait_op()
    if wait is None or check is None:
        outs = _checked(lambda *a: finish(start(*a, blocking=True)), inputs, node_touts, many, op_name, check)
    else:
        outs = _asynchronous(start, finish, inputs, node_touts, many, op_name, check, wait[0])
    outs = [tf.cast(o, bf16) if t == bf16 else o for o, t in zip(outs, touts)]
    return outs if many else outs[0]


def _asynchronous(start, finish, inputs, node_touts, many, op_name, check, wait) -> list:
    """The submit node -> (id, output(s)); id 0: the op ran to completion in it, and its outputs are the
    result. Otherwise the wait node, the finish node and TrainrunCheck give the result: they sit in the
    false branch of a tf.cond on `id == 0` (lowered to Switch/Merge), so a lone op costs one Python
    crossing and no check node."""
    count = _COUNTS.setdefault(tf.compat.v1.get_default_graph(), [0])
    count[0] += 1  # (read when the graph runs: complete by then)
    empties = [np.zeros(0, t.as_numpy_dtype) for t in node_touts]

    def submit(*a):
        tid, outcome = WAITER.submit(start, a, count[0] == 1, lambda: finish(start(*a, blocking=True)))
        return [np.int64(tid), *(empties if tid else outcome if many else [outcome])]

    tid, *first = tf.numpy_function(_plain(submit), inputs, [tf.int64, *node_touts], stateful=True, name=f"{op_name}Submit")
    tid = tf.reshape(tid, [])

    def later():
        t = wait(tid, name=f"{op_name}Wait")
        return _checked(lambda t: finish(WAITER.take(t)), [t], node_touts, many, op_name, check)

    outs = tf.cond(tf.equal(tid, 0), lambda: [tf.identity(x) for x in first], later)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _outcome(fn, many, empties) -> list:
    """`fn()`'s output array(s), code OK and no message; or, where it raised an error failures.py
    types, empty outputs and that error's (code, message) for TrainrunCheck."""
    try:
        result = fn()
    except failures.CAUGHT as e:
        return [*empties, *failures.code_of(e)]
    return [*(result if many else [result]), _OK, _NO_MESSAGE]


def _checked(fn, inputs, node_touts, many, op_name, check) -> list:
    """One stateful numpy_function running `fn`; a failure leaves it as (code, message) outputs, raised
    by a TrainrunCheck node with Horovod's TF error type (failures.py) before any output is used;
    without that kernel the node raises (TF then reports UnknownError, or InvalidArgumentError for a
    ValueError)."""
    if check is None:
        outs = tf.numpy_function(_plain(fn), inputs, node_touts, stateful=True, name=op_name)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]
    empties = [np.zeros(0, t.as_numpy_dtype) for t in node_touts]
    *outs, code, message = tf.numpy_function(_plain(lambda *a: _outcome(lambda: fn(*a), many, empties)), inputs,
                                             [*node_touts, tf.int32, tf.string], stateful=True, name=op_name)
    with tf.control_dependencies([check(code, message)]):
        return [tf.identity(o) for o in outs]
