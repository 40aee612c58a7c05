"""A torch TorchState job that shows whether a restarted rank started warm (tests/elastic/test_warm_ranks.py).

argv: TOKEN (the test's mark, also in the spares' command lines). Environment:
    WANT_SPARES   attempt 0 trains to step 10, then waits until this many spares of the job (processes named
                  trainrun-warm with TOKEN in their command line) are ready; rank 0 prints `spares ready`
    KILL_A_SPARE  rank 0 then SIGKILLs one of those spares (a spare that died while it waited)
    FAIL_RANK     that rank then exits 3 (a crash); without it attempt 0 trains on until the test acts
    RAISE_IF_WARM in a later attempt a rank that started warm raises ValueError (an uncaught exception)
    STEPS         the step a later attempt trains to (default 30)
A later attempt's every rank prints `who rank=R restart=N warm=W main=__name__ argv=... cwd=... path0=...
comm=... proc_rank=... resumed=STEP`, then `final step S` at the end. warm: torch was imported before this
script ran (a spare had imported it); proc_rank: TRAINRUN_RANK in /proc/self/environ.
"""
import os
import sys
import time

WARM = "torch" in sys.modules

import psutil  # noqa: E402
import torch  # noqa: E402

import trainrun.torch as hvd  # noqa: E402

TOKEN = sys.argv[1]
STEPS = int(os.environ.get("STEPS", "30"))


def spares() -> int:
    n = 0
    for p in psutil.process_iter(["name", "cmdline"]):
        if p.info["name"] == "trainrun-warm" and TOKEN in " ".join(p.info["cmdline"] or ()):
            n += 1
    return n


def wait_for_spares(want: int) -> None:
    deadline = time.monotonic() + 150
    while spares() < want:
        if time.monotonic() > deadline:
            print(f"only {spares()} of {want} spares after 150 s", file=sys.stderr, flush=True)
            os._exit(4)
        time.sleep(0.2)


def kill_a_spare() -> None:
    victim = min((p for p in psutil.process_iter(["name", "cmdline"])
                  if p.info["name"] == "trainrun-warm" and TOKEN in " ".join(p.info["cmdline"] or ())), key=lambda p: p.pid)
    victim.kill()
    while victim.is_running() and victim.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)


hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0)


@hvd.elastic.run
def train(state):
    restart = hvd.elastic.restart_count()
    if restart:
        with open("/proc/self/environ", "rb") as f:
            proc_env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        with open("/proc/self/comm") as f:
            comm = f.read().strip()
        print(f"who rank={hvd.rank()} restart={restart} warm={WARM} main={__name__} argv={sys.argv[1:]} "
              f"cwd={os.getcwd()} path0={sys.path[0]} comm={comm} proc_rank={proc_env.get(b'TRAINRUN_RANK', b'').decode()} "
              f"resumed={state.step}", flush=True)
        if WARM and os.environ.get("RAISE_IF_WARM"):
            raise ValueError(f"raised by warm rank {hvd.rank()}")
    while restart > 0 and state.step < STEPS or restart == 0:
        opt.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
        state.step += 1
        if state.step % 5 == 0:
            state.commit()
        if restart == 0 and state.step == 10:
            wait_for_spares(int(os.environ.get("WANT_SPARES", "0")))
            hvd.allreduce(torch.zeros(1), name="spares.seen")  # every rank saw them before one is killed
            if hvd.rank() == 0:
                print("spares ready", flush=True)
                if os.environ.get("KILL_A_SPARE"):
                    kill_a_spare()
            hvd.allreduce(torch.zeros(1), name="spare.killed")  # every rank goes on after it
            if os.environ.get("FAIL_RANK") == str(hvd.rank()):
                os._exit(3)
        time.sleep(0.05)
    print(f"final step {state.step}", flush=True)


train(state)
