"""TensorFlow allreduce benchmark: trainrun.tensorflow vs trainrun's NumPy path vs raw mpi4py, 2 ranks.

    trainrun -np 2 python scripts/bench_tensorflow.py [--out FILE] [--quick]

Measures medians (rank 0) of one float32 allreduce, op Sum, 4 KiB .. 64 MiB, side by side: every
iteration runs each contender once, right after a barrier, so load bursts on a shared machine hit
them alike (tf.function in its own block after them: see rows_for). Contenders: hvd.allreduce of an eager CPU tensor (out of place, as TF ops are: one
copy into an aligned result buffer the tensor then adopts), the same inside a tf.function
(numpy_function; TF copies the result), the runtime's NumPy allreduce_ (in place) and allreduce (out
of place), and raw mpi4py Allreduce(IN_PLACE). Writes a markdown report (date, machine, load, the
table, the issue's targets met or not) to stdout, or to --out.
Not measured here (left for when the launcher sets TF_CONFIG): Keras fit under
MultiWorkerMirroredStrategy vs trainrun.
"""
import argparse
import os
import sys
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import trainrun.runtime as rt
import trainrun.tensorflow as hvd

COMM = MPI.COMM_WORLD
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/: bench_common
from bench_common import fmt_size, fmt_us, interleaved_medians_us, write_out  # noqa: E402
from bench_common import iters_for as _iters_for  # noqa: E402
TARGETS = []


def medians_us(fns, iters, warmup=3):
    """bench_common.interleaved_medians_us with every rank in step (MPI barrier)."""
    return interleaved_medians_us(fns, iters, COMM.Barrier, warmup)


def iters_for(nbytes, quick):
    return _iters_for(nbytes, quick, quick_min=5)


def rows_for(quick):
    rows = []
    for nbytes in [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]:
        x = np.ones(nbytes // 4, np.float32)
        raw_buf, np_buf, raw_out = x.copy(), x.copy(), np.empty_like(x)
        t = tf.constant(x)
        graph = tf.function(lambda v: hvd.allreduce(v, op=hvd.Sum, name="bench.graph"))
        graph(t)  # trace outside the timing
        it = iters_for(nbytes, quick)
        tf_eager, np_in, np_out, raw, raw_oop = medians_us([
            lambda: hvd.allreduce(t, op=hvd.Sum, name="bench.tf"),
            lambda: rt.allreduce_(np_buf, name="bench.np_", op=rt.Sum),
            lambda: rt.allreduce(x, name="bench.np", op=rt.Sum),
            lambda: COMM.Allreduce(MPI.IN_PLACE, raw_buf),
            lambda: COMM.Allreduce(x, raw_out)], it)
        # tf.function in its own block: running its graph leaves TF's executor threads spinning for a
        # while, which on 2 cores slowed whatever ran next (every other contender, raw MPI included, by
        # up to 3x at 4 KiB when interleaved)
        (tf_graph,) = medians_us([lambda: graph(t)], it)
        time.sleep(0.05)  # (and they settle before the next size's block)
        if nbytes == 4 << 10:
            TARGETS.append(("4 KiB: TF eager allreduce <= 3x raw mpi4py", f"{tf_eager / raw:.1f}x", tf_eager <= 3 * raw))
        if nbytes >= 1 << 20:
            TARGETS.append((f"{fmt_size(nbytes)}: TF eager allreduce >= 0.9x raw mpi4py bandwidth",
                            f"{raw / tf_eager:.2f}x", raw / tf_eager >= 0.9))
        times = (tf_eager, tf_graph, np_in, np_out, raw, raw_oop)
        rows.append((fmt_size(nbytes), *map(fmt_us, times), f"{tf_eager / raw:.2f}x", f"{tf_eager / raw_oop:.2f}x",
                     f"{tf_graph / raw:.2f}x", f"{np_in / raw:.2f}x", str(it)))
    return rows


def report(rows, quick, load_start) -> str:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_common  # scripts/: the machine lines shared by the benchmarks

    launcher = "trainrun" if "TRAINRUN_RANK" in os.environ else "mpiexec"
    mpi = " ".join(MPI.Get_library_version().splitlines()[0].split())
    lines = ["# TensorFlow allreduce: trainrun.tensorflow vs NumPy path vs raw mpi4py", ""] + bench_common.machine_lines()
    lines += [f"- TensorFlow {tf.__version__} (CPU); MPI library: {mpi}",
              f"- load average (1 min) at start / end: {load_start:.1f} / {os.getloadavg()[0]:.1f} "
              "(a shared 2-vCPU box inflates every row)",
              f"- method: {COMM.size} ranks started by {launcher}, float32, op Sum, medians on rank 0; every iteration "
              "runs each contender once, right after a barrier, tf.function in its own block after the others (its "
              "executor threads keep spinning after a call and slowed whatever ran next) (`scripts/bench_tensorflow.py"
              + (" --quick" if quick else "") + "`)",
              "- TF eager: `hvd.allreduce(tensor)` on an eager CPU tensor (out of place: MPI reads the tensor's buffer "
              "and writes a pooled 64-byte-aligned one that the result tensor adopts through DLPack); TF tf.function: the same op "
              "inside `tf.function` (a numpy_function node; TF copies its result); NumPy `allreduce_`: in place; "
              "NumPy `allreduce`: out of place; raw: `COMM.Allreduce(MPI.IN_PLACE, buf)` (the targets' reference); "
              "raw out of place: `COMM.Allreduce(x, out)` into a preallocated `out`", ""]
    head = ("| size | TF eager | TF tf.function | NumPy allreduce_ | NumPy allreduce | raw mpi4py | raw out of place | "
            "TF eager / raw | TF eager / raw out of place | tf.function / raw | NumPy_ / raw | iterations |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    table = head + "".join("| " + " | ".join(r) + " |\n" for r in rows)
    targets = ("\n## Targets (issue 12)\n\n| target | measured | met |\n|---|---:|---|\n"
               + "".join(f"| {t} | {m} | {'yes' if ok else 'no'} |\n" for t, m, ok in TARGETS))
    return "\n".join(lines) + "\n" + table + targets


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the report to this markdown file (rank 0); none by default: "
                        "docs/benchmarks/tensorflow.md is a record of dated runs with notes, not to be overwritten")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    rows = rows_for(args.quick)
    if COMM.rank == 0:
        text = report(rows, args.quick, load_start)
        write_out(text, args.out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
