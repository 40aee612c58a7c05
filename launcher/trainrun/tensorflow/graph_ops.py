"""Collectives as TensorFlow graph nodes (tf.function, TF1 graphs) that never hold a TF thread while they wait.

Why: TF's executor runs a graph's nodes on a small pool of inter-op threads (2 on a 2-core host). A
collective that blocks inside its node holds one of them until the other ranks reach it; ranks run
independent collectives in different orders, so a graph with more independent collectives than
threads can wait for good (every thread of a rank blocked on ops that another rank, itself blocked,
has not started yet). Horovod's kernels are asynchronous for that reason.

Contract: `collective(start, finish, inputs, touts, op_name)` builds, per collective, three nodes:
  1. submit -- a stateful numpy_function: `start(*arrays)` hands the op to trainrun's engine (an
     `*_async` call) and returns (runtime handle, engine); the node returns an id at once. A `start`
     that raises (a bad argument) still returns an id, whose finish raises that error.
     The one exception, for the latency of a lone collective: where the graph holds one collective
     (counted per graph as they are built: a graph of one cannot wait on itself) and no other graph
     collective is in flight on this rank (so at most one TF thread per rank ever blocks, and with two
     or more inter-op threads every rank keeps one for the submits of concurrent graphs),
     `start(*arrays, blocking=True)` runs the op to completion in the submit node (the runtime's
     blocking path, the lone-op fast path included) and the wait node then passes at once.
  2. wait -- the TrainrunWait kernel (native/check_op.cc), asynchronous: it holds no thread while the
     op is in flight and passes the id on once the waiter thread releases it.
  3. finish -- a stateful numpy_function: the op's result (or error) through `finish(result)`, never
     blocking (the op is done); a failure becomes (code, message) for TrainrunCheck (Horovod's error
     types, failures.py), as every graph collective reports it.
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
_POLL_S = 0.05  # the waiter's longest sleep (it is woken by completions; this only bounds a missed one)


class _Waiter:
    """Submitted graph ops by id: their runtime handles until they complete, then their outcomes
    until a finish node takes them. Thread-safe."""

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: dict[int, tuple] = {}   # id -> (runtime handle, engine)
        self._blocking = 0                     # ops run in a submit node now (at most one: see submit)
        self._outcomes: dict[int, tuple] = {}  # id -> (True, result) | (False, exception)
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._release = None

    def submit(self, start, arrays, alone: bool) -> np.int64:
        """Start the op (`start(*arrays)` -> (handle, engine)); its id (a failed start: done at once).
        `alone`: the op's graph holds no other collective: run it here if nothing else is in flight."""
        wait = native.wait_op()
        self._release = wait[1]
        tid = next(self._ids)
        if alone:
            with self._cv:
                alone = not self._pending and not self._blocking
                self._blocking += alone
        if alone:
            try:
                outcome = (True, start(*arrays, blocking=True))
            except Exception as e:  # noqa: BLE001 (the finish node reports it, typed)
                outcome = (False, e)
            finally:
                with self._cv:
                    self._blocking -= 1
            self._done(tid, outcome)
            return np.int64(tid)
        try:
            handle, eng = start(*arrays)
        except Exception as e:  # noqa: BLE001 (the finish node reports it, typed)
            self._done(tid, (False, e))
            return np.int64(tid)
        with self._cv:
            self._pending[tid] = (handle, eng)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainrun-tf-waiter", daemon=True)
                self._thread.start()
            self._cv.notify()
        return np.int64(tid)

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


def collective(start, finish, inputs, tout, op_name):
    """The graph nodes of one collective (module docstring); its output tensor(s), `tout` a dtype or a
    list of them. `start(*arrays)` -> (runtime handle, engine); `finish(result)` -> the output array(s)."""
    bf16 = tf.bfloat16
    inputs = [tf.cast(t, tf.float32) if t.dtype == bf16 else t for t in inputs]
    many = isinstance(tout, (list, tuple))
    touts = list(tout) if many else [tout]
    node_touts = [tf.float32 if t == bf16 else t for t in touts]
    check, wait = native.check_op(), native.wait_op()
    if wait is None:
        outs = _checked(lambda *a: finish(start(*a, blocking=True)), inputs, node_touts, many, op_name, check)
    else:
        count = _COUNTS.setdefault(tf.compat.v1.get_default_graph(), [0])
        count[0] += 1  # (read when the graph runs: complete by then)
        tid = tf.numpy_function(lambda *a: WAITER.submit(start, a, count[0] == 1), inputs, tf.int64,
                                stateful=True, name=f"{op_name}Submit")
        tid = wait[0](tf.reshape(tid, []), name=f"{op_name}Wait")
        outs = _checked(lambda t: finish(WAITER.take(t)), [tid], node_touts, many, op_name, check)
    outs = [tf.cast(o, bf16) if t == bf16 else o for o, t in zip(outs, touts)]
    return outs if many else outs[0]


def _checked(fn, inputs, node_touts, many, op_name, check) -> list:
    """One stateful numpy_function running `fn`; a failure leaves it as (code, message) outputs, raised
    by a TrainrunCheck node with Horovod's TF error type (failures.py) before any output is used;
    without that kernel the node raises (TF then reports UnknownError, or InvalidArgumentError for a
    ValueError)."""
    if check is None:
        outs = tf.numpy_function(fn, inputs, node_touts, stateful=True, name=op_name)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]
    empties = [np.zeros(0, t.as_numpy_dtype) for t in node_touts]

    def checked(*a):
        try:
            result = fn(*a)
        except failures.CAUGHT as e:
            return [*empties, *failures.code_of(e)]
        return [*(result if many else [result]), _OK, _NO_MESSAGE]
    *outs, code, message = tf.numpy_function(checked, inputs, [*node_touts, tf.int32, tf.string],
                                             stateful=True, name=op_name)
    with tf.control_dependencies([check(code, message)]):
        return [tf.identity(o) for o in outs]
