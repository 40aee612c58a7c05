#!/usr/bin/env python3
"""A real Slurm cluster on the simulated hosts of scripts/testbed.py: munged and slurmctld on h1, one slurmd on
every host hN, each inside its host's network, UTS and mount namespaces (h1 is the controller and login node).

    python3 scripts/slurm_testbed.py up [N]          testbed up N (default 3) unless one is up, then Slurm on it
    python3 scripts/slurm_testbed.py down [--keep-hosts]   cancel every job, stop every daemon by pid, then
                                                     the testbed (unless --keep-hosts); safe any time, repeatable
    python3 scripts/slurm_testbed.py status          the daemons and `sinfo`
    python3 scripts/slurm_testbed.py exec I CMD...   run CMD inside host I with Slurm's client env, e.g.
                                                     exec 1 salloc -N3 srun hostname

Stdlib only. Needs what testbed.py needs plus Debian's `slurm-wlm` and `munge` (slurmctld, slurmd, munged,
mungekey, srun; `bash scripts/setup.sh --test` installs them as root). Debian slurm-wlm 22.05.

Why it is built the way it is (each point was a failure once):
- Host names resolve only inside the hosts (/etc/hosts is the testbed's there): run salloc, srun, sbatch and
  the launcher from inside a host (`exec 1 ...`), as from a cluster's login node.
- The hosts have no cgroup file system: `proctrack/linuxproc` + `task/none`, and cgroup.conf must name
  `CgroupPlugin=cgroup/v1` or slurmd refuses to start. So a double-forked process escapes `scancel`.
- slurmd does not create its spool dir; munged's socket dir must be mode 711; clients need the config: each
  host sees STATE/etc bind-mounted on /etc/slurm (Slurm's default config dir), and `env()` sets SLURM_CONF too.
- One munged serves every host through its socket path (a path-based Unix socket crosses network namespaces).
- slurm.conf gives every node the CPU layout `slurmd -C` reports inside it (the hosts share this machine).

State dir (env TRAINRUN_SLURM_STATE, default /tmp/trainrun-slurm): etc/slurm.conf, etc/cgroup.conf, munge/,
run/*.pid, log/ (kept after `down` for post-mortems; `up` starts from an empty dir), state/.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if "testbed" not in sys.modules:   # tests/cluster/conftest.py registers the testbed module it loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import testbed

TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo", "squeue", "scancel")
CONTROLLER = 1                      # host index of slurmctld + munged
CONF_DIR_IN_HOSTS = Path("/etc/slurm")
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")   # process names `down` makes sure are gone
IDLE_TIMEOUT_S = 30.0
STATE_DIR = Path(os.environ.get("TRAINRUN_SLURM_STATE", "/tmp/trainrun-slurm"))

CONF = """\
ClusterName=trainrun
SlurmctldHost={ctl_name}({ctl_ip})
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={s}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={s}/state/ctld
SlurmdSpoolDir={s}/state/slurmd-%n
SlurmctldPidFile={s}/run/slurmctld.pid
SlurmdPidFile={s}/run/slurmd-%n.pid
SlurmctldLogFile={s}/log/slurmctld.log
SlurmdLogFile={s}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=2
InactiveLimit=10
MinJobAge=30
SchedulerParameters=batch_sched_delay=0
"""


def state_dir(tb_state: Path = testbed.STATE_DIR) -> Path:
    """Slurm's state dir for the testbed whose state dir is tb_state. Not inside it: that one is mode 700,
    and munged wants every directory above its socket searchable by all."""
    if Path(tb_state) == testbed.STATE_DIR:
        return STATE_DIR
    return Path(str(tb_state) + "-slurm")


def missing_requirement() -> str | None:
    """Why a Slurm testbed cannot be built here (one line), or None when it can."""
    reason = testbed.missing_requirement()
    if reason:
        return reason
    path = os.environ.get("PATH", "") + ":" + SBIN
    for tool in TOOLS:
        if not shutil.which(tool, path=path):
            return (f"`{tool}` not found (apt-get install --no-install-recommends slurm-wlm munge, "
                    "or bash scripts/setup.sh --test)")
    return None


class SlurmError(testbed.TestbedError):
    """A step of up/down failed; the message names the command and what it printed."""


class Slurm:
    """A Slurm cluster that is up on testbed `tb`. Hosts are numbered from 1, like the testbed's."""

    def __init__(self, tb: testbed.Testbed):
        self.tb = tb
        self.dir = state_dir(tb.state_dir)
        self.conf = self.dir / "etc" / "slurm.conf"
        self.log_dir = self.dir / "log"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """os.environ for a Slurm client: SLURM_CONF set, Slurm variables of any enclosing job removed."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":" + SBIN
        env.update(extra or {})
        return env

    def argv(self, i: int, argv: list[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """The argv that runs `argv` inside host i in directory cwd (default: the caller's; nsenter would
        otherwise start in /). Pass env=self.env() to the process."""
        wd = os.fspath(cwd) if cwd is not None else os.getcwd()
        return self.tb.enter(i)[:-1] + [f"--wd={wd}", "--"] + [os.fspath(a) for a in argv]

    def run(self, i: int, argv: list, env: dict[str, str] | None = None, cwd=None,
            **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(argv) inside host i, in cwd, with Slurm's client env (+ `env`); default text,
        captured, timeout 60 s. E.g. run(1, ["salloc", "-N3", "srun", "hostname"])."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.argv(i, argv, cwd), env=self.env(env), **kwargs)

    def popen(self, i: int, argv: list, env: dict[str, str] | None = None, cwd=None,
              **kwargs) -> subprocess.Popen:
        """subprocess.Popen(argv) inside host i, in cwd, with Slurm's client env (+ `env`)."""
        return subprocess.Popen(self.argv(i, argv, cwd), env=self.env(env), **kwargs)

    def daemons(self) -> dict[str, int]:
        """Running daemons by name (munged, slurmctld, slurmd-hN) from their pid files."""
        return {name: pid for name, pid in _pid_files(self.dir).items() if pid and testbed._alive(pid)}

    def nodes(self) -> dict[str, str]:
        """Node name -> state (idle, alloc, mix, down*, ...) from sinfo; {} when the controller does not answer."""
        try:
            p = self.run(CONTROLLER, ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)

    def jobs(self) -> list[str]:
        """Ids of jobs the controller still knows as pending, running, completing or suspended."""
        p = self.run(CONTROLLER, ["squeue", "-h", "-o", "%i", "-t", "PD,R,CG,S,CF"], timeout=10)
        return p.stdout.split()

    def cancel_all(self, timeout: float = 10.0) -> list[str]:
        """scancel every job and wait until the controller has none left (KillWait=2: SIGTERM, then SIGKILL
        2 s later); returns the ids still there after `timeout` (empty when all are gone)."""
        jobs = self.jobs()
        if jobs:
            self.run(CONTROLLER, ["scancel", *jobs], timeout=10)
        deadline = time.monotonic() + timeout
        while jobs and time.monotonic() < deadline:
            time.sleep(0.1)
            jobs = self.jobs()
        return jobs


