"""The examples a newcomer copies, run as a user would: examples/train_torch.py must converge at 8 and 16
ranks (here all local, oversubscribed on the machine's cores: the same MPI world and arithmetic as 4 hosts x 2)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.process.launch_helpers import base_env

pytest.importorskip("torch")

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_torch.py"


def epoch_losses(stdout: str) -> list[float]:
    return [float(line.split("loss ")[1].split()[0]) for line in stdout.splitlines() if ": loss " in line]


@pytest.mark.timeout(600)  # 16 ranks importing torch on 2 shared cores take a minute, more when loaded
@pytest.mark.parametrize("np", [8, pytest.param(16, marks=pytest.mark.slow)])
def test_train_torch_converges(run_trainrun, tmp_path, np):
    """With the learning rate scaled by the number of ranks and no warm-up (0.05 x 8 = 0.4 at once, momentum
    0.9) the loss went 2.23 -> 1.77 -> 2.70 -> 2.32 at 8 ranks; with the warm-up to N x a one-rank rate it
    must fall to well under its start and still be falling at the end."""
    r = run_trainrun("-np", np, "--oversubscribe", sys.executable, EXAMPLE, "--checkpoint", tmp_path / "ck.pt",
                     timeout=540, env=base_env(OMP_NUM_THREADS="1"))
    assert r.rc == 0, r.stderr[-3000:]
    assert f"{np} ranks, training on cpu" in r.stdout, r.stdout[-2000:]
    losses = epoch_losses(r.stdout)
    assert len(losses) == 5, r.stdout[-2000:]
    assert losses[-1] < 0.8 * losses[0], f"the loss did not fall enough at {np} ranks: {losses}"
    assert losses[-3] > losses[-2] > losses[-1], f"the loss rose near the end at {np} ranks: {losses}"
