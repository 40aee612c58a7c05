"""Allreduce benchmark: trainrun vs raw mpi4py vs torch.distributed (gloo), side by side, 2 ranks.

    trainrun -np 2 python scripts/bench_allreduce.py [--out FILE] [--quick] [--paths-only]
    (or: mpiexec -n 2 python scripts/bench_allreduce.py)

Measures (medians of per-iteration times on rank 0, float32; every iteration runs trainrun and raw MPI
once each, right after a barrier, so load bursts on a shared machine hit both alike; gloo runs in its
own block, as a gloo call leaves its threads busy and slows whatever runs next):
  1. one in-place allreduce of 4 KiB .. 64 MiB (trainrun allreduce_, MPI IN_PLACE, gloo all_reduce);
  2. 160 x 4 KiB: trainrun grouped_allreduce and 160 async ops, against raw MPI one call per tensor
     and raw MPI on one pre-fused buffer;
  3. a training step of a model with 100 parameter tensors: DistributedOptimizer vs torch DDP (gloo);
  4. call paths (issue 11): raw MPI, NumPy and torch, named, unnamed, in and out of place, at 4 KiB and
     16 MiB; 160 x 4 KiB grouped and async through both (`--paths-only` runs just this).
Writes a markdown report (date, machine, load, the table, the issue's targets met or not) to stdout
and to --out (none by default: docs/benchmarks/allreduce.md is a record of dated runs with notes
written around them, which a run must not overwrite).
"""
import argparse
import os
import statistics
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from mpi4py import MPI

import trainrun.runtime as rt
import trainrun.torch as hvd
from trainrun.runtime import gather
from trainrun.torch import flat

COMM = MPI.COMM_WORLD
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/: bench_common
from bench_common import fmt_size, fmt_us, interleaved_medians_us, interleaved_samples_us, write_out  # noqa: E402
from bench_common import iters_for as _iters_for  # noqa: E402
TARGETS = []  # (target, measured, met) rows for the report: the speed targets


def medians_us(fns, iters, warmup=3):
    """bench_common.interleaved_medians_us with every rank in step (MPI barrier)."""
    return interleaved_medians_us(fns, iters, COMM.Barrier, warmup)


def iters_for(nbytes, quick):
    return _iters_for(nbytes, quick, quick_min=3)


def init_gloo():
    port = COMM.bcast(29500 + os.getpid() % 1000 if COMM.rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=COMM.rank, world_size=COMM.size)


