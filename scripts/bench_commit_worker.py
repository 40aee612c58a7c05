"""The rank of `scripts/bench_elastic.py`'s commit benchmark (run by trainrun -np 2 --max-restarts 1, so that
commit() takes the elastic path: local rank 0 writes the host's /dev/shm segment, the other rank keeps its
own copy; no elastic sizing, so the launcher sets TRAINRUN_HOST_UPDATES=0 and commit() runs no host-update
check: a job with --min-np/--host-discovery-script adds it, one broadcast per commit). For each size, a torch model of that many MiB (1 MiB Linear
layers) in a TorchState; rounds interleave, each call after a 50 ms pause (the training step between two
commits, in which the host-update check's broadcast started by one commit completes; every call starts with
caches as cold as the others'); before each commit's pause a barrier, as a training step's allreduce lines the
ranks up (without it, on a loaded machine, one rank drifts a round behind the other and the next commit's
host-update check waits for it, which is the peer's delay and not the commit's cost): commit(), a plain memcpy of the same
bytes (np.copyto into one warm buffer: cache-hot below the L3 size), the same memcpy into two buffers in turn
(the pattern of a segment's two slots), and the checksums alone (xxh3, crc32). Rank 0 prints one `cost` line
per size (medians, then the fastest commit and memcpy, then the median CPU time of this thread in commit() and
in the memcpy -- on a loaded machine the wall times include waits for a core; seconds)."""
import statistics
import sys
import time
import zlib

import numpy as np
import torch

import trainrun.runtime as hvd
import trainrun.torch.elastic as elastic
from trainrun.wire import shm_slot

ROUNDS = 15
hvd.init()
torch.set_num_threads(1)


CPU: dict[str, list[float]] = {"commit": [], "memcpy": []}


def timed(f, step=False, cpu=None) -> float:
    if step:
        hvd.barrier()  # the training step's allreduce lines the ranks up before each commit, as in training
    time.sleep(0.05)  # before every timed call alike: other processes run meanwhile (caches as cold for each)
    t, c = time.perf_counter(), time.thread_time()
    f()
    wall, used = time.perf_counter() - t, time.thread_time() - c
    if cpu is not None:  # this thread's CPU time alone: what the call costs without the waits for a core
        CPU[cpu].append(used)
    return wall


for mib in [int(x) for x in sys.argv[1].split(",")]:
    layers = [torch.nn.Linear(512, 512, bias=False) for _ in range(mib)]  # 1 MiB of float32 each
    model = torch.nn.Sequential(*layers)
    state = elastic.TorchState(model, None, step=0)
    src = np.random.default_rng(0).integers(0, 255, mib << 20, dtype=np.uint8)
    dst, pair = np.empty_like(src), (np.empty_like(src), np.empty_like(src))
    for i in range(2):  # warm: the segment made (or grown), both slots' pages touched; dst touched
        state.commit()
        np.copyto(dst, src)
        np.copyto(pair[i], src)
    commit, copy, copy2, xxh, crc = [], [], [], [], []
    for i in range(ROUNDS):
        with torch.no_grad():
            layers[0].weight.add_(1.0)  # the state changes between commits, as in training
        commit.append(timed(state.commit, step=True, cpu="commit"))
        copy.append(timed(lambda: np.copyto(dst, src), cpu="memcpy"))
        copy2.append(timed(lambda: np.copyto(pair[i % 2], src)))
        xxh.append(timed(lambda: shm_slot.checksum(src, shm_slot.XXH3)) if shm_slot.best_algorithm() == shm_slot.XXH3 else float("nan"))
        crc.append(timed(lambda: zlib.crc32(src)))
    if hvd.rank() == 0:
        med = statistics.median
        print(f"cost {mib} {med(commit)} {med(copy)} {med(copy2)} {med(xxh)} {med(crc)} {min(commit)} {min(copy)} "
              f"{med(CPU['commit'])} {med(CPU['memcpy'])}", flush=True)
    state = model = layers = src = dst = pair = None  # freed before the next size
    CPU["commit"], CPU["memcpy"] = [], []
