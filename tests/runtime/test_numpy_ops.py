"""The NumPy API on 2 and 4 ranks, every case against a float64 reference (one launch per rank count)."""
import pytest

from tests.runtime.launch import check, run_cases

CASES = ["topology", "allreduce_every_op_dtype_shape", "allreduce_scaling", "allreduce_in_place_and_non_contiguous",
         "async_handles", "fusion_of_hundreds_in_different_orders", "grouped_allreduce",
         "grouped_allreduce_shapes_dtypes_scales", "grouped_allreduce_while_a_rank_has_joined",
         "cached_signatures_in_different_orders", "allgather_ragged",
         "broadcast_from_every_root", "alltoall_with_and_without_splits", "reducescatter_uneven",
         "objects_barrier", "join_contributes_zeros", "lone_and_general_paths_mix", "concurrent_threads",
         "argument_errors"]


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4"])
def results(request, tmp_path_factory):
    np_ = request.param
    # on 4 ranks also exercise a tiny fusion threshold (many fused batches) and the timeline
    env = {"TRAINRUN_STALL_TIMEOUT": "20"}
    if np_ == 4:
        env.update(TRAINRUN_FUSION_THRESHOLD="16384")
    return run_cases("numpy_ops", np_, tmp_path_factory.mktemp(f"numpy{np_}"), env=env, timeout=150)


@pytest.mark.parametrize("case", CASES)
def test_case(results, case):
    check(results, case)
