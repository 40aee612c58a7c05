"""torch across containers (image trainrun-node:torch, the local CPU wheel), 6 ranks on 3 nodes:
trainrun from the host training with trainrun.torch's DistributedOptimizer, and a plain torch.distributed
(gloo, started by mpiexec from node1) baseline. Opt-in: TRAINRUN_DOCKER_TORCH=1 (the torch image costs
~45-90 s to build cold and is 1.3 GB)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(os.environ.get("TRAINRUN_DOCKER_TORCH") != "1",
                                 reason="set TRAINRUN_DOCKER_TORCH=1 to build/run the torch node image")]

NAME = f"pytest-torch-{os.getpid()}"

TRAIN = """
import socket, torch
import trainrun.torch as hvd
hvd.init()
torch.manual_seed(1000 + hvd.rank())          # different data (and initial weights) on every rank
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
hvd.broadcast_optimizer_state(opt, root_rank=0)
w_true = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
first = None
for step in range(30):
    x = torch.randn(32, 8)
    loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
    opt.zero_grad()
    loss.backward()
    opt.step()
    first = float(loss) if first is None else first
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = hvd.allgather(flat.unsqueeze(0))
same = all(torch.equal(every[0], every[i]) for i in range(hvd.size()))
print("RESULT", hvd.rank(), hvd.size(), socket.gethostname(), same, first, float(loss), flush=True)
"""

GLOO = """
import os, socket, torch, torch.distributed as dist
rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
dist.init_process_group("gloo", init_method="tcp://node1:29500", rank=rank, world_size=size)
t = torch.full((1 << 16,), float(rank + 1))
dist.all_reduce(t)
print("RESULT", rank, size, socket.gethostname(), float(t[0]), flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def torch_cluster(engine, cc, tmp_path_factory):
    state = tmp_path_factory.mktemp("torch") / NAME
    info = cc.up(3, name=NAME, state_dir=state, slots=2, with_torch=True)
    yield info
    cc.down(NAME, state)
    assert cc.leftovers(cc.project_name(NAME)) == {"containers": [], "networks": [], "volumes": []}


def test_distributed_optimizer_training_from_the_host(torch_cluster, trainrun_cmd, trainrun_env):
    t0 = time.monotonic()
    r = subprocess.run(trainrun_cmd(torch_cluster, "-np", "6", "python3", "-c", TRAIN),
                       capture_output=True, text=True, timeout=600, cwd="/tmp", env=trainrun_env)
    print(f"\nDistributedOptimizer training, 6 ranks on 3 nodes: {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [ln.split("RESULT", 1)[1].split() for ln in r.stdout.splitlines() if "RESULT" in ln]
    assert sorted(int(x[0]) for x in rows) == list(range(6)), r.stdout
    assert {x[2] for x in rows} == {"node1", "node2", "node3"}
    assert all(x[3] == "True" for x in rows), "weights differ between ranks after DistributedOptimizer steps"
    assert all(float(x[5]) < float(x[4]) for x in rows), "loss did not go down"


def test_torch_gloo_baseline_from_node1(torch_cluster):
    r = subprocess.run(["docker", "exec", torch_cluster.nodes[0].container, "mpiexec", "-launcher", "ssh", "-f",
                        "/keys/hosts.mpich", "-n", "6", "python", "-c", GLOO],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(rows) == 6 and all(float(x[4]) == 21.0 for x in rows), rows
    assert {x[3] for x in rows} == {"node1", "node2", "node3"}
