"""The `trainrun` command. The only place raw argv is seen; every TrainrunError becomes a one-line
message and its exit code here (no traceback for anything a user can cause)."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from trainrun.cli.simple import answer_sigint, exit_with, launch_options
from trainrun.version import __version__
from trainrun.errors import TrainrunError

if TYPE_CHECKING:
    from trainrun.plan.roles import RoleCounts

EXAMPLES = """\b
Examples:
  trainrun -np 4 train.py --lr 0.1            4 ranks of train.py on this machine
  trainrun -np 2 python -c 'import os; print(os.environ["RANK"])'
  trainrun -H localhost:2,127.0.0.1:2 ./a.out  2 "hosts" x 2 slots
  trainrun --hostfile hostfiles/local.txt --dry-run train.py
  trainrun -H node1:4,node2:4 --check          is every host ready? (exit 0 if the job could run)
  trainrun --hostfile hosts --check --perf     will it run at full speed? (which host or link is slow)
  trainrun --config run.yaml train.py         options from YAML; flags override
  salloc -N3 trainrun train.py                inside Slurm: hosts, slots and -np from the allocation, via srun
  trainrun --sbatch -N 3 --time=10 --wait train.py    submit as a batch job and follow it
  trainrun --ray -np 8 train.py               on a Ray cluster: Ray places the ranks (RAY_ADDRESS, else local)
  kill -USR1 <trainrun pid>                   print every rank's Python stack; the job goes on

Everything after the program is passed to it untouched (also -np, -H, ...).
"""


# click.ParamType is generic from click 8.3 on (checked against the installed click); subscripting it here would
# break click 8.1, which setup.cfg allows
class Count(click.ParamType):  # type: ignore[type-arg]
    """A whole number >= 1, with a message that says so."""

    name = "N"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        elif isinstance(value, str) and value.strip().lstrip("+").isdigit():
            n = int(value)
        else:
            self.fail(f"'{value}' is not a whole number", param, ctx)
        if n < 1:
            self.fail(f"{n} must be at least 1", param, ctx)
        return n


class Roles(click.ParamType):  # type: ignore[type-arg]
    """--tf-cluster's value, parsed once into a RoleCounts (plan/roles.py)."""

    name = "ROLES"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> RoleCounts:
        from trainrun.plan.roles import RoleCounts, parse_roles

        return value if isinstance(value, RoleCounts) else parse_roles(str(value))


def _sbatch_first(value: bool) -> None:
    if value:  # main() takes --sbatch when it comes first; anywhere else it would mix the two option sets
        raise click.UsageError("--sbatch goes first: trainrun --sbatch [SBATCH OPTIONS...] [OPTIONS] PROGRAM ...")


def _wait_needs_sbatch(value: bool) -> None:
    if value:
        raise click.UsageError("--wait goes with --sbatch (trainrun --sbatch [SBATCH OPTIONS...] --wait ...)")


def _option_arity() -> dict[str, bool]:
    """Every option name of the command -> whether it takes a value."""
    return {o: not (p.is_flag or p.count) for p in cli.params if isinstance(p, click.Option) for o in p.opts}


def _submit(argv: list[str]) -> int:
    from trainrun.slurm.submit import split_argv, submit

    sub = split_argv(argv, _option_arity())
    cli.make_context("trainrun", list(sub.trainrun_args))  # the script's options are checked before submitting
    return submit(sub)


def _load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value:
        from trainrun.config import load_config_file

        ctx.default_map = {**(ctx.default_map or {}), **load_config_file(value, ctx)}
    return value


@click.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EXAMPLES,
)
@click.option("--config", type=str, metavar="FILE", is_eager=True, expose_value=False, callback=_load_config, help="YAML file of options (same names as the flags).")
@click.option("-np", "--num-proc", type=Count(), help="Number of ranks. Default: total slots of the hosts.")
@click.option("-H", "--hosts", metavar="HOST[:N],...", help="Hosts and slots: host1:4,host2:4 (user@host allowed).")
@click.option("--hostfile", metavar="FILE", help="File of hosts: 'host slots=N', 'host:N' or 'host' per line.")
@click.option("--oversubscribe", is_flag=True, help="Allow more ranks than slots.")
@click.option("--gpus-per-proc", type=Count(), help="Give each rank N GPUs and isolate them (CUDA_VISIBLE_DEVICES).")
@click.option("--allow-gpu-sharing", is_flag=True, help="Allow more local ranks than GPUs.")
@click.option("--bind-to", type=click.Choice(["none", "core"]), default="none", show_default=True, help="Pin each local rank to a CPU core.")
@click.option("-x", "--export", multiple=True, metavar="NAME[=VALUE]", help="Export a variable to every rank (repeatable).")
@click.option("--horovod", type=click.Choice(["trainrun", "installed"]), help="What `import horovod` gives the ranks: trainrun's modules (default; or TRAINRUN_HOROVOD) or an installed Horovod.")
@click.option("--prefix", type=click.Choice(["rank", "timestamp", "mpi", "mpi-timestamp", "none"]), default="rank", show_default=True,
              help="Prefix of each output line: [0]<stdout>: (rank), Open MPI's [1,0]<stdout>: (mpi), either after the time.")
