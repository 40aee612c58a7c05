"""Horovod 0.28's torch API on trainrun: every public name, the API gaps (workers/torch_api.py) on
2, 3 and 4 ranks (odd sizes matter for reducescatter), and the conformance matrix (workers/torch_matrix.py)."""
import pytest

from tests.runtime.launch import check, run_cases

torch = pytest.importorskip("torch")

API = ["grouped_allgather_and_reducescatter", "float16_prescale_rounds_as_horovod", "sparse_allreduce_async_direct",
       "sparse_gradients_both_ways", "broadcast_optimizer_state_every_class", "broadcast_parameters_without_grad",
       "join_with_allgather_and_broadcast", "collective_gradients_follow_horovod",
       "optimizer_on_disjoint_process_sets", "sync_batch_norm_matches_global_batch_norm",
       "adasum_any_world_size", "adasum_optimizer_combines_deltas", "build_probes_tell_the_truth",
       "optimizer_on_a_set_without_this_rank_trains_locally", "sparse_as_dense_hands_sparse_adam_sparse_gradients",
       "broadcast_optimizer_state_leaves_zero_gradients", "reducescatter_adasum_raises_horovods_error_type"]
MATRIX = ["matrix_allreduce", "matrix_grouped_allreduce_and_scales", "matrix_gather_broadcast_alltoall_reducescatter",
          "matrix_autograd"]

# horovod/torch/__init__.py of Horovod 0.28: every name it exports
HOROVOD_TORCH = """elastic Compression allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async grouped_allreduce_
grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async grouped_allgather grouped_allgather_async
broadcast broadcast_async broadcast_ broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
grouped_reducescatter grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized
start_timeline stop_timeline size local_size cross_size rank local_rank cross_rank mpi_threads_supported mpi_enabled
mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built cuda_built rocm_built ProcessSet global_process_set
add_process_set remove_process_set Average Sum Adasum Min Max Product HorovodInternalError DistributedOptimizer
SyncBatchNorm""".split()


@pytest.mark.parametrize("name", HOROVOD_TORCH)
def test_every_horovod_torch_name_exists(name):
    import trainrun.torch as hvd
    if name == "elastic":
        try:
            hvd.elastic
        except AttributeError as e:
            pytest.skip(f"hvd.elastic comes with trainrun.torch.elastic (the elastic work): {e}")
        return
    assert hasattr(hvd, name), name


@pytest.mark.parametrize("name", ["start_timeline", "stop_timeline"])
def test_unsupported_names_say_why(name):
    import trainrun.torch as hvd
    with pytest.raises(NotImplementedError, match="TRAINRUN_TIMELINE"):
        getattr(hvd, name)("/tmp/t.json") if name == "start_timeline" else getattr(hvd, name)()


@pytest.fixture(scope="module", params=[2, 3, 4])
def api_results(request, tmp_path_factory):
    return run_cases("torch_api", request.param, tmp_path_factory.mktemp(f"torch_api{request.param}"),
                     env={"TRAINRUN_STALL_TIMEOUT": "20"}, timeout=300)


@pytest.mark.parametrize("case", API + MATRIX)
def test_api(api_results, case):
    check(api_results, case)


def test_a_rank_raising_mid_sequence_fails_the_others_fast(tmp_path):
    """Rank 1 fails an assertion between collectives while the others have async ops in flight and
    then block: they get HorovodInternalError naming rank 1 within seconds, not a hang or a stall."""
    from tests.runtime.launch import run_ranks
    script = tmp_path / "raise.py"
    script.write_text(
        "import time, torch, trainrun.torch as hvd\n"
        "hvd.init()\n"
        "for i in range(3):\n"
        "    hvd.allreduce(torch.ones(4), name=f'step{i}')\n"
        "if hvd.rank() == 1:\n"
        "    assert False, 'user assertion on rank 1'\n"
        "t0 = time.monotonic()\n"
        "hs = [hvd.allreduce_async(torch.ones(4)) for _ in range(3)]\n"
        "try:\n"
        "    hvd.allgather(torch.ones(2))\n"
        "    [hvd.synchronize(h) for h in hs]\n"
        "except hvd.HorovodInternalError as e:\n"
        "    print(f'rank {hvd.rank()} failed after {time.monotonic() - t0:.1f}s: {e}', flush=True)\n")
    proc = run_ranks(script, 3, env={"TRAINRUN_STALL_TIMEOUT": "60"}, timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert "user assertion on rank 1" in proc.stderr
    lines = [line for line in proc.stdout.splitlines() if " failed after " in line]
    assert len(lines) == 2 and all("rank 1" in line.split(": ", 1)[1] for line in lines), proc.stdout
    assert all(float(line.split(" failed after ")[1].split("s:")[0]) < 20 for line in lines), lines
