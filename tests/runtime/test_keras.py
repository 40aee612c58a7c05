"""trainrun.keras (Keras 3, torch backend) on 2 ranks: training, callbacks, ops (one launch)."""
import pytest

from tests.runtime.launch import check, run_cases

CASES = ["fit_matches_single_process", "backward_passes_per_step_2", "fp16_compression", "learning_rate_warmup",
         "ops_on_keras_values", "optimizer_errors", "partial_distributed_optimizer_keeps_local_layers_local"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    # the CPU path: on a GPU host Keras' torch backend would put both ranks' variables on GPU 0, which NCCL
    # refuses (tests/runtime/test_gpu.py covers CUDA tensors)
    return run_cases("keras_train", 2, tmp_path_factory.mktemp("keras"),
                     env={"TRAINRUN_STALL_TIMEOUT": "20", "KERAS_BACKEND": "torch", "CUDA_VISIBLE_DEVICES": ""},
                     timeout=240)


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)


def test_example_trains(tmp_path):
    from pathlib import Path

    from tests.runtime.launch import run_ranks
    example = Path(__file__).parents[2] / "examples" / "train_keras.py"
    ckpt = tmp_path / "model.keras"
    proc = run_ranks(example, 2, ["--epochs", "3", "--samples", "1024", "--checkpoint", str(ckpt)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "epoch " in line]  # the launcher may prefix "[0]"
    assert len(lines) == 3 and ckpt.exists(), proc.stdout  # printed and saved by rank 0 only
    assert "on the torch backend" in proc.stdout, proc.stdout  # as its docstring says (it imports trainrun.keras first)
    losses = [float(line.split("loss ")[1].split()[0]) for line in lines]
    assert losses[-1] < losses[0], losses  # it learns
