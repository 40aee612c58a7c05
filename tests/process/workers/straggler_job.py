"""A small torch training loop under DistributedOptimizer for the straggler tests and benchmark: every
rank runs SECONDS_TO_RUN of steps; ranks listed in SLOW_RANKS (or every rank on a host named in
SLOW_HOSTS) sleep SLOW_S more per step, from SLOW_AFTER_S seconds on (printing 'slowing' then), in the
loader (SLOW_WHERE=loader: before the forward pass) or in compute (SLOW_WHERE=compute: between backward
and step, the default). STEP_S: every rank's own step time (a sleep standing for compute, so 4 ranks on
2 cores stay balanced). Prints 'started' after init and 'done N' at the end."""
import os
import socket
import time

import torch

import trainrun.torch as hvd

hvd.init()
rank = hvd.rank()
slow = str(rank) in os.environ.get("SLOW_RANKS", "").split(",") or \
    socket.gethostname() in os.environ.get("SLOW_HOSTS", "").split(",")
slow_s = float(os.environ.get("SLOW_S", "0.1")) if slow else 0.0
slow_after = float(os.environ.get("SLOW_AFTER_S", "0"))
where = os.environ.get("SLOW_WHERE", "compute")
step_s = float(os.environ.get("STEP_S", "0.02"))
seconds = float(os.environ.get("SECONDS_TO_RUN", "20"))

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(8, 16)
print("started", flush=True)
# every rank runs the same number of steps (rank 0 decides when to stop, a broadcast per 10 steps)
steps, begin = 0, time.monotonic()
end, slowing = begin + seconds, slow_s and not slow_after
while True:
    if steps % 10 == 0:
        go = hvd.broadcast(torch.tensor([1 if time.monotonic() < end else 0]), root_rank=0, name="go")
        if not go.item():
            break
    if slow_s and not slowing and time.monotonic() - begin >= slow_after:
        slowing = True
        print("slowing", flush=True)
    if where == "loader" and slowing:
        time.sleep(slow_s)
    opt.zero_grad()
    model(x).sum().backward()
    time.sleep(step_s)
    if where == "compute" and slowing:
        time.sleep(slow_s)
    opt.step()
    steps += 1
print(f"done {steps}", flush=True)
