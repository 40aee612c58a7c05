"""TensorFlow on 2 ranks: the API cases (one launch) and the four Horovod program shapes of
examples/tensorflow (identical weights on every rank, a falling loss)."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.runtime.launch import check, run_ranks

# found, not imported: the ranks import TensorFlow, this process need not
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

HERE = Path(__file__).parent
EXAMPLES = HERE.parents[1] / "examples" / "tensorflow"
ENV = {"TRAINRUN_STALL_TIMEOUT": "30", "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
CASES = ["ops_eager", "eager_results_keep_their_values", "ops_in_tf_function", "ops_in_tf1_graph", "indexed_slices_are_gathered",
         "gradients_eager_and_graph", "broadcast_variables_and_objects",
         "gradient_tape_in_tf_function_matches_single_process", "tf1_distributed_optimizer_matches_single_process",
         "tf_keras_fit_with_tf_data_matches_single_process", "keras_on_tensorflow_backend_fit_and_load_model",
         "keras_optimizer_errors", "keras_fit_accumulates_passes_in_graph", "tf1_backward_passes_per_step"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf")
    proc = run_ranks(HERE / "workers" / "tf_cases.py", 2, [str(out)], env=ENV, timeout=240)
    res = {}
    for r in range(2):
        path = out / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no results (rc={proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        for name, err in json.loads(path.read_text()).items():
            res.setdefault(name, []).append(err)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return res


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)


def run_example(tmp_path, script, *args, env=None):
    """Run an example on 2 ranks; its per-rank reports (losses, weight digest)."""
    report = tmp_path / "report"
    proc = run_ranks(EXAMPLES / script, 2, [*args, "--report", str(report)], env={**ENV, **(env or {})},
                     timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads((tmp_path / f"report.rank{r}.json").read_text()) for r in range(2)]


def assert_trained_alike(reports, window=1):
    assert reports[0]["weights"] == reports[1]["weights"], "ranks ended with different weights"
    losses = reports[0]["losses"]
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    assert last < first, losses


def test_example_tf1_graph(tmp_path):
    reports = run_example(tmp_path, "tensorflow1_mnist.py", "--steps", "40", "--checkpoint-dir", str(tmp_path / "ck"))
    assert_trained_alike(reports, window=5)
    assert (tmp_path / "ck" / "checkpoint").exists()  # rank 0 saved


def test_example_tf2_keras(tmp_path):
    reports = run_example(tmp_path, "tensorflow2_keras_mnist.py", "--epochs", "2", "--steps", "40",
                          "--checkpoint-dir", str(tmp_path / "ck"))
    assert_trained_alike(reports)
    assert (tmp_path / "ck" / "checkpoint-2.keras").exists()


def test_example_tf2_keras_on_tf_keras(tmp_path):
    """The same program on Keras 2 (tf-keras), as a program written for Horovod's era selects it."""
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf-keras not installed: pip install 'trainrun[tensorflow]'")
    reports = run_example(tmp_path, "tensorflow2_keras_mnist.py", "--epochs", "2", "--steps", "40",
                          "--checkpoint-dir", str(tmp_path / "ck"), env={"TF_USE_LEGACY_KERAS": "1"})
    assert_trained_alike(reports)
    assert (tmp_path / "ck" / "checkpoint-2.h5").exists()


def test_tf_keras_optimizers_with_backward_passes_in_fit(tmp_path):
    """tf-keras (Keras 2): legacy and new optimizers, backward_passes_per_step 1 and 2 in fit's graph."""
    proc = run_ranks(HERE / "workers" / "tf_keras_passes.py", 2, [str(tmp_path)],
                     env={**ENV, "TF_USE_LEGACY_KERAS": "1"}, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for r in range(2):
        errors = {k: v for k, v in json.loads((tmp_path / f"rank{r}.json").read_text()).items() if v}
        assert not errors, f"rank {r}: {errors}"


def test_multi_worker_mirrored_strategy_runs_under_trainrun(tmp_path):
    """TensorFlow's own MultiWorkerMirroredStrategy reads the TF_CONFIG trainrun sets (every worker's address and a
    free port, task index = rank): 2 workers train as one (same loss, same weights)."""
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf-keras not installed: pip install --no-deps tf-keras==2.21.0")
    proc = run_ranks(EXAMPLES / "mwms_keras.py", 2, ["--steps", "8"], env={**ENV, "TF_USE_LEGACY_KERAS": "1"},
                     timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = sorted(line.split("worker ", 1)[1] for line in proc.stdout.splitlines() if "worker " in line and " of " in line)
    assert [r.split()[0] for r in rows] == ["0", "1"] and all(" of 2:" in r for r in rows), proc.stdout
    assert len({r.split(":", 1)[1] for r in rows}) == 1, rows  # the same loss and weights on both workers


def test_example_keras_numpy(tmp_path):
    reports = run_example(tmp_path, "keras_mnist.py", "--epochs", "2", "--steps", "20",
                          "--checkpoint", str(tmp_path / "ck.keras"))
    assert_trained_alike(reports)


def test_example_tf2_custom_loop(tmp_path):
    reports = run_example(tmp_path, "tensorflow2_mnist.py", "--steps", "40")
    assert_trained_alike(reports, window=5)


def test_launcher_never_imports_tensorflow():
    """`trainrun` (the launcher and its CLI) must not pay TensorFlow's import."""
    import subprocess
    import sys
    code = ("import sys, trainrun, trainrun.cli, trainrun.runtime; "
            "heavy = [m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules]; "
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