@click.option("--output-dir", metavar="DIR", help="Also write each rank's output to DIR/rank.N/stdout|stderr (and stack dumps).")
@click.option("--fold", is_flag=True, help="Print identical lines of many ranks once, prefixed with the rank set ([0-7,9]); \\r progress bars as one line per rank set every few seconds.")
@click.option("--ranks", "show_ranks", metavar="RANKS", help="Show only these ranks' output (e.g. 0,3 or 0-3,8); --output-dir still gets every rank's.")
@click.option("--hang-timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="No output and no runtime progress from any rank for S seconds: print every rank's stack and end the job (exit 124).")
@click.option("--grace", type=click.FloatRange(min=0), default=3.0, show_default=True, help="Seconds between SIGTERM and SIGKILL at teardown.")
@click.option("--mpi", type=click.Choice(["mpich", "openmpi", "none"]), default="mpich", show_default=True,
              help="mpich: trainrun serves the MPI world (PMI-1); openmpi: run through Open MPI's mpirun; none: no MPI world.")
@click.option("--tf-cluster", type=Roles(), metavar="ROLES",
              help="TensorFlow parameter-server cluster: ps=2 (1 chief, the rest workers) or chief=1,worker=4,ps=2,evaluator=1; no MPI world.")
@click.option("--start-timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S", help="Seconds for all ranks to join the MPI world once the first has.  [default: 120]")
@click.option("-p", "--ssh-port", type=click.IntRange(1, 65535), help="SSH port of the remote hosts (default: ssh config, else 22).")
@click.option("-i", "--ssh-identity-file", metavar="FILE", help="SSH private key for the remote hosts.")
@click.option("--ssh-config", metavar="FILE", help="OpenSSH client config to honour (default ~/.ssh/config).")
@click.option("--ssh-strict", is_flag=True, help="Refuse hosts missing from known_hosts (default: trust on first use).")
@click.option("--ssh-timeout", type=click.FloatRange(min=0, min_open=True), default=15.0, show_default=True, help="Seconds to reach each host.")
@click.option("--ssh-parallelism", type=Count(), default=64, show_default=True, help="Hosts contacted at once.")
@click.option("--heartbeat-timeout", type=click.FloatRange(min=1), default=15.0, show_default=True,
              help="Seconds of silence after which a remote host counts as lost (hung, paused or cut off).")
@click.option("--python", "python", metavar="PATH", help="Interpreter for .py programs on remote hosts (default: the launcher's path if it exists there, else python3).")
@click.option("--workdir", metavar="DIR", help="Working directory of the ranks (default: the launcher's).")
@click.option("--network-interface", metavar="NIC[,NIC]", help="NICs for the job's traffic (checked); default: the probe's choice.")
@click.option("--no-cache", is_flag=True, help="Probe the NICs again instead of using the last hour's choice.")
@click.option("--engine", type=click.Choice(["auto", "ssh", "slurm"]), default="auto", show_default=True,
              help="How remote hosts are reached: ssh; slurm (srun, inside an allocation); auto: Slurm inside an "
                   "allocation when no -H/--hostfile is given, else SSH.")
@click.option("--ray", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="Run on a Ray cluster: Ray places one bundle per rank (a placement group), trainrun starts and "
                   "serves them. ADDRESS: auto (RAY_ADDRESS, else the cluster on this machine), HOST:PORT or "
                   "ray://HOST:PORT. Needs -np.")
@click.option("--ray-strategy", type=click.Choice(["pack", "spread", "strict_spread"]), default="pack",
              show_default=True, help="With --ray: the placement group's strategy (Ray's PACK, SPREAD, STRICT_SPREAD).")
@click.option("--cpus-per-proc", type=click.FloatRange(min=0, min_open=True), metavar="N",
              help="With --ray: CPUs in each rank's bundle (default 1); --gpus-per-proc is its GPUs.")
@click.option("--sbatch", "sbatch_", is_flag=True, expose_value=False, is_eager=True, callback=lambda c, p, v: _sbatch_first(v),
              help="Submit as a Slurm batch job instead: trainrun --sbatch [SBATCH OPTIONS...] [OPTIONS] PROGRAM "
                   "(must come first; prints the job id).")
@click.option("--wait", "wait_", is_flag=True, expose_value=False, callback=lambda c, p, v: _wait_needs_sbatch(v),
              help="With --sbatch: wait for the job to end and exit with its code.")
@click.option("--max-restarts", type=click.IntRange(min=0), metavar="N",
              help="Restart the job up to N times when a rank or host fails (ranks see TRAINRUN_RESTART_COUNT). "
                   "Default 0; no limit with --min-np/--max-np/--host-discovery-script.")
@click.option("--min-np", type=Count(), help="Elastic: keep going on the hosts left while at least N ranks fit.")
@click.option("--max-np", type=Count(), help="Elastic: never more than N ranks (default: -np, else all slots).")
@click.option("--host-discovery-script", metavar="PATH",
              help="Elastic: executable printing the available hosts ('host:slots' lines); run every second.")
@click.option("--blacklist-cooldown-range", type=(click.FloatRange(min=0), click.FloatRange(min=0)), metavar="MIN MAX",
              help="Elastic: a failed host sits out MIN s, doubling per failure up to MAX s, then is tried again "
                   "(default: never again).")
@click.option("--elastic-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Elastic: seconds to wait for --min-np ranks' worth of hosts before giving up.")
@click.option("--max-backoff", type=click.FloatRange(min=0), default=10.0, show_default=True, metavar="SECONDS",
              help="Elastic: the most seconds to wait before a restart after a failure (the wait is 0.5 s, doubling "
                   "per failure up to this; 0: restart at once).")
@click.option("--warm-ranks/--no-warm-ranks", default=True, show_default=True,
              help="Elastic: keep one spare interpreter per rank with the framework imported, started once the ranks "
                   "train; a restart's ranks start as these (seconds faster; one idle process per rank).")
@click.option("--check", is_flag=True, help="Check every host (SSH, Python, trainrun, MPI, GPUs, NICs) and the plan; run nothing.")
@click.option("--perf", is_flag=True, help="With --check: measure every link (pairs in parallel rounds), host compute, an allreduce over the plan, versions and clocks; name the outliers.")
@click.option("--perf-strict", is_flag=True, help="With --perf: exit 4 when the job would run degraded (an outlier host or link, a version mismatch).")
@click.option("--perf-time", type=click.FloatRange(min=1), metavar="SECONDS", help="With --perf: total time budget (default: 0.5 s per direction, pair and NIC).")
@click.option("--exclude", metavar="HOST[,HOST|HOST:GPU]", help="Leave these hosts (or GPUs of a host) out of the job, as --check --perf advises.")
@click.option("--dry-run", is_flag=True, help="Print the plan, launch nothing.")
@click.option("--monitor", is_flag=True, help="Show a live table of every host's step rate, compute vs wait, last-arriver share, allreduce throughput and memory, the straggler highlighted (plain lines off a terminal).")
@click.option("--json", "json_", is_flag=True, help="With --dry-run or --check: print JSON. With a job: straggler events as JSON lines on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Log what the launcher does (to stderr).")
@click.version_option(__version__, "--version", prog_name="trainrun")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def cli(command: tuple[str, ...], json_: bool, **options: Any) -> int:
    """Launch COMMAND as N ranked processes on one or many hosts."""
    ctx = click.get_current_context()
    from_cli = {n for n in ("hosts", "hostfile") if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE}
    if from_cli == {"hosts"}:  # the command line's hosts replace the config file's, whichever form
        options["hostfile"] = None
    elif from_cli == {"hostfile"}:
        options["hosts"] = None
    if not command and not options["check"]:
        raise click.UsageError("Missing argument 'COMMAND...'.")
    return launch_options(command, json_, options)


def ray_default_address(argv: list[str]) -> list[str]:
    """`argv` with `--ray` given its default ADDRESS (auto) where the word after it is the program, not an
    address (`trainrun -np 4 --ray train.py`): click would take the program for the option's value."""
    from trainrun.config import looks_like_ray_address

    arity = None
    for i, word in enumerate(argv):
        if word == "--":
            return argv
        if word == "--ray":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            if nxt and not nxt.startswith("-") and not looks_like_ray_address(nxt):
                return [*argv[:i + 1], "auto", *argv[i + 1:]]
            return argv
        if not word.startswith("-"):
            if i == 0 or not argv[i - 1].startswith("-") or "=" in argv[i - 1]:
                return argv  # the program: options end here
            arity = arity or _option_arity()
            if not arity.get(argv[i - 1], False):
                return argv
    return argv


def main(argv: list[str] | None = None) -> NoReturn:
    """The command line read by click (the plain form is also read without it: simple.py, the process's entry
    point in __init__.py), run; exits with the code."""
    argv = sys.argv[1:] if argv is None else argv
    answer_sigint()
    try:
        if argv and argv[0] == "--sbatch":
            code = _submit(argv[1:])
        else:
            code = cli.main(args=ray_default_address(argv) if "--ray" in argv else argv, prog_name="trainrun",
                            standalone_mode=False)
    except click.exceptions.Abort:
        code = 130
    except click.ClickException as err:
        hint = " (see trainrun --help)" if isinstance(err, click.UsageError) else ""
        print(f"trainrun: error: {err.format_message()}{hint}", file=sys.stderr)
        code = err.exit_code
    except TrainrunError as err:
        print(f"trainrun: error: {err}", file=sys.stderr)
        code = err.exit_code
    exit_with(code)
