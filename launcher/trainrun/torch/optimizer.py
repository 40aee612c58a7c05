"""DistributedOptimizer (horovod.torch.optimizer): average gradients across ranks during backward.

Each parameter gets a post-accumulate-grad hook that notes its gradient final for this step.
- With no `groups` given, the CPU parameters are reduced in buckets (buckets.py: up to 25 MiB of one
  dtype in backward order; TRAINRUN_BUCKET_BYTES sets the size, 0 restores Horovod's one allreduce per
  gradient): a bucket is one grouped allreduce, in place on the gradients, started by the hook of its
  last member, as torch DDP does. One request per gradient costs more Python than a small gradient's
  reduction (buckets.py says how much).
- `groups` (a list of lists of parameters, or a number of groups) reduces each group together in the
  same way, started when its last member's gradient is ready (Horovod's option).
- Any other parameter (CUDA, or buckets off) has its gradient reduced by its own allreduce (named after
  the parameter, as in Horovod), started in batches: whenever the final gradients not yet started
  reach BATCH_BYTES, and the rest in `synchronize()`.
`step()` calls `synchronize()` before the wrapped optimizer's step. With backward_passes_per_step=k,
gradients accumulate locally for k backward passes and are reduced once.
"""
from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager
from time import perf_counter_ns

import torch

from trainrun.runtime import lifecycle
from trainrun.runtime.ops import Handle
from trainrun.torch import buckets
from trainrun.torch import builders as build
from trainrun.torch.compression import Compression
from trainrun.torch.passes import count_pass, refuse_zero_grad
from trainrun.torch.mpi_ops import Adasum, Average, sparse_allreduce_async

# Gradients final in backward start in batches of this many bytes (the rest in synchronize), not one by
# one: each start is a Python call into the engine and a wake-up of its thread, which on a CPU costs more
# than the overlap it buys (a 100-tensor, 800 KiB model on 2 cores: 1.9x -> 1.6x of a step without
# communication; docs/benchmarks/allreduce.md). 25 MiB is torch DDP's bucket size: large models still
# overlap communication with backward.
BATCH_BYTES = 25 << 20
_SPARSE = object()  # the ctx of a sparse gradient's handle (sparse_allreduce_async, sparse_as_dense=False)