def single_sizes(quick):
    rows = []
    for nbytes in [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]:
        x = np.ones(nbytes // 4, np.float32)
        t = torch.from_numpy(x.copy())
        it = iters_for(nbytes, quick)
        # all three in place on a preallocated buffer (as gradients are reduced); trainrun's
        # out-of-place allreduce adds the first-touch cost of a fresh output on large tensors
        ours, raw = medians_us([lambda: rt.allreduce_(x, name="bench", op=rt.Sum),
                                lambda: COMM.Allreduce(MPI.IN_PLACE, x)], it)
        (gloo,) = medians_us([lambda: dist.all_reduce(t)], it)
        gbs = lambda us: f"{nbytes / us / 1e3:.2f}"  # noqa: E731  (GB/s of the tensor size)
        if nbytes == 4 << 10:
            TARGETS.append(("lone 4 KiB allreduce within 3x raw MPI latency", f"{ours / raw:.1f}x", ours <= 3 * raw))
        if nbytes >= 1 << 20:
            TARGETS.append((f">= 0.9x raw MPI bandwidth at {fmt_size(nbytes)}", f"{raw / ours:.2f}x", raw / ours >= 0.9))
        rows.append((f"allreduce {fmt_size(nbytes)}", fmt_us(ours), fmt_us(raw), fmt_us(gloo),
                     f"{ours / raw:.1f}x", f"{ours / gloo:.2f}x", f"{gbs(ours)} / {gbs(raw)} / {gbs(gloo)}"))
    return rows


def many_small(quick):
    n, count = 1024, 160
    xs = [np.full(n, i, np.float32) for i in range(count)]
    fused = np.concatenate(xs)
    ts = [torch.from_numpy(x.copy()) for x in xs]
    it = 30 if quick else 100

    def asyncs():
        hs = [rt.allreduce_async_(x, name=f"s{i}", op=rt.Sum) for i, x in enumerate(xs)]
        for h in hs:
            rt.synchronize(h)

    def raw_each():
        for x in xs:
            COMM.Allreduce(MPI.IN_PLACE, x)

    def gloo_each():
        for t in ts:
            dist.all_reduce(t)

    grouped, asy, raw, raw_fused = medians_us([lambda: rt.grouped_allreduce(xs, name="g", op=rt.Sum), asyncs,
                                               raw_each, lambda: COMM.Allreduce(MPI.IN_PLACE, fused)], it)
    (gloo,) = medians_us([gloo_each], max(5, it // 10))
    rows = [("160 x 4 KiB grouped_allreduce", fmt_us(grouped), fmt_us(raw_fused) + " (one fused call)", fmt_us(gloo),
             f"{grouped / raw_fused:.1f}x", f"{grouped / gloo:.3f}x", ""),
            ("160 x 4 KiB, 160 async + synchronize", fmt_us(asy), fmt_us(raw) + " (160 calls)", fmt_us(gloo),
             f"{asy / raw:.1f}x ({asy / raw_fused:.1f}x one fused call)", f"{asy / gloo:.3f}x", "")]
    TARGETS.append(("160 x 4 KiB grouped_allreduce within 2x one fused raw MPI call", f"{grouped / raw_fused:.1f}x",
                    grouped <= 2 * raw_fused))
    TARGETS.append(("160 x 4 KiB as 160 async ops within 2x one fused raw MPI call", f"{asy / raw_fused:.1f}x",
                    asy <= 2 * raw_fused))
    return rows


def call_paths(quick):
    """Issue 11: every way to call an allreduce, side by side with raw MPI, at 4 KiB and 16 MiB (op Sum,
    in place unless said); then 160 x 4 KiB through NumPy and torch, grouped and async, against one
    fused raw call. Each row: median, and the spread (25th-75th percentile) of its ratio to raw."""
    rows = []
    for nbytes in (4 << 10, 16 << 20):
        x = np.ones(nbytes // 4, np.float32)
        t = torch.ones(nbytes // 4)
        it = (60 if nbytes < 1 << 20 else 12) if quick else (400 if nbytes < 1 << 20 else 60)
        fns = {
            "raw `Allreduce(IN_PLACE)`": lambda: COMM.Allreduce(MPI.IN_PLACE, x),
            "raw `Allreduce` into a fresh output": lambda: COMM.Allreduce(x, np.empty_like(x)),
            # the least any torch binding adds to MPI: its result is a new torch tensor (wrapping a
            # NumPy output is the cheapest way measured: 0.9 us, against 1.6 for torch.empty_like + .numpy())
            "raw `Allreduce` into a fresh output, returned as a torch tensor (`torch.from_numpy`, no engine)":
                lambda: torch.from_numpy(fresh_output(x)),
            "raw agreement round + `Iallreduce`, polled (the engine's MPI work alone)": lambda: round_then_data(x),
            "NumPy `allreduce_(x, name=...)`": lambda: rt.allreduce_(x, name="p.np", op=rt.Sum),
            "NumPy `allreduce_(x)` unnamed": lambda: rt.allreduce_(x, op=rt.Sum),
            "NumPy `allreduce(x)` unnamed, out of place": lambda: rt.allreduce(x, op=rt.Sum),
            "torch `allreduce_(t, name=...)`": lambda: hvd.allreduce_(t, name="p.t", op=hvd.Sum),
            "torch `allreduce_(t)` unnamed": lambda: hvd.allreduce_(t, op=hvd.Sum),
            "torch `allreduce(t)` unnamed, out of place": lambda: hvd.allreduce(t, op=hvd.Sum),
        }
        # after a row that allocated (and freed) a fresh 16 MiB output, the next timed call ran up to 2x
        # slower whatever it was: an untimed in-place raw call settles the ranks before each row
        settle = (lambda: COMM.Allreduce(MPI.IN_PLACE, x)) if nbytes >= 1 << 20 else None
        samples = samples_us(list(fns.values()), it, settle=settle)
        by_row = dict(zip(fns, samples))
        med = {k: statistics.median(v) for k, v in by_row.items()}
        for k, v in zip(fns, samples):
            rows.append((f"{k}, {fmt_size(nbytes)}", fmt_us(med[k]), spread(v, samples[0])))
        size = fmt_size(nbytes)
        named_np, unnamed_np = med["NumPy `allreduce_(x, name=...)`"], med["NumPy `allreduce_(x)` unnamed"]
        named_t, unnamed_t = med["torch `allreduce_(t, name=...)`"], med["torch `allreduce_(t)` unnamed"]
        out_t, fresh = med["torch `allreduce(t)` unnamed, out of place"], med["raw `Allreduce` into a fresh output"]
        raw = med["raw `Allreduce(IN_PLACE)`"]
        PATH_TARGETS.extend([
            (f"{size}: unnamed within 1.2x named (NumPy, torch)", f"{unnamed_np / named_np:.2f}x, "
             f"{unnamed_t / named_t:.2f}x", max(unnamed_np / named_np, unnamed_t / named_t) <= 1.2),
            (f"{size}: torch within 1.2x NumPy (named, unnamed)", f"{named_t / named_np:.2f}x, "
             f"{unnamed_t / unnamed_np:.2f}x", max(named_t / named_np, unnamed_t / unnamed_np) <= 1.2),
            (f"{size}: torch out of place within 1.1x raw MPI into a fresh output", f"{out_t / fresh:.2f}x",
             out_t <= 1.1 * fresh)])
        floor = spread(by_row["raw `Allreduce` into a fresh output, returned as a torch tensor (`torch.from_numpy`, "
                              "no engine)"], by_row["raw `Allreduce` into a fresh output"])
        PATH_NOTES.append(f"{size}: the floor of a torch out-of-place call (raw MPI into a new array returned as a "
                          f"torch tensor; no engine, no checks) is {floor} of raw MPI into a fresh NumPy output.")
        if nbytes == 4 << 10:
            PATH_TARGETS.append(("4 KiB: in place within 2x raw (NumPy, torch; unnamed)",
                                 f"{unnamed_np / raw:.2f}x, {unnamed_t / raw:.2f}x", max(unnamed_np, unnamed_t) <= 2 * raw))
    count = 160
    xs = [np.full(1024, i, np.float32) for i in range(count)]
    ts = [torch.full((1024,), float(i)) for i in range(count)]
    fused = np.concatenate(xs)

    def np_async():
        for h in [rt.allreduce_async_(x, op=rt.Sum) for x in xs]:
            rt.synchronize(h)

    def t_async():
        for h in [hvd.allreduce_async_(t, op=hvd.Sum) for t in ts]:
            hvd.synchronize(h)

    def t_grouped_torch_copies():
        """The same call with runtime/gather.py switched off: the group copied in and out by torch
        (cat, split, _foreach_copy_), as before the MPI copy; what that copy buys, side by side."""
        flat.gather = _NO_GATHER
        try:
            hvd.grouped_allreduce_(ts, op=hvd.Sum)
        finally:
            flat.gather = gather

    staged, back = fused.copy(), np.empty_like(fused)

    def copy_floor():
        """Any group that travels through a fusion buffer (this runtime's, Horovod's) copies its data
        in and out: here at best, as one contiguous memcpy each way with no per-tensor work and no
        agreement round. No copy-based group can be faster than this row."""
        np.copyto(staged, fused)
        COMM.Allreduce(MPI.IN_PLACE, staged)
        np.copyto(back, staged)

    one_row, floor_row = "raw: one fused call", "raw: one memcpy in, the fused call, one memcpy out (the floor of a copied group)"
    fns = {one_row: lambda: COMM.Allreduce(MPI.IN_PLACE, fused),
           floor_row: copy_floor,
           "NumPy `grouped_allreduce` unnamed": lambda: rt.grouped_allreduce(xs, op=rt.Sum),
           "NumPy 160 `allreduce_async_` unnamed": np_async,
           "torch `grouped_allreduce_` unnamed": lambda: hvd.grouped_allreduce_(ts, op=hvd.Sum),
           "torch `grouped_allreduce_` unnamed, copied by torch (no runtime/gather.py)": t_grouped_torch_copies,
           "torch 160 `allreduce_async_` unnamed": t_async}
    samples = samples_us(list(fns.values()), 30 if quick else 150)
    by_row = dict(zip(fns, samples))
    med = {k: statistics.median(v) for k, v in by_row.items()}
    for k, v in zip(fns, samples):
        rows.append((f"160 x 4 KiB, {k}", fmt_us(med[k]), spread(v, samples[0])))
    one = med[one_row]
    for k, limit in (("torch `grouped_allreduce_` unnamed", 1.5), ("torch 160 `allreduce_async_` unnamed", 3.0),
                     ("NumPy `grouped_allreduce` unnamed", 1.5), ("NumPy 160 `allreduce_async_` unnamed", 3.0)):
        PATH_TARGETS.append((f"160 x 4 KiB, {k}: within {limit}x one fused raw call", f"{med[k] / one:.2f}x",
                             med[k] <= limit * one))
    PATH_NOTES.append(f"The floor of a copied group (one memcpy in, the fused call, one memcpy out; no per-tensor "
                      f"work, no agreement round) is {spread(by_row[floor_row], by_row[one_row])} of one fused raw call here: "
                      "the best any group copied through a fusion buffer, this runtime's or Horovod's, can reach.")
    return rows


_CTRL, _ROUND_SEND, _ROUND_RECV = COMM.Dup(), bytearray(32), bytearray(32)
_ROUND = _CTRL.Allreduce_init([_ROUND_SEND, MPI.UINT64_T], [_ROUND_RECV, MPI.UINT64_T], op=MPI.BAND)


_NO_GATHER = type("NoGather", (), {"gather": staticmethod(lambda blocks, dst: False),
                                    "scatter": staticmethod(lambda src, blocks: False)})


def fresh_output(x):
    """Raw MPI out of place: the sum of `x` over ranks in a new NumPy array."""
    out = np.empty_like(x)
    COMM.Allreduce(x, out)
    return out


def _poll(request) -> None:
    while not request.Test():
        pass


def round_then_data(x) -> None:
    """What a cached lone allreduce costs in MPI alone: the engine's agreement round (a 32-byte bitwise
    allreduce on its own communicator, a persistent request as in runtime/round_port.py) then the data's
    Iallreduce, both polled as the engine polls. The floor any binding of this design can reach; the
    rows below it are that plus Python."""
    _ROUND.Start()
    _poll(_ROUND)
    _poll(COMM.Iallreduce(MPI.IN_PLACE, x))


def samples_us(fns, iters, warmup=5, settle=None):
    """bench_common.interleaved_samples_us with every rank in step (MPI barrier)."""
    return interleaved_samples_us(fns, iters, COMM.Barrier, warmup, settle)


def spread(samples, raw):
    """The 25th-75th percentile of per-iteration ratios to `raw` (same iterations)."""
    ratios = sorted(a / b for a, b in zip(samples, raw))
    q = len(ratios) // 4
    return f"{ratios[len(ratios) // 2]:.2f}x ({ratios[q]:.2f}-{ratios[-q - 1]:.2f})"


PATH_TARGETS = []
PATH_NOTES = []  # sentences printed under the targets: what bounds them


class Deep(nn.Module):
    """50 Linear(64, 64) layers: 100 parameter tensors, 208K parameters."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(50))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def training_step(quick):
    it = 20 if quick else 60
    x, y = torch.randn(32, 64), torch.randn(32, 64)

    torch.manual_seed(0)
    model = Deep()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())

    def ours():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Deep())
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def theirs():
        ddp_opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        ddp_opt.step()

    torch.manual_seed(0)
    local = Deep()
    local_opt = torch.optim.SGD(local.parameters(), lr=0.01)

    def compute_only():
        local_opt.zero_grad()
        nn.functional.mse_loss(local(x), y).backward()
        local_opt.step()

    a, c = medians_us([ours, compute_only], it)
    (b,) = medians_us([theirs], it)
    return [(f"train step, {len(list(model.parameters()))} param tensors (DistributedOptimizer vs DDP)",
             fmt_us(a), f"{fmt_us(c)} (no communication)", fmt_us(b), "", f"{a / b:.2f}x", "")]


def report(rows, quick, load_start, paths=()) -> str:
    import bench_common  # scripts/ (this script's folder): machine lines shared by the benchmarks

    launcher = "trainrun" if "TRAINRUN_RANK" in os.environ else "mpiexec"
    lines = ["# Allreduce: trainrun vs raw mpi4py vs torch gloo", ""] + bench_common.machine_lines()
    load_end = os.getloadavg()[0]
    mpi = " ".join(MPI.Get_library_version().splitlines()[0].split())
    lines += [f"- torch {torch.__version__}; MPI library: {mpi}",
              f"- load average (1 min) at start / end: {load_start:.1f} / {load_end:.1f} (a shared box inflates every row)",
              f"- method: {COMM.size} ranks started by {launcher}, float32, loopback; medians on rank 0; every iteration "
              "runs trainrun and raw MPI once each, right after a barrier; gloo in its own block (`scripts/bench_allreduce.py"
              + (" --quick" if quick else "") + "`); allreduces in place, op Sum", ""]
    head = ("| what | trainrun | raw mpi4py | torch gloo | trainrun / raw | trainrun / gloo | GB/s (trainrun / raw / gloo) |\n"
            "|---|---:|---:|---:|---:|---:|---:|\n")
    table = head + "".join("| " + " | ".join(r) + " |\n" for r in rows)
    targets = ("\n## Targets (issue 5)\n\n| target | measured | met |\n|---|---:|---|\n"
               + "".join(f"| {t} | {m} | {'yes' if ok else 'no'} |\n" for t, m, ok in TARGETS))
    out = "\n".join(lines) + "\n"
    if rows:
        out += table + targets
    if paths:
        out += ("\n## Call paths (issue 11)\n\nEvery iteration runs every row once, each after a barrier; "
                "ratio: median of the per-iteration ratio to the first row (raw in place), with its 25th-75th "
                "percentile spread.\n\n| path | median | ratio to raw in place (spread) |\n|---|---:|---:|\n"
                + "".join("| " + " | ".join(r) + " |\n" for r in paths)
                + "\n| target (issue 11) | measured | met |\n|---|---:|---|\n"
                + "".join(f"| {t} | {m} | {'yes' if ok else 'no'} |\n" for t, m, ok in PATH_TARGETS)
                + "".join(f"\n{n}\n" for n in PATH_NOTES))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the report to this markdown file (rank 0)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--paths-only", action="store_true", help="only the call-path section (issue 11)")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    torch.set_num_threads(1)
    rt.init()
    init_gloo()
    # the training step first: gloo's threads stay busy for a while after heavy use (the sections
    # above end with 160 gloo calls) and slowed whatever ran next by up to 1.5x in earlier runs
    rows = []
    if not args.paths_only:
        train = training_step(args.quick)
        rows = single_sizes(args.quick) + many_small(args.quick) + train
    paths = call_paths(args.quick)
    if COMM.rank == 0:
        text = report(rows, args.quick, load_start, paths)
        write_out(text, args.out)
    dist.destroy_process_group()
    rt.shutdown()
    _ROUND.Free()  # (MPICH warns at exit about persistent requests left)


if __name__ == "__main__":
    main()
