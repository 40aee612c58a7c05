"""Splitting `trainrun --sbatch ...` into sbatch's options, trainrun's and the submission's own --wait (pure)."""
import pytest

from trainrun.slurm.submit import split_argv

OPTIONS = {"-np": True, "--num-proc": True, "-H": True, "--grace": True, "--wait": False, "--dry-run": False}


@pytest.mark.parametrize("argv, sbatch, trainrun, wait", [
    (["-N", "3", "-np", "6", "train.py"], ["-N", "3"], ["-np", "6", "train.py"], False),
    (["-N", "3", "--time=10", "--wait", "-np", "6", "t.py", "--wait"], ["-N", "3", "--time=10"], ["-np", "6", "t.py", "--wait"], True),
    (["-N3", "--", "train.py", "-np", "2"], ["-N3"], ["train.py", "-np", "2"], False),
    (["--partition", "gpu", "--grace=5", "--wait", "t.py"], ["--partition", "gpu"], ["--grace=5", "t.py"], True),
    (["-N", "2", "--grace", "5", "--wait", "t.py"], ["-N", "2"], ["--grace", "5", "t.py"], True),
    ([], [], [], False),
])
def test_split(argv, sbatch, trainrun, wait):
    sub = split_argv(argv, OPTIONS)
    assert (list(sub.sbatch_options), list(sub.trainrun_args), sub.wait) == (sbatch, trainrun, wait)
