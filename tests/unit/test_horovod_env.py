"""runtime/horovod_env.py: which TRAINRUN_*/HOROVOD_* variables set which runtime setting, and the notes
for the HOROVOD_* ones that have no effect. Pure."""
import math

import pytest

from trainrun.runtime.horovod_env import BUCKET_BYTES, CACHE_CAPACITY, FUSION_THRESHOLD, STALL_TIMEOUT, read


def test_defaults_without_variables():
    s = read({})
    assert (s.fusion_threshold, s.cache_capacity, s.stall_timeout, s.timeline_path, s.log_level, s.notes) == \
        (FUSION_THRESHOLD, CACHE_CAPACITY, STALL_TIMEOUT, None, "warning", ())
    assert FUSION_THRESHOLD == 64 * 1024 * 1024 and STALL_TIMEOUT == 60
    assert s.bucket_bytes == BUCKET_BYTES == 25 << 20


@pytest.mark.parametrize("value, cap", [("0", 0), (" 4096 ", 4096)])
def test_bucket_bytes(value, cap):
    """TRAINRUN_BUCKET_BYTES: torch DistributedOptimizer's gradient buckets (0: one allreduce per gradient);
    trainrun's own setting, no Horovod name."""
    assert read({"TRAINRUN_BUCKET_BYTES": value}).bucket_bytes == cap


def test_horovod_names_set_the_settings():
    s = read({"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_TIMELINE": "/t/tl.json",
              "HOROVOD_LOG_LEVEL": "INFO", "HOROVOD_STALL_CHECK_TIME_SECONDS": "7"})
    assert (s.fusion_threshold, s.cache_capacity, s.timeline_path, s.log_level, s.stall_timeout) == \
        (1048576, 0, "/t/tl.json", "info", 7.0)
    assert s.notes == () and s.verbose and not s.quiet


def test_trainrun_names_win_and_the_horovod_ones_are_noted():
    s = read({"TRAINRUN_FUSION_THRESHOLD": "10", "HOROVOD_FUSION_THRESHOLD": "20",
              "TRAINRUN_STALL_TIMEOUT": "5", "HOROVOD_STALL_CHECK_TIME_SECONDS": "9", "HOROVOD_STALL_CHECK_DISABLE": "1"})
    assert (s.fusion_threshold, s.stall_timeout) == (10, 5.0)
    assert s.notes == (
        "trainrun: HOROVOD_FUSION_THRESHOLD has no effect: TRAINRUN_FUSION_THRESHOLD is set and wins",
        "trainrun: HOROVOD_STALL_CHECK_DISABLE has no effect: TRAINRUN_STALL_TIMEOUT is set and wins",
        "trainrun: HOROVOD_STALL_CHECK_TIME_SECONDS has no effect: TRAINRUN_STALL_TIMEOUT is set and wins",
    )