def parameter_names(param_groups, named_parameters) -> dict:
    """parameter -> its name on the wire: from `named_parameters` (checked as Horovod does: tuples,
    unique names, every parameter named), or `allreduce.noname.<group>.<index>` without them."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                            for i, group in enumerate(param_groups) for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    dups = sorted(n for n, count in Counter(k for k, _ in named_parameters).items() if count > 1)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         "Found duplicates: %s" % ", ".join(dups))
    all_ids = {id(v) for group in param_groups for v in group["params"]}
    unnamed = all_ids - {id(v) for _, v in named_parameters}
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         "Python object ids: %s" % ", ".join(str(i) for i in unnamed))

    return {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, process_set=None, sparse_as_dense=False):
        super(self.__class__, self).__init__(params)
        self.sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        # a rank outside `process_set` trains on its own gradients, with no collective (as Horovod)
        self._in_set = process_set is None or process_set.process_set_id == 0 or process_set.included()
        self._set_size = lifecycle.engine(process_set).size if self._in_set else 1
        self._compression = compression
        self._parameter_names = parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._handles: dict = {}  # ungrouped parameter -> (engine Handle or None, ctx); see _start
        self._hook_handles = []
        self._synchronized = False
        self._should_synchronize = True
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        # passes left per parameter, by its position in `params` (a list: a dict keyed by tensors hashes
        # each one in Python on every hook)
        self._passes_left = [backward_passes_per_step] * len(params)
        self._groups = self._make_groups(groups)
        if self._groups:
            self._group_names = ["grouped." + ".".join(sorted(self._parameter_names[p] for p in g))
                                 for g in self._groups]
        else:  # no groups asked for: buckets (buckets.py), named by their ends and size
            self._groups = buckets.plan(params, lifecycle.settings().bucket_bytes)
            names = self._parameter_names
            self._group_names = [f"bucket.{names[g[0]]}..{names[g[-1]]}.{len(g)}" for g in self._groups]
        # group state by the group's index, reset by synchronize: members still to finish their passes,
        # and the started groups' (engine handles, finalize, parameters, (compressed, ctx) pairs)
        self._group_left = [len(g) for g in self._groups]
        self._group_started: dict[int, tuple] = {}
        self._group_buffers: list = [None] * len(self._groups)  # the flat tensor each group last travelled in
        self._first_hook = [True]  # no gradient hook has fired since the last synchronize (or the start)
        in_group = {id(p) for g in self._groups for p in g}
        self._ungrouped = [p for p in params if id(p) not in in_group]
        self._batch: list = []  # final gradients not in a group, not yet started (see the hook)
        self._batch_bytes = 0
        self._measured = None  # the engine whose step_end the last synchronize set (wire/perf_line.py)
        # as Horovod: one rank has nothing to average, unless the job is elastic (it may grow; also how
        # scripts/bench_gpu.py measures the GPU path on one GPU)
        # (settings.elastic: TRAINRUN_ELASTIC=1 or HOROVOD_ELASTIC=1, read at init)
        self._reduces = self._in_set and (self._set_size > 1 or lifecycle.settings().elastic)
        if self._reduces:
            self._register_hooks(params)

    def _make_groups(self, groups) -> list[tuple]:
        if not groups:
            return []
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if isinstance(groups, int):
            return [tuple(params[i::groups]) for i in range(groups) if params[i::groups]]
        if not isinstance(groups, list) or not all(isinstance(g, (list, tuple)) for g in groups):
            raise ValueError("groups should be a non-negative integer or a list of lists of torch.Tensor.")
        known = {id(p) for p in params}
        out = [tuple(g) for g in groups if g]
        if any(id(p) not in known for g in out for p in g):
            raise ValueError("groups must only contain parameters of the optimizer that require grad")
        return out

    def _register_hooks(self, params: list) -> None:
        group_of = {id(p): i for i, g in enumerate(self._groups) for p in g}
        for slot, p in enumerate(params):
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p, slot, group_of.get(id(p)))))

    def _scales(self):
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _start(self, params: list, wake: bool = True) -> None:
        """Start the reductions of `params` (gradients final, none in a group still forming): the dense
        gradients as one batch -- each its own in-place allreduce under its parameter's name, as in
        Horovod, announced to the engine in one submit (`wake=False`: the caller synchronizes next and
        drives them) -- a sparse one on its own (sparse_as_dense=False: Horovod's allgather of indices
        and values). Their engine handles, with what synchronize needs, go to _handles."""
        dense, pairs = [], []
        for p in params:
            if p.grad is None:  # a parameter that took no part in this step's loss
                p.grad = p.data.new(p.size()).zero_()
            grad = p.grad
            if grad.is_sparse:
                if not self.sparse_as_dense:
                    self._handles[p] = (sparse_allreduce_async(grad, name=self._parameter_names.get(p), op=self.op,
                                                               process_set=self._process_set), _SPARSE)
                    continue
                grad = grad.to_dense()  # reduced dense, then written back as p.grad (see synchronize)
            dense.append(p)
            pairs.append(self._compression.compress(grad))
        if not dense:
            return
        eng = lifecycle.engine(self._process_set)
        pre, post = self._scales()
        names, op, reqs, kept = self._parameter_names, self.op, [], []
        for p, (compressed, cctx) in zip(dense, pairs):
            (req,), finalize = build.allreduce(eng, compressed, names.get(p), op, pre, post, True)
            reqs.append(req)
            kept.append((req.handle, (compressed, cctx, finalize)))
        eng.submit(reqs, wake=wake)  # (raises before any handle is kept: nothing then waits on them)
        self._handles.update(zip(dense, kept))

    def _flush(self) -> None:
        """Start the batch of final gradients the hooks collected."""
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        self._start(batch)

    def _start_group(self, index: int, wake: bool) -> None:
        """Start the reduction of group `index` (every member's gradient final, or synchronize): one
        grouped allreduce of its dense gradients, in place, under the group's name (flat.py: one copy
        in, one request, one copy out); a sparse gradient (sparse_as_dense=False) goes on its own, as
        Horovod reduces sparse gradients (sparse_allreduce_async). `wake`: see Engine.submit."""
        dense, pairs = [], []
        compress = self._compression.compress
        for p in self._groups[index]:
            grad = p.grad
            if grad is None:
                grad = p.grad = p.data.new(p.size()).zero_()
            if grad.is_sparse:
                if not self.sparse_as_dense:
                    self._handles[p] = (sparse_allreduce_async(grad, name=self._parameter_names.get(p), op=self.op,
                                                               process_set=self._process_set), _SPARSE)
                    continue
                grad = grad.to_dense()  # reduced dense, written back sparse in synchronize
            dense.append(p)
            pairs.append(compress(grad))
        if not dense:
            self._group_started[index] = ((), None, (), ())
            return
        eng = lifecycle.engine(self._process_set)
        pre, post = self._scales()
        tensors = [t for t, _ in pairs]
        reqs, finalize = build.grouped_allreduce(eng, tensors, self._group_names[index], self.op, pre, post, True,
                                                 self._buffer(index, tensors))
        eng.submit(reqs, wake=wake)
        self._group_started[index] = ([r.handle for r in reqs], finalize, dense, pairs)

    def _buffer(self, index: int, tensors: list):
        """The flat CPU tensor group `index` travels in (flat.pack), kept across steps: made again only
        when the group's dtype or length changes (a sparse member that was dense, compression)."""
        t = tensors[0]
        n = sum(x.numel() for x in tensors)
        buf = self._group_buffers[index]
        if buf is None or buf.dtype is not t.dtype or buf.numel() != n:
            if not t.is_cpu:
                return None
            buf = self._group_buffers[index] = torch.empty(n, dtype=t.dtype)
        return buf

    def _make_hook(self, p, slot: int, index: int | None):
        """The hook of parameter p (position `slot`; in group `index`, or None). Kept lean: it runs
        once per gradient per step (200 gradients of a small model: a microsecond of Python each is
        2% of its step), so what it reads lives in the closure, and the lists it counts in are reset
        in place by synchronize."""
        passes, left, first = self._passes_left, self._group_left, self._first_hook
        if index is not None:
            def group_hook(_):
                if first[0]:  # the step's first gradient: backward began (the meter's time before it)
                    self._backward_began()
                n = passes[slot]
                if n <= 0:
                    count_pass(passes, slot)  # (raises Horovod's error)
                passes[slot] = n - 1
                if n != 1:
                    return  # accumulating locally: the group starts once passes are done, or in synchronize
                n = left[index] - 1
                left[index] = n
                if not n:
                    # the last group to start, with no other gradients to come: synchronize drives it next,
                    # in this thread (waking the engine's would cost a hand-off)
                    last = len(self._group_started) + 1 == len(self._groups) and not self._ungrouped
                    self._start_group(index, wake=not last)
            return group_hook

        def hook(_):
            assert not p.grad.requires_grad
            if first[0]:
                self._backward_began()
            if not count_pass(passes, slot):
                self._handles[p] = (None, None)  # accumulating locally: reduced once passes are done, or by synchronize
                return
            self._handles[p] = (None, None)
            if p.grad.is_sparse:
                self._start([p])
                return
            # batched: a Python call per gradient costs more than the overlap it buys on a CPU; a batch
            # still starts during backward once it holds BATCH_BYTES
            self._batch.append(p)
            self._batch_bytes += p.grad.nbytes
            if self._batch_bytes >= BATCH_BYTES:
                self._flush()
        return hook

    def _backward_began(self) -> None:
        """The first gradient hook of a step: the meter's time before the step ends here (from the last
        synchronize's end: the data loader, forward)."""
        self._first_hook[0] = False
        meter = self._measured
        if meter is not None and meter.step_end:
            meter.before_ns += perf_counter_ns() - meter.step_end
            meter.step_end = 0

    def synchronize(self):
        """Wait for every gradient's allreduce (starting those whose hooks did not fire) and write the
        averaged gradients into p.grad."""
        if not self._reduces:
            self._synchronized = True
            return
        started = self._group_started
        for index in range(len(self._groups)):  # groups a hook did not complete (an unused member, passes left)
            if index not in started:
                self._start_group(index, wake=False)
        handles = self._handles
        missing = [p for p in self._ungrouped if p not in handles]  # (hooks that did not fire)
        self._batch, self._batch_bytes = [], 0
        # (wait_all below drives them in this thread: no hand-off to the engine's)
        self._start([key for key, (handle, _) in handles.items() if handle is None] + missing, wake=False)
        # engine handles, waited for at once: the batches' (_start) and the groups'; sparse ones after
        waiting = [h for h, _ in handles.values() if h.__class__ is Handle]
        for engine_handles, _, _, _ in started.values():
            waiting += engine_handles
        if waiting:
            lifecycle.engine(self._process_set).wait_all(waiting)
        decompress = self._compression.decompress
        for engine_handles, finalize, params, pairs in started.values():
            if finalize is None:
                continue
            finalize(None)  # (the copy back into the gradients, or their compressed copies)
            for p, (compressed, cctx) in zip(params, pairs):
                grad = decompress(compressed, cctx)
                if grad is not p.grad:
                    self._write_grad(p, grad)
        for key, (handle, ctx) in handles.items():
            if ctx is _SPARSE:  # its result is the reduced sparse gradient
                key.grad = lifecycle.synchronize(handle)
                continue
            compressed, cctx, finalize = ctx
            finalize(None)  # (an in-place op on a copy writes it back)
            grad = decompress(compressed, cctx)
            if grad is not key.grad:
                self._write_grad(key, grad)
        # every parameter was reduced: all count passes afresh (in place: the hooks hold these lists)
        self._passes_left[:] = [self.backward_passes_per_step] * len(self._passes_left)
        self._group_left[:] = [len(g) for g in self._groups]
        self._first_hook[0] = True
        started.clear()
        handles.clear()
        self._synchronized = True
        meter = lifecycle.engine(self._process_set).meter  # (wire/perf_line.py: steps per window, the time before each)
        meter.steps += 1
        if meter.on:
            meter.step_end = perf_counter_ns()
            self._measured = meter

    @staticmethod
    def _write_grad(p, grad) -> None:
        """Put the reduced `grad` in p.grad: sparse again where p.grad is sparse (sparse_as_dense: the
        optimizer got them sparse, and torch.optim.SparseAdam needs that), else copied in."""
        if p.grad.is_sparse:
            p.grad = grad.to_sparse(p.grad.sparse_dim())
        else:
            with torch.no_grad():
                p.grad.copy_(grad)

    @contextmanager
    def skip_synchronize(self):
        """Inside this context step() does not synchronize (use after an explicit synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        refuse_zero_grad(self._handles or self._group_started or not self._first_hook[0])
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None):
    """Wrap `optimizer` so step() applies gradients averaged (op) over all ranks.

    Returns an instance of a dynamic subclass of the optimizer's class that shares its param_groups and
    state. Raises ValueError for gradient_predivide_factor with op != Average, for unnamed or duplicate
    parameter names. With op=Adasum (and more than one rank) it is Horovod's delta optimizer
    (adasum_optimizer.py): each rank steps locally, the ranks combine the parameter changes with Adasum;
    only on the global process set, as in Horovod.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and lifecycle.engine(None).size > 1:  # (one rank: the plain optimizer, as in Horovod)
        if process_set is not None and process_set is not lifecycle.global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        if groups or num_groups:
            raise ValueError("DistributedOptimizer(op=Adasum) reduces each parameter's delta on its own: "
                             "groups are not supported with it (as in Horovod)")
        from trainrun.torch.adasum_optimizer import _DistributedAdasumOptimizer
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, parameter_names(optimizer.param_groups, named_parameters), compression,
                   backward_passes_per_step)
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, process_set, sparse_as_dense)
