"""A small torch model trained with hvd.elastic.TorchState, committing every COMMIT_EVERY steps.

Environment: STEPS (total), COMMIT_EVERY, STEP_PAUSE (seconds per step, so tests can act mid-run),
FAIL_AT="rank:step" (that rank exits 3 at that step, in the first attempt only).
Rank 0 prints `step S size N restart R` per step; `reset size N lr X` from the reset callback; at the end
every rank prints `final step S sha H commits C`.
"""
import hashlib
import os
import time

import torch

import trainrun.torch as hvd

STEPS = int(os.environ.get("STEPS", "40"))
COMMIT_EVERY = int(os.environ.get("COMMIT_EVERY", "5"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0.05"))
FAIL_AT = os.environ.get("FAIL_AT", "")
BASE_LR = 0.01

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(), momentum=0.9)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0, commits=0)


def on_reset():
    for group in opt.param_groups:
        group["lr"] = BASE_LR * hvd.size()
    if hvd.rank() == 0:
        print(f"reset size {hvd.size()} lr {opt.param_groups[0]['lr']:g}", flush=True)


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    restart = hvd.elastic.restart_count()
    fail_rank, _, fail_step = FAIL_AT.partition(":")
    while state.step < STEPS:
        if FAIL_AT and restart == 0 and hvd.rank() == int(fail_rank) and state.step == int(fail_step):
            print(f"failing at step {state.step}", file=__import__("sys").stderr, flush=True)
            os._exit(3)  # a crash (sys.exit would wait in MPI_Finalize for the others)
        g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        state.step += 1
        if hvd.rank() == 0:
            print(f"step {state.step} size {hvd.size()} restart {restart}", flush=True)
        if state.step % COMMIT_EVERY == 0:
            state.commits += 1
            state.commit()
        time.sleep(PAUSE)


train(state)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
print(f"final step {state.step} sha {hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]} commits {state.commits}",
      flush=True)
