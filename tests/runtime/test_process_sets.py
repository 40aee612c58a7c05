"""Process sets on 4 ranks (one launch): independent sets, clear errors, removal, per-set training."""
import pytest

from tests.runtime.launch import check, run_cases

CASES = ["sets_run_collectives_independently", "misuse_is_a_clear_error", "remove_and_add_again",
         "torch_distributed_optimizer_per_set", "init_with_process_sets"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_cases("process_sets", 4, tmp_path_factory.mktemp("process_sets"), env={"TRAINRUN_STALL_TIMEOUT": "20"},
                     timeout=180)


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)