@pytest.mark.parametrize("env, timeout", [
    ({"HOROVOD_STALL_CHECK_TIME_SECONDS": "3"}, 3.0),
    ({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"}, 30.0),
    ({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0", "HOROVOD_STALL_CHECK_TIME_SECONDS": "4"}, 4.0),  # 0: Horovod never shuts down
    ({"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "3"}, math.inf),
    ({"HOROVOD_STALL_CHECK_DISABLE": "0"}, STALL_TIMEOUT),
])
def test_stall_timeout_from_horovods_variables(env, timeout):
    assert read(env).stall_timeout == timeout


def test_a_stall_is_one_error_at_the_shutdown_time_when_both_are_set():
    s = read({"HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"})
    assert s.stall_timeout == 30
    assert s.notes == ("trainrun: HOROVOD_STALL_CHECK_TIME_SECONDS has no effect: a stall is one error here, raised at "
                       "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=30 (Horovod only warns at the check time)",)


def test_every_other_horovod_variable_is_named_once_with_why():
    s = read({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_CYCLE_TIME": "5", "HOROVOD_TIMELINE_MARK_CYCLES": "1",
              "HOROVOD_AUTOTUNE_LOG": "a.csv", "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_SOMETHING_NEW": "x",
              "HOROVOD_FUSION_THRESHOLD": "5", "PATH": "/bin"})
    assert [n.split(" has no effect: ")[0] for n in s.notes] == [
        "trainrun: HOROVOD_AUTOTUNE_LOG", "trainrun: HOROVOD_CYCLE_TIME", "trainrun: HOROVOD_HIERARCHICAL_ALLREDUCE",
        "trainrun: HOROVOD_SOMETHING_NEW", "trainrun: HOROVOD_TIMELINE_MARK_CYCLES", "trainrun: HOROVOD_WITH_PYTORCH"]
    why = dict(n[len("trainrun: "):].split(" has no effect: ") for n in s.notes)
    assert "no fixed cycle" in why["HOROVOD_CYCLE_TIME"]
    assert "build-time" in why["HOROVOD_WITH_PYTORCH"]
    assert why["HOROVOD_SOMETHING_NEW"] == "not a setting trainrun knows"


def test_operations_controller_elastic_and_place():
    quiet = {"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_CONTROLLER": "MPI",
             "HOROVOD_ELASTIC": "1", "TRAINRUN_ELASTIC": "1", "HOROVOD_RANK": "3", "TRAINRUN_RANK": "3"}
    assert read(quiet).notes == ()
    noisy = read({"HOROVOD_GPU_OPERATIONS": "ddl", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_ELASTIC": "1",
                  "HOROVOD_RANK": "1", "TRAINRUN_RANK": "0"}).notes
    assert [n.split(" has no effect")[0] for n in noisy] == [
        "trainrun: HOROVOD_GPU_OPERATIONS", "trainrun: HOROVOD_CPU_OPERATIONS", "trainrun: HOROVOD_ELASTIC",
        "trainrun: HOROVOD_RANK"]


def test_log_levels_and_dynamic_timeline():
    assert read({"HOROVOD_LOG_LEVEL": "error"}).quiet and not read({"HOROVOD_LOG_LEVEL": "warning"}).verbose
    assert read({"TRAINRUN_LOG_LEVEL": "debug", "HOROVOD_LOG_LEVEL": "fatal"}).log_level == "debug"
    bad = read({"HOROVOD_LOG_LEVEL": "loud"})
    assert bad.log_level == "warning" and bad.notes == (
        "trainrun: HOROVOD_LOG_LEVEL has no effect: 'loud' is not one of trace, debug, info, warning, error, fatal",)
    dyn = read({"HOROVOD_TIMELINE": "DYNAMIC"})
    assert dyn.timeline_path is None and "DYNAMIC" in dyn.notes[0]


@pytest.mark.parametrize("name, value", [("HOROVOD_FUSION_THRESHOLD", "64MB"), ("TRAINRUN_CACHE_CAPACITY", "-1"),
                                         ("HOROVOD_STALL_CHECK_TIME_SECONDS", "soon"), ("TRAINRUN_STALL_TIMEOUT", "nan"),
                                         ("TRAINRUN_BUCKET_BYTES", "lots"), ("TRAINRUN_BUCKET_BYTES", "1.5")])
def test_a_bad_number_names_its_variable(name, value):
    with pytest.raises(ValueError, match=f"{name}='{value}'"):
        read({name: value})


# ---- the settings read nowhere else on the rank side (issue 39): each one's default, values, bad values ----

def test_defaults_of_the_rank_sides_other_settings():
    s = read({})
    assert (s.gpu_operations, s.wait_mode, s.straggler, s.elastic, s.restart_count, s.host_updates, s.diag_fd,
            s.stacks_dir) == ("", "auto", True, False, 0, True, None, None)


@pytest.mark.parametrize("env, choice", [
    ({"TRAINRUN_GPU_OPERATIONS": "mpi"}, "mpi"),
    ({"TRAINRUN_GPU_OPERATIONS": " NCCL "}, "nccl"),
    ({"HOROVOD_GPU_OPERATIONS": "MPI"}, "mpi"),
    ({"HOROVOD_GPU_OPERATIONS": "nccl", "TRAINRUN_GPU_OPERATIONS": "mpi"}, "mpi"),  # trainrun's wins
    ({"HOROVOD_GPU_OPERATIONS": "mpi", "TRAINRUN_GPU_OPERATIONS": ""}, ""),  # set empty: the default (nccl if it loads)
    ({"HOROVOD_GPU_OPERATIONS": "ddl"}, ""),  # a Horovod build setting: noted, counts as unset
])
def test_gpu_operations(env, choice):
    assert read(env).gpu_operations == choice


@pytest.mark.parametrize("value, mode", [("spin", "spin"), (" Block ", "block"), ("", "auto")])
def test_wait_mode(value, mode):
    assert read({"TRAINRUN_WAIT": value}).wait_mode == mode


@pytest.mark.parametrize("value, on", [("0", False), ("1", True), ("off", False), ("Yes", True), ("", True)])
def test_straggler_flag(value, on):
    assert read({"TRAINRUN_STRAGGLER": value}).straggler is on


@pytest.mark.parametrize("env, elastic", [
    ({"TRAINRUN_ELASTIC": "1"}, True), ({"HOROVOD_ELASTIC": "1"}, True),  # Horovod's test: == '1'
    ({"TRAINRUN_ELASTIC": "0"}, False), ({"HOROVOD_ELASTIC": "true"}, False),
])
def test_elastic_flag(env, elastic):
    assert read(env).elastic is elastic


def test_the_launchers_elastic_and_diag_variables():
    s = read({"TRAINRUN_RESTART_COUNT": "3", "TRAINRUN_HOST_UPDATES": "0", "TRAINRUN_DIAG_FD": "5:1234",
              "TRAINRUN_STACKS_DIR": "/tmp/trainrun-stacks-j-h"})
    assert (s.restart_count, s.host_updates, s.diag_fd, s.stacks_dir) == (3, False, "5:1234", "/tmp/trainrun-stacks-j-h")
    assert s.notes == ()


@pytest.mark.parametrize("name, value", [("TRAINRUN_GPU_OPERATIONS", "ddl"), ("TRAINRUN_WAIT", "busy"),
                                         ("TRAINRUN_STRAGGLER", "maybe"), ("TRAINRUN_RESTART_COUNT", "-1"),
                                         ("TRAINRUN_RESTART_COUNT", "two"), ("TRAINRUN_HOST_UPDATES", "2")])
def test_a_bad_value_of_the_other_settings_names_its_variable(name, value):
    with pytest.raises(ValueError, match=f"{name}='{value}'"):
        read({name: value})


def test_the_no_effect_list_is_one_for_both_sides():
    """runtime/horovod_env.py and horovodrun/translate.py say the same verdicts, from horovod_no_effect.py."""
    from trainrun import horovod_no_effect
    from trainrun.horovodrun.translate import NO_MECHANISM, OPTION_VARS
    from trainrun.runtime import horovod_env

    assert horovod_env.NO_EFFECT is horovod_no_effect.NO_EFFECT
    assert not set(horovod_env.READ) & set(horovod_no_effect.NO_EFFECT)
    assert NO_MECHANISM["autotune"] == "no autotuner; set --fusion-threshold-mb yourself"
    note = read({"HOROVOD_AUTOTUNE": "1"}).notes[0]
    assert note == ("trainrun: HOROVOD_AUTOTUNE has no effect: no autotuner; set HOROVOD_FUSION_THRESHOLD (or "
                    "TRAINRUN_FUSION_THRESHOLD) yourself")
    for dest, why in NO_MECHANISM.items():
        assert horovod_no_effect.verdict(OPTION_VARS[dest]).why in why
