"""The training script scripts/bench_elastic.py times, in two flavours of the same model and loop:

    MODE=trainrun   hvd.elastic.TorchState, commit() every COMMIT_EVERY steps (state kept by the agents)
    MODE=torchrun   torch.distributed (gloo) allreduce of the gradients; rank 0 saves a disk checkpoint
                    every COMMIT_EVERY steps; every start loads it (torchrun --max-restarts restarts all)

Rank 0 prints `step S size N restart R t=UNIX_TIME` after every step (STEPS in all, STEP_PAUSE s apart);
with PHASES=1 (trainrun) also `phases restart R start=T script=T imported=T world=T built=T synced=T` before its first
step: when the process started (a warm rank: when it was handed the rank), its script began, `import torch` ended, the MPI world was up, the optimizer
and state were built, sync() ended.
"""
import os
import time


def _started() -> float:
    """This process's start (UNIX time), from /proc: the interpreter's own start-up counts."""
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    uptime = float(open("/proc/uptime").read().split()[0])  # btime is whole seconds; uptime has 10 ms
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


# PHASES=1: rank 0 prints when each start-up phase ended. A warm rank (trainrun --warm-ranks: a spare that had
# imported torch before the restart, elasticjob/spares.py) starts when its script does: the hand-off.
_WARM = "torch" in __import__("sys").modules
PHASES = {"start": time.time() if _WARM else _started(), "script": time.time()}

import torch  # noqa: E402

PHASES["imported"] = time.time()

MODE = os.environ.get("MODE", "trainrun")
STEPS = int(os.environ.get("STEPS", "200"))
COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "5"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0.1"))
CKPT = os.environ.get("CKPT", "/tmp/bench_elastic_ckpt.pt")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def batch(step, rank):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)


def report(step, size, restart):
    print(f"step {step} size {size} restart {restart} t={time.time():.3f}", flush=True)


if MODE == "trainrun":
    import trainrun.torch as hvd

    hvd.init()
    PHASES["world"] = time.time()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    PHASES["built"] = time.time()  # DistributedOptimizer and TorchState made

    @hvd.elastic.run
    def train(state):
        restart = hvd.elastic.restart_count()
        PHASES["synced"] = time.time()
        if os.environ.get("PHASES") and (hvd.rank() == 0 or os.environ.get("PHASES") == "all"):
            print("phases restart %d %s" % (restart, " ".join(f"{k}={v:.3f}" for k, v in PHASES.items())), flush=True)
        while state.step < STEPS:
            x, y = batch(state.step, hvd.rank())
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            state.step += 1
            if hvd.rank() == 0:
                report(state.step, hvd.size(), restart)
            if state.step % COMMIT_EVERY == 0:
                state.commit()
            time.sleep(PAUSE)

    train(state)
else:
    import torch.distributed as dist

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # one key prefix per restart in torchrun's store: with torch 2.13 a plain init_process_group("gloo") after
    # a restart finds the previous attempt's addresses and fails (connectFullMesh: connection refused)
    store = dist.PrefixStore(f"attempt{restart}/", dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                                                 is_master=False))
    dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    rank, size = dist.get_rank(), dist.get_world_size()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if os.path.exists(CKPT):
        ck = torch.load(CKPT, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
    while step < STEPS:
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= size
        opt.step()
        step += 1
        if rank == 0:
            report(step, size, restart)
            if step % COMMIT_EVERY == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, CKPT + ".tmp")
                os.replace(CKPT + ".tmp", CKPT)
        time.sleep(PAUSE)
    dist.destroy_process_group()
