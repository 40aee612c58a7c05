"""The runtime across simulated hosts (a subset of tests/runtime): ranks on 2 hosts agree, fuse,
report errors and train as on one machine; the engine's rounds and phases ride MPI between hosts."""
import pytest
from tests.runtime.launch import check, run_cases

NUMPY = ["topology", "allreduce_every_op_dtype_shape", "async_handles", "fusion_of_hundreds_in_different_orders",
         "grouped_allreduce", "cached_signatures_in_different_orders", "allgather_ragged", "broadcast_from_every_root",
         "join_contributes_zeros", "lone_and_general_paths_mix"]
TRAIN = ["matches_single_process", "backward_passes_per_step_2", "broadcast_makes_diverged_ranks_identical"]
ERRORS = ["shape_mismatch", "stall_names_missing_rank_and_tensor", "stall_of_a_cached_op_names_missing_rank"]
SETS = ["sets_run_collectives_independently", "torch_distributed_optimizer_per_set"]


def hosts(cluster, spec):
    return ["--ssh-config", str(cluster.ssh_config), "-H", spec]


@pytest.fixture(scope="module")
def numpy_results(cluster, tmp_path_factory):
    # 4 ranks, 2 per host (shared memory inside a host, TCP between hosts)
    return run_cases("numpy_ops", 4, tmp_path_factory.mktemp("numpy_remote"),
                     env={"TRAINRUN_STALL_TIMEOUT": "20", "TRAINRUN_TEST_HOSTS": "2"},
                     timeout=240, hosts=hosts(cluster, "h1:2,h2:2"))


@pytest.fixture(scope="module")
def train_results(cluster, tmp_path_factory):
    return run_cases("torch_train", 2, tmp_path_factory.mktemp("train_remote"), env={"TRAINRUN_STALL_TIMEOUT": "20"},
                     timeout=240, hosts=hosts(cluster, "h2:1,h3:1"))


@pytest.fixture(scope="module")
def error_results(cluster, tmp_path_factory):
    return run_cases("errors", 2, tmp_path_factory.mktemp("errors_remote"), env={"TRAINRUN_STALL_TIMEOUT": "1"},
                     timeout=240, hosts=hosts(cluster, "h1:1,h3:1"))


@pytest.fixture(scope="module")
def set_results(cluster, tmp_path_factory):
    # the even and odd process sets each span both hosts
    return run_cases("process_sets", 4, tmp_path_factory.mktemp("sets_remote"), env={"TRAINRUN_STALL_TIMEOUT": "20"},
                     timeout=240, hosts=hosts(cluster, "h1:2,h3:2"))


@pytest.mark.parametrize("case", NUMPY)
def test_numpy_ops_on_two_hosts(numpy_results, case):
    check(numpy_results, case)


@pytest.mark.parametrize("case", TRAIN)
def test_training_on_two_hosts(train_results, case):
    check(train_results, case)


@pytest.mark.parametrize("case", ERRORS)
def test_errors_on_two_hosts(error_results, case):
    check(error_results, case)


@pytest.mark.parametrize("case", SETS)
def test_process_sets_across_hosts(set_results, case):
    check(set_results, case)