def _pid_files(s: Path) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for f in sorted((s / "run").glob("slurmd-*.pid")) + [s / "run" / "slurmctld.pid", s / "munge" / "munged.pid"]:
        try:
            out[f.name[:-4]] = int(f.read_text().strip())
        except (OSError, ValueError):
            out[f.name[:-4]] = None
    return out


def _start(enter: list[str], argv: list[str], log: Path, env: dict[str, str]) -> None:
    """Start a self-daemonizing program; its std streams go to `log`, never to a pipe a daemon could hold."""
    with open(log, "ab") as f:
        p = subprocess.run(enter + argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env, timeout=30)
    if p.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise SlurmError(f"{' '.join(argv)}: exit {p.returncode}: {' | '.join(tail)}")


def _hardware(tb: testbed.Testbed, i: int) -> str:
    """The node's CPU layout as `slurmd -C` reports it inside host i: 'CPUs=2 Boards=1 ... ThreadsPerCore=1'."""
    line = testbed.sh(*tb.enter(i), "slurmd", "-C").splitlines()[0]
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    return " ".join(kv for kv in line.split() if kv.split("=", 1)[0] in keep)


def _conf_mounted(tb: testbed.Testbed, i: int) -> bool:
    mountinfo = Path(f"/proc/{tb.holder_pid(i)}/mountinfo").read_text()
    return any(line.split()[4] == str(CONF_DIR_IN_HOSTS) for line in mountinfo.splitlines())


