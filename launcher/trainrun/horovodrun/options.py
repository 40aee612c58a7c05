"""horovodrun 0.28.1's command line, option for option (names, short forms, arities, types), as an
argparse parser: argparse is what horovodrun itself parses with, so abbreviations (`--fusion-thr 32`),
`--opt=value`, single-dash long options (`-np`, `-hostfile`, `-cb`) and the command after the options
(`python train.py ...`, everything from the first word that is not an option) behave as they do there.

Every value option defaults to None, so "given" is "not None" (the --config-file rule: the command
line wins over the file). The parser never exits: a parse error raises UsageError (one line, exit 2).
"""
from __future__ import annotations

import argparse

from trainrun.errors import UsageError

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage and exit 2; we want one line
        raise UsageError(f"{message} (see horovodrun --help)")


class _Nics(argparse.Action):
    """--network-interfaces a,b and repeated --network-interface a: their union, in the order given."""

    def __call__(self, parser, ns, values, option_string=None):
        have = list(getattr(ns, self.dest) or [])
        have += [n for n in values.split(",") if n and n not in have]
        setattr(ns, self.dest, have)


def _flag(group, *names, dest: str, value: bool, help: str | None = None) -> None:
    group.add_argument(*names, dest=dest, action="store_const", const=value, default=None,
                       help=argparse.SUPPRESS if help is None else help)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="horovodrun", add_help=False, description=(
        "Horovod's horovodrun, run by trainrun: every horovodrun 0.28.1 option is accepted; each does the "
        "same through trainrun, or says in one line why it has no effect here, or names the trainrun way."))
    p.add_argument("-h", "--help", action="store_true", help="Show this help and exit.")
    p.add_argument("-v", "--version", action="store_true", help="Show the Horovod API version and trainrun's.")
    p.add_argument("-np", "--num-proc", dest="num_proc", type=int, help="Total number of training processes.")
    p.add_argument("-cb", "--check-build", action="store_true", help="Show what this install supports, in Horovod's layout.")
    p.add_argument("--disable-cache", action="store_true", help="Probe the NICs again (trainrun --no-cache).")
    p.add_argument("--start-timeout", type=int, help="Seconds for the ranks to start (trainrun --start-timeout; "
                   "else HOROVOD_START_TIMEOUT, else trainrun's default).")
    p.add_argument("--network-interfaces", dest="nics", action=_Nics, help="NICs, comma separated (trainrun --network-interface).")
    p.add_argument("--network-interface", dest="nics", action=_Nics, help="A NIC; repeatable.")
    p.add_argument("--output-filename", help="Write each rank's output to DIR/rank.N/stdout|stderr (trainrun --output-dir).")
    p.add_argument("--verbose", action="store_true", help="Log what the launcher does (trainrun -v).")
    p.add_argument("--config-file", help="Horovod's YAML config (params, autotune, timeline, stall_check, "
                   "library_options, logging, controller); the command line wins.")
    p.add_argument("command", nargs=argparse.REMAINDER, help="The command to run, as written.")

    ssh = p.add_argument_group("SSH arguments")
    ssh.add_argument("-p", "--ssh-port", type=int, help="SSH port on all the hosts.")
    ssh.add_argument("-i", "--ssh-identity-file", help="SSH private key.")

    tune = p.add_argument_group("tuneable parameter arguments (set HOROVOD_* for the ranks)")
    tune.add_argument("--fusion-threshold-mb", type=int, help="HOROVOD_FUSION_THRESHOLD (MB).")
    tune.add_argument("--cycle-time-ms", type=float, help="No effect here (says why).")
    tune.add_argument("--cache-capacity", type=int, help="HOROVOD_CACHE_CAPACITY.")
    for what in ("allreduce", "allgather"):
        g = tune.add_mutually_exclusive_group()
        _flag(g, f"--hierarchical-{what}", dest=f"hierarchical_{what}", value=True, help="No effect here (says why).")
        _flag(g, f"--no-hierarchical-{what}", dest=f"hierarchical_{what}", value=False, help="No effect here (says why).")

    auto = p.add_argument_group("autotune arguments (no autotuner here: each says so)")
    g = auto.add_mutually_exclusive_group()
    _flag(g, "--autotune", dest="autotune", value=True, help="No effect here (says why).")
    _flag(g, "--no-autotune", dest="autotune", value=False)
    auto.add_argument("--autotune-log-file")
    auto.add_argument("--autotune-warmup-samples", type=int)
    auto.add_argument("--autotune-steps-per-sample", type=int)
    auto.add_argument("--autotune-bayes-opt-max-samples", type=int)
    auto.add_argument("--autotune-gaussian-process-noise", type=float)

    el = p.add_argument_group("elastic arguments (trainrun's elastic options)")
    el.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int, help="trainrun --min-np.")
    el.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int, help="trainrun --max-np.")
    el.add_argument("--slots-per-host", dest="slots", type=int, help="Slots of the discovery script's hosts that print none.")
    el.add_argument("--elastic-timeout", type=int, help="trainrun --elastic-timeout.")
    el.add_argument("--reset-limit", type=int, help="trainrun --max-restarts.")
    el.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2, metavar=("MIN", "MAX"),
                    help="trainrun --blacklist-cooldown-range.")

    tl = p.add_argument_group("timeline arguments")
    tl.add_argument("--timeline-filename", help="HOROVOD_TIMELINE.")
    g = tl.add_mutually_exclusive_group()
    _flag(g, "--timeline-mark-cycles", dest="timeline_mark_cycles", value=True, help="No effect here (says why).")
    _flag(g, "--no-timeline-mark-cycles", dest="timeline_mark_cycles", value=False)

    st = p.add_argument_group("stall check arguments")
    g = st.add_mutually_exclusive_group()
    _flag(g, "--no-stall-check", dest="no_stall_check", value=True, help="HOROVOD_STALL_CHECK_DISABLE=1.")
    _flag(g, "--stall-check", dest="no_stall_check", value=False)
    st.add_argument("--stall-check-warning-time-seconds", type=int, help="HOROVOD_STALL_CHECK_TIME_SECONDS.")
    st.add_argument("--stall-check-shutdown-time-seconds", type=int, help="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS.")

    lib = p.add_argument_group("library arguments")
    g = lib.add_mutually_exclusive_group()
    _flag(g, "--mpi-threads-disable", dest="mpi_threads_disable", value=True, help="No effect here (says why).")
    _flag(g, "--no-mpi-threads-disable", dest="mpi_threads_disable", value=False)
    lib.add_argument("--mpi-args", help="mpirun's -x, --oversubscribe, --bind-to are translated; the rest says why not.")
    lib.add_argument("--tcp", dest="tcp_flag", action="store_true", help="TCP only: NCCL_IB_DISABLE=1, UCX_TLS=tcp,sm,self.")
    lib.add_argument("--binding-args", help="--bind-to core|none is translated (trainrun --bind-to); the rest says why not.")
    lib.add_argument("--num-nccl-streams", type=int)
    lib.add_argument("--thread-affinity", type=int)
    lib.add_argument("--gloo-timeout-seconds", type=int)

    lg = p.add_argument_group("logging arguments")
    lg.add_argument("--log-level", choices=LOG_LEVELS, help="HOROVOD_LOG_LEVEL.")
    _flag(lg, "--log-with-timestamp", dest="log_with_timestamp", value=True)
    _flag(lg, "--log-without-timestamp", dest="log_with_timestamp", value=False, help="No effect here (says why).")
    _flag(lg, "--log-hide-timestamp", dest="log_with_timestamp", value=False)      # deprecated in Horovod
    _flag(lg, "--no-log-hide-timestamp", dest="log_with_timestamp", value=True)    # deprecated in Horovod
    lg.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", dest="prefix_output_with_timestamp",
                    action="store_true", help="Timestamp each output line (trainrun --prefix mpi-timestamp).")

    hosts = p.add_argument_group("host arguments").add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="host1:2,host2:4 (trainrun -H).")
    hosts.add_argument("-hostfile", "--hostfile", help="'host slots=N' lines (trainrun --hostfile).")
    hosts.add_argument("--host-discovery-script", help="Elastic: prints the hosts (trainrun --host-discovery-script).")

    ctl = p.add_argument_group("controller arguments").add_mutually_exclusive_group()
    ctl.add_argument("--gloo", dest="use_gloo", action="store_true", help="Runs on trainrun's MPI world (says so).")
    ctl.add_argument("--mpi", dest="use_mpi", action="store_true", help="trainrun's MPI world (its default).")
    ctl.add_argument("--jsrun", dest="use_jsrun", action="store_true", help="Refused: name the hosts with -H/--hostfile.")
    return p
