"""horovodrun's options, each one's behaviour: done (the trainrun argv / HOROVOD_* variables it becomes),
noted (accepted, one line saying why it has no effect) or refused (UsageError, exit 2).
test_every_option_has_a_case fails when an option of the parser has no case here."""
import pytest

from trainrun.errors import UsageError
from trainrun.horovodrun.options import build_parser
from trainrun.horovodrun.translate import translate

CMD = ["python", "train.py"]
EL = ["-np", "2", "-H", "a:2,b:2", "--min-np", "1"]  # an elastic job (horovodrun: --min-np or a discovery script)


def run(*args, environ=None):
    return translate([*args, *CMD], environ or {})


def has(seq, *part):
    """`part` appears in `seq` as consecutive items."""
    n = len(part)
    return any(tuple(seq[i:i + n]) == part for i in range(len(seq) - n + 1))


# (horovodrun options, trainrun argv items that must appear, consecutively)
DONE = [
    (["-np", "4"], ["-np", "4"]),
    (["--num-proc", "4"], ["-np", "4"]),
    (["-H", "a:2,b:2"], ["-H", "a:2,b:2"]),
    (["--hosts", "a:2"], ["-H", "a:2"]),
    (["-hostfile", "hf"], ["--hostfile", "hf"]),
    (["--hostfile", "hf"], ["--hostfile", "hf"]),
    (["-p", "2222"], ["-p", "2222"]),
    (["--ssh-port", "2222"], ["-p", "2222"]),
    (["-i", "key"], ["-i", "key"]),
    (["--ssh-identity-file", "key"], ["-i", "key"]),
    (["--network-interfaces", "eth0,eth1"], ["--network-interface", "eth0,eth1"]),
    (["--network-interface", "eth0", "--network-interface", "eth1"], ["--network-interface", "eth0,eth1"]),
    (["--disable-cache"], ["--no-cache"]),
    (["--start-timeout", "30"], ["--start-timeout", "30"]),
    (["--output-filename", "logs"], ["--output-dir", "logs"]),
    (["--verbose"], ["-v"]),
    (["--mpi"], ["--prefix", "mpi"]),
    ([], ["--prefix", "mpi"]),
    (["--prefix-output-with-timestamp"], ["--prefix", "mpi-timestamp"]),
    (["-prefix-timestamp"], ["--prefix", "mpi-timestamp"]),
    (["--fusion-threshold-mb", "32"], ["-x", "HOROVOD_FUSION_THRESHOLD=33554432"]),
    (["--cache-capacity", "0"], ["-x", "HOROVOD_CACHE_CAPACITY=0"]),
    (["--timeline-filename", "t.json"], ["-x", "HOROVOD_TIMELINE=t.json"]),
    (["--no-stall-check"], ["-x", "HOROVOD_STALL_CHECK_DISABLE=1"]),
    (["--stall-check"], ["-x", "HOROVOD_STALL_CHECK_DISABLE=0"]),
    (["--stall-check-warning-time-seconds", "10"], ["-x", "HOROVOD_STALL_CHECK_TIME_SECONDS=10"]),
    (["--stall-check-shutdown-time-seconds", "20"], ["-x", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=20"]),
    (["--log-level", "DEBUG"], ["-x", "HOROVOD_LOG_LEVEL=DEBUG"]),
    (["--tcp"], ["-x", "NCCL_IB_DISABLE=1", "-x", "UCX_TLS=tcp,sm,self"]),
    (["--mpi-args=-x FOO=1 --oversubscribe --bind-to core"], ["-x", "FOO=1", "--oversubscribe", "--bind-to", "core"]),
    (["--binding-args=--bind-to core"], ["--bind-to", "core"]),
    ([*EL], ["--min-np", "1"]),
    (["-np", "2", "-H", "a:2,b:2", "--min-num-proc", "1"], ["--min-np", "1"]),
    ([*EL, "--max-np", "8"], ["--max-np", "8"]),
    ([*EL, "--max-num-proc", "8"], ["--max-np", "8"]),
    ([*EL, "--elastic-timeout", "60"], ["--elastic-timeout", "60"]),
    ([*EL, "--reset-limit", "3"], ["--max-restarts", "3"]),
    ([*EL, "--blacklist-cooldown-range", "10", "100"], ["--blacklist-cooldown-range", "10", "100"]),
    (["-np", "2", "--host-discovery-script", "d.sh"], ["--min-np", "2", "--host-discovery-script", "d.sh"]),
]


@pytest.mark.parametrize("opts,expect", DONE, ids=[" ".join(o) or "(none)" for o, _ in DONE])
def test_done(opts, expect):
    t = run(*opts)
    assert t.action == "run" and has(t.argv, *expect), t.argv
    assert t.argv[-3:] == ("--", *CMD)
    assert not t.notes, t.notes


# (horovodrun options, a fragment of the one note it must print)
NOTED = [
    (["--gloo"], "--gloo: the ranks run in trainrun's MPI world"),
    (["--cycle-time-ms", "3.5"], "--cycle-time-ms has no effect: trainrun has no fixed cycle"),
    (["--timeline-filename", "t.json", "--timeline-mark-cycles"], "--timeline-mark-cycles has no effect"),
    (["--timeline-filename", "t.json", "--no-timeline-mark-cycles"], "--timeline-mark-cycles has no effect"),
    (["--hierarchical-allreduce"], "--hierarchical-allreduce has no effect: no two-level allreduce"),
    (["--no-hierarchical-allreduce"], "--hierarchical-allreduce has no effect"),
    (["--hierarchical-allgather"], "--hierarchical-allgather has no effect: no two-level allgather"),
    (["--no-hierarchical-allgather"], "--hierarchical-allgather has no effect"),
    (["--autotune"], "--autotune has no effect: no autotuner"),
    (["--no-autotune"], "--autotune has no effect"),
    (["--autotune-log-file", "a.csv"], "--autotune-log-file has no effect"),
    (["--autotune-warmup-samples", "3"], "--autotune-warmup-samples has no effect"),
    (["--autotune-steps-per-sample", "10"], "--autotune-steps-per-sample has no effect"),
    (["--autotune-bayes-opt-max-samples", "20"], "--autotune-bayes-opt-max-samples has no effect"),
    (["--autotune-gaussian-process-noise", "0.8"], "--autotune-gaussian-process-noise has no effect"),
    (["--mpi-threads-disable"], "--mpi-threads-disable has no effect"),
    (["--no-mpi-threads-disable"], "--mpi-threads-disable has no effect"),
    (["--num-nccl-streams", "2"], "--num-nccl-streams has no effect"),
    (["--thread-affinity", "1"], "--thread-affinity has no effect"),
    (["--gloo-timeout-seconds", "30"], "--gloo-timeout-seconds has no effect: no Gloo"),
    (["--log-with-timestamp"], "--log-with-timestamp has no effect"),
    (["--log-without-timestamp"], "--log-with-timestamp has no effect"),
    (["--log-hide-timestamp"], "--log-with-timestamp has no effect"),
    (["--no-log-hide-timestamp"], "--log-with-timestamp has no effect"),
    (["--mpi-args=--map-by ppr:6:node -x A=1"], "--mpi-args: --map-by ppr:6:node has no effect: trainrun starts the ranks itself"),
    (["--binding-args=--rankfile rf"], "--binding-args: --rankfile rf has no effect"),
    (["--max-np", "8"], "--max-np has no effect: the job is not elastic"),
    (["--max-num-proc", "8"], "--max-np has no effect: the job is not elastic"),
    (["--slots-per-host", "4"], "--slots-per-host has no effect: the job is not elastic"),
    (["--reset-limit", "2"], "--reset-limit has no effect: the job is not elastic"),
    (["--elastic-timeout", "60"], "--elastic-timeout has no effect: the job is not elastic"),
    (["--blacklist-cooldown-range", "1", "2"], "--blacklist-cooldown-range has no effect: the job is not elastic"),
    ([*EL, "--slots-per-host", "4"], "--slots-per-host has no effect: it gives slots to a discovery script's hosts"),
]


@pytest.mark.parametrize("opts,note", NOTED, ids=[" ".join(o) for o, _ in NOTED])
def test_noted(opts, note):
    t = run(*opts)
    assert t.action == "run" and t.argv[-3:] == ("--", *CMD)
    assert len(t.notes) == 1 and note in t.notes[0] and "\n" not in t.notes[0], t.notes


def test_noted_options_set_no_variable():
    """A noted option's HOROVOD_* variable is not set: the note is said once, by horovodrun, not again by rank 0."""
    t = run("--hierarchical-allreduce", "--autotune", "--autotune-log-file", "a.csv", "--thread-affinity", "1",
            "--log-without-timestamp", "--cycle-time-ms", "2", "--fusion-threshold-mb", "8")
    assert t.env == {"HOROVOD_FUSION_THRESHOLD": str(8 << 20)}
    assert len(t.notes) == 6 and not any("HOROVOD_CYCLE_TIME" in a for a in t.argv)


def test_noted_exactly_where_the_runtime_has_no_mechanism():
    """The translator's verdicts agree with the runtime's own (runtime/horovod_env.py): an option is noted
    iff the runtime would call its variable one with no effect."""
    from trainrun.runtime import horovod_env
    from trainrun.horovodrun.translate import NO_MECHANISM, OPTION_VARS

    for dest, var in OPTION_VARS.items():
        runtime_says_no = var not in horovod_env.READ and (
            var in horovod_env.NO_EFFECT or any(p.endswith("_") and var.startswith(p) for p in horovod_env.NO_EFFECT))
        assert (dest in NO_MECHANISM) == runtime_says_no, (dest, var)


def test_gloo_prints_horovods_gloo_prefix():
    assert has(run("--gloo").argv, "--prefix", "rank")
    assert has(run("--gloo", "--prefix-output-with-timestamp").argv, "--prefix", "timestamp")


def test_static_elastic_options_are_not_passed():
    t = run("-np", "2", "--max-np", "4", "--reset-limit", "1")
    assert "--max-np" not in t.argv and "--max-restarts" not in t.argv


def test_min_np_defaults_to_np_in_elastic_mode():
    t = run("-np", "3", "--host-discovery-script", "d.sh", "--slots-per-host", "2")
    assert has(t.argv, "--min-np", "3") and t.slots_per_host == 2 and not t.notes
    assert has(t.with_discovery_script("/tmp/w").argv, "--host-discovery-script", "/tmp/w")


def test_environment_fallbacks():
    assert has(run(environ={"HOROVOD_START_TIMEOUT": "45"}).argv, "--start-timeout", "45")
    assert has(run("--start-timeout", "9", environ={"HOROVOD_START_TIMEOUT": "45"}).argv, "--start-timeout", "9")
    t = run(*EL, environ={"HOROVOD_ELASTIC_TIMEOUT": "77"})
    assert has(t.argv, "--elastic-timeout", "77")


def test_the_command_runs_as_written():
    t = translate(["-np", "2", "python", "train.py", "-np", "8", "--lr", "0.1"], {})
    assert t.argv[t.argv.index("--") + 1:] == ("python", "train.py", "-np", "8", "--lr", "0.1")
    assert translate(["-np", "2", "--", "python", "t.py"], {}).argv[-3:] == ("--", "python", "t.py")


def test_tutorial_command_lines():
    t = translate("-np 16 -H server1:4,server2:4,server3:4,server4:4 python train.py".split(), {})
    assert t.argv == ("-np", "16", "-H", "server1:4,server2:4,server3:4,server4:4", "--prefix", "mpi", "--", "python", "train.py")
    t = translate("--verbose --network-interface eth0 --hostfile hostfile -p 2222 -np 4 python train.py".split(), {})
    assert t.argv == ("-np", "4", "--hostfile", "hostfile", "-p", "2222", "--network-interface", "eth0", "-v",
                      "--prefix", "mpi", "--", "python", "train.py")
    assert not t.notes


def test_abbreviations_and_equals_forms_as_argparse_takes_them():
    t = translate(["--fusion-thr=8", "--num-proc=2", "python", "t.py"], {})
    assert has(t.argv, "-np", "2") and has(t.argv, "-x", "HOROVOD_FUSION_THRESHOLD=8388608")


def test_config_file_horovods_schema(tmp_path):
    cfg = tmp_path / "hvd.yaml"
    cfg.write_text("""
controller: gloo
params: {fusion_threshold_mb: 16, cycle_time_ms: 2, cache_capacity: 512, hierarchical_allreduce: true}
autotune: {enabled: true, warmup_samples: 5}
timeline: {filename: tl.json, mark_cycles: true}
stall_check: {enabled: false, warning_time_seconds: 30, shutdown_time_seconds: 90}
library_options: {num_nccl_streams: 2, gloo_timeout_seconds: 40, mpi_threads_disable: false, thread_affinity: 0}
logging: {level: info, with_timestamp: true}
""")
    t = run("--config-file", str(cfg), "--cache-capacity", "7")
    assert t.env == {
        "HOROVOD_FUSION_THRESHOLD": str(16 << 20), "HOROVOD_CACHE_CAPACITY": "7",
        "HOROVOD_TIMELINE": "tl.json", "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "HOROVOD_LOG_LEVEL": "INFO"}
    noted = {n.split(" ", 1)[0] for n in t.notes}
    assert noted == {"--gloo:", "--cycle-time-ms", "--hierarchical-allreduce", "--autotune", "--autotune-warmup-samples",
                     "--timeline-mark-cycles", "--mpi-threads-disable", "--num-nccl-streams", "--thread-affinity",
                     "--gloo-timeout-seconds", "--log-with-timestamp"}
    assert has(t.argv, "--prefix", "rank")  # controller: gloo


def test_config_file_unknown_key_is_noted_and_bad_value_refused(tmp_path):
    cfg = tmp_path / "hvd.yaml"
    cfg.write_text("params: {fusion_treshold_mb: 16}\n")
    t = run("--config-file", str(cfg))
    assert t.notes == (f"--config-file {cfg}: 'params.fusion_treshold_mb' is not a key of Horovod's schema; ignored",)
    cfg.write_text("params: {fusion_threshold_mb: lots}\n")
    with pytest.raises(UsageError, match=r"params.fusion_threshold_mb: expected a whole number, got 'lots'"):
        run("--config-file", str(cfg))
    with pytest.raises(UsageError, match="no such file"):
        run("--config-file", str(tmp_path / "missing.yaml"))


REFUSED = [
    (["--jsrun"], "--jsrun: trainrun does not launch through LSF's jsrun; name the hosts with -H or --hostfile"),
    (["-np", "x"], "argument -np/--num-proc: invalid int value: 'x'"),
    (["-np", "0"], "--num-proc 0: must be at least 1"),
    (["--log-level", "LOUD"], "argument --log-level: invalid choice: 'LOUD'"),
    (["--gloo", "--mpi"], "argument --mpi: not allowed with argument --gloo"),
    (["--hierarchical-allreduce", "--no-hierarchical-allreduce"], "not allowed with argument --hierarchical-allreduce"),
    (["-H", "a:1", "--hostfile", "hf"], "argument -hostfile/--hostfile: not allowed with argument -H/--hosts"),
    (["--fusion-threshold-mb", "-1"], "--fusion-threshold-mb -1: must be >= 0"),
    (["--autotune-gaussian-process-noise", "2"], "must be in [0, 1]"),
    (["--start-timeout", "0"], "--start-timeout 0: must be more than 0 seconds"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
]


@pytest.mark.parametrize("opts,message", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_refused(opts, message):
    with pytest.raises(UsageError) as err:
        translate([*opts, *CMD], {}) if opts != ["--no-such-option"] else translate([*opts], {})
    assert message in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 2


def test_no_command_is_a_usage_error():
    with pytest.raises(UsageError, match="no command to run; write horovodrun -np 2 python train.py"):
        translate(["-np", "2"], {})


@pytest.mark.parametrize("opt,action", [("-h", "help"), ("--help", "help"), ("-v", "version"), ("--version", "version"),
                                        ("-cb", "check-build"), ("--check-build", "check-build")])
def test_actions(opt, action):
    assert translate([opt], {}).action == action


def test_every_option_has_a_case():
    """Every option string horovodrun accepts is exercised by a case above (a new option needs one)."""
    cases = [o for opts, _ in DONE + NOTED + REFUSED for o in opts]
    cases += ["-h", "--help", "-v", "--version", "-cb", "--check-build", "--config-file", "--slots-per-host",
              "--host-discovery-script"]
    used = {c.split("=")[0] for c in cases}
    options = {s for a in build_parser()._actions for s in a.option_strings}
    assert options - used == set()