def up(tb: testbed.Testbed) -> Slurm:
    """Start munged + slurmctld on h1 and slurmd on every host of `tb`, return once every node is idle.
    Removes what an earlier `up` left first; on any failure stops what it started and raises SlurmError."""
    down(tb.state_dir)
    try:
        return _build(tb)
    except BaseException:
        down(tb.state_dir)
        raise


def _build(tb: testbed.Testbed) -> Slurm:
    s = Slurm(tb)
    shutil.rmtree(s.dir, ignore_errors=True)
    for d in ("etc", "run", "log", "state/ctld", "munge"):
        (s.dir / d).mkdir(parents=True)
    (s.dir / "munge").chmod(0o711)   # munged: clients must reach the socket in it
    env = s.env()
    key = s.dir / "munge" / "munge.key"
    testbed.sh("mungekey", "--create", f"--keyfile={key}")
    ctl = tb.host(CONTROLLER)
    nodes = "".join(f"NodeName={h.name} NodeAddr={h.mgmt_ip} {_hardware(tb, h.index)} State=UNKNOWN\n"
                    for h in tb.hosts)
    s.conf.write_text(CONF.format(ctl_name=ctl.name, ctl_ip=ctl.mgmt_ip, s=s.dir) + nodes
                      + "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
    (s.dir / "etc" / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")  # no autodetect: no cgroup fs here
    for h in tb.hosts:
        if not _conf_mounted(tb, h.index):
            testbed.sh(*tb.enter(h.index), "mount", "--bind", str(s.dir / "etc"), str(CONF_DIR_IN_HOSTS))
    m = s.dir / "munge"
    _start(tb.enter(CONTROLLER), ["munged", f"--socket={m}/munge.socket", f"--key-file={key}",
                                  f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                                  f"--seed-file={m}/munged.seed"], s.log_dir / "munged.out", env)
    _start(tb.enter(CONTROLLER), ["slurmctld", "-f", str(s.conf)], s.log_dir / "slurmctld.out", env)
    for h in tb.hosts:
        (s.dir / "state" / f"slurmd-{h.name}").mkdir()   # slurmd does not create its spool dir
        _start(tb.enter(h.index), ["slurmd", "-f", str(s.conf)], s.log_dir / f"slurmd-{h.name}.out", env)
    want = {h.name for h in tb.hosts}
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while {n for n, st in s.nodes().items() if st == "idle"} != want:
        if time.monotonic() > deadline:
            raise SlurmError(f"nodes not idle after {IDLE_TIMEOUT_S:.0f} s: {s.nodes()}; see {s.log_dir}")
        time.sleep(0.05)
    return s


def _host_processes(names: tuple[str, ...]) -> dict[int, str]:
    """pid -> name of processes called one of `names` inside the testbed's namespaces."""
    out = {}
    for ns in testbed.namespaces():
        for pid in map(int, testbed.sh("ip", "netns", "pids", ns, check=False).split()):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm in names and testbed._alive(pid):
                out[pid] = comm
    return out


def reap() -> int:
    """Reap this process's zombie children that are Slurm daemons or step daemons, returns how many.
    They are ours when this process is a child subreaper (the test suite is): slurmd double-forks a
    slurmstepd per step, and the daemons detach from whoever started them."""
    me, n = os.getpid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] == "Z" and int(rest[1]) == me and comm in DAEMONS:
            try:
                os.waitpid(int(name), os.WNOHANG)
                n += 1
            except ChildProcessError:
                pass
    return n


def _stop(pids: list[int], grace_s: float) -> None:
    """SIGTERM pids, SIGKILL what is left after grace_s, wait (bounded) until they are gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while (pids := [p for p in pids if testbed._alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not pids:
            return


def down(tb_state: Path = testbed.STATE_DIR) -> list[str]:
    """Cancel every job, stop every daemon `up` started (by the pids in their pid files), then any slurmstepd
    still inside the hosts, and unmount the config from the hosts. Returns what is still running (empty when
    all is gone). Never raises for things that are already gone."""
    s = state_dir(tb_state)
    try:
        tb = testbed.Testbed(tb_state)
    except (OSError, ValueError, KeyError):
        tb = None
    pids = {name: pid for name, pid in _pid_files(s).items() if pid and testbed._alive(pid)}
    if tb is not None and pids.get("slurmctld"):
        try:
            Slurm(tb).cancel_all()
        except subprocess.TimeoutExpired:
            pass   # a controller that does not answer: its daemons are stopped below all the same
    # slurmd first (no node goes DOWN in a controller that is still saving state), munged last
    order = sorted(pids, key=lambda n: (n == "munged", n == "slurmctld"))
    _stop([pids[n] for n in order], grace_s=10)
    _stop(list(_host_processes(("slurmstepd",))), grace_s=2)
    for f in list((s / "run").glob("*.pid")) + [s / "munge" / "munged.pid"]:
        f.unlink(missing_ok=True)
    if tb is not None:
        for h in tb.hosts:
            try:
                if _conf_mounted(tb, h.index):
                    testbed.sh(*tb.enter(h.index), "umount", str(CONF_DIR_IN_HOSTS), check=False)
            except (OSError, ValueError):
                pass   # host already gone
    reap()
    left = [f"{n} {p}" for n, p in pids.items() if testbed._alive(p)]
    return left + [f"{comm} {pid}" for pid, comm in _host_processes(DAEMONS).items()]


def status(tb_state: Path = testbed.STATE_DIR) -> str:
    if not testbed.namespaces():
        return "down (no testbed)"
    try:
        sl = Slurm(testbed.Testbed(tb_state))
    except (OSError, ValueError, KeyError):
        return "down (testbed broken: run `testbed.py down`)"
    daemons = sl.daemons()
    if not daemons:
        return "down (testbed up, no Slurm daemon)"
    lines = [f"up: {', '.join(f'{n} {p}' for n, p in daemons.items())}; SLURM_CONF={sl.conf}"]
    lines += [f"  {n}: {st}" for n, st in sl.nodes().items()] or ["  controller does not answer"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "help"
    if cmd == "status":
        print(status())
        return 0
    if cmd == "exec" and len(argv) >= 3:
        sl = Slurm(testbed.Testbed())
        os.execvpe("nsenter", sl.argv(int(argv[1]), argv[2:]), sl.env())
    if cmd not in ("up", "down"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    reason = missing_requirement()
    if reason:
        print(f"slurm_testbed: {reason}", file=sys.stderr)
        return 1
    fd = testbed.lock(blocking=False)
    if fd is None:
        print(f"slurm_testbed: the testbed is in use by another session (lock {testbed.LOCK_FILE})", file=sys.stderr)
        return 1
    try:
        if cmd == "down":
            left = down()
            if "--keep-hosts" not in argv[1:]:
                left += testbed.down()
            print("slurm testbed down" + (f"; LEFT OVER: {left}" if left else ""))
            return 1 if left else 0
        t0 = time.monotonic()
        if testbed.namespaces():
            tb = testbed.Testbed()
            if tb.owner != "cli":
                print(f"slurm_testbed: the testbed up is owned by {tb.owner}", file=sys.stderr)
                return 1
        else:
            tb = testbed.up(int(argv[1]) if len(argv) > 1 else 3)
        t1 = time.monotonic()
        sl = up(tb)
        print(f"slurm up on {len(tb.hosts)} hosts in {time.monotonic() - t1:.2f} s "
              f"(testbed {t1 - t0:.2f} s); SLURM_CONF={sl.conf}")
        print(f"  {sys.argv[0]} exec 1 srun -N{len(tb.hosts)} hostname")
        return 0
    except testbed.TestbedError as e:
        print(f"slurm_testbed: {e}", file=sys.stderr)
        return 1
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
