#!/usr/bin/env python3
"""A real Ray cluster on the simulated hosts of scripts/testbed.py: the head on h1, a worker node on every other
host, each inside its host's network, UTS, IPC and mount namespaces (its own /dev/shm for the object store).

    python3 scripts/ray_testbed.py up [N]     testbed up N (default 3) unless one is up, then Ray on it
    python3 scripts/ray_testbed.py down [--keep-hosts]   stop every Ray process on the hosts by pid, then the
                                              testbed (unless --keep-hosts); safe any time, repeatable
    python3 scripts/ray_testbed.py status     the Ray processes per host and `ray status`
    python3 scripts/ray_testbed.py exec I CMD...   run CMD inside host I (RAY_ADDRESS set), e.g.
                                              exec 1 trainrun --ray -np 6 examples/train_torch.py

Needs what testbed.py needs plus `ray` (ray[default]==2.60.0, the test extra) next to this interpreter.

Why it is built the way it is:
- Each host sees its own /tmp/ray (STATE/hN bind-mounted there): Ray keeps its session files and the
  `ray_current_cluster` file that `--ray auto` reads in /tmp/ray, and the hosts share one /tmp.
- No `ray stop`: it finds Ray's processes by name across the whole machine (the hosts share one PID
  namespace, and other sessions may run a Ray of their own); `down` kills the processes inside the hosts'
  namespaces whose command line is Ray's, by pid.
- GCS health checks every second, a node dead after 3 misses (RAY_health_check_*): a killed raylet is
  noticed in seconds, not Ray's default ~30 s, so the tests that kill one stay short.
- Token authentication (Ray's RAY_AUTH_MODE=token) with a fresh secret in STATE/auth_token, given to every
  node and every driver `run`/`popen` starts (env()): the cluster's ports take no call without it.
- 2 CPUs per node (the hosts share this machine's cores; a test asks for 2 ranks per node), a 100 MB object
  store, no dashboard, no usage stats.
- 2 GPUs per node declared to Ray, and a stand-in `nvidia-smi` (STATE/bin, first on the nodes' PATH) that lists
  2: so `--gpus-per-proc` is placed and pinned from the ids Ray assigns, without a GPU. CUDA itself sees none.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if "testbed" not in sys.modules:   # tests/cluster/conftest.py registers the testbed module it loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import testbed

HEAD = 1
PORT = 6379
CPUS = 2
GPUS = 2
FAKE_SMI = "#!/bin/sh\nprintf '0, Stand-in GPU, 1024\\n1, Stand-in GPU, 1024\\n'\n"
RAY_TMP = Path("/tmp/ray")          # where each host sees its own STATE/hN
STATE_DIR = Path(os.environ.get("TRAINRUN_RAY_STATE", "/tmp/trainrun-ray"))
UP_TIMEOUT_S = 90.0
HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
          "RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_timeout_ms": "1000"}


def ray_exe() -> str | None:
    """The `ray` command next to this interpreter (the venv's), else on PATH."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else shutil.which("ray")


def missing_requirement() -> str | None:
    reason = testbed.missing_requirement()
    if reason:
        return reason
    if ray_exe() is None:
        return "`ray` not found (pip install 'ray[default]==2.60.0', setup.cfg's test extra)"
    return None


class RayError(testbed.TestbedError):
    """A step of up/down failed; the message names the command and what it printed."""


class RayCluster:
    """Ray up on testbed `tb`: .address (the head's GCS), .argv(i, argv) / .run(i, argv) / .popen(i, argv) inside
    host i with RAY_ADDRESS set, .processes() (Ray's processes per host), .raylet(i) (its pid)."""

    def __init__(self, tb: testbed.Testbed):
        self.tb = tb
        self.address = f"{tb.host(HEAD).mgmt_ip}:{PORT}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_ADDRESS=self.address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(STATE_DIR / "auth_token"))
        env.update(extra or {})
        return env

    def argv(self, i: int, argv: list, cwd: str | os.PathLike | None = None) -> list[str]:
        wd = os.fspath(cwd) if cwd is not None else os.getcwd()
        return self.tb.enter(i)[:-1] + [f"--wd={wd}", "--"] + [os.fspath(a) for a in argv]

    def run(self, i: int, argv: list, env: dict[str, str] | None = None, cwd=None,
            **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(self.argv(i, argv, cwd), env=self.env(env), **kwargs)

    def popen(self, i: int, argv: list, env: dict[str, str] | None = None, cwd=None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(i, argv, cwd), env=self.env(env), **kwargs)

    def processes(self) -> dict[int, list[tuple[int, str]]]:
        """Host index -> (pid, command line) of every Ray process running inside it."""
        return {h.index: ray_processes(self.tb, h.index) for h in self.tb.hosts}

    def processes_with_env(self, entry: str) -> dict[int, list[int]]:
        """Host index -> pids of the processes there whose environment holds `entry` (e.g. "TRAINRUN_JOB_ID=")."""
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        out: dict[int, list[int]] = {}
        for h in self.tb.hosts:
            for pid in self.tb.on_host(h.index, pids):
                try:
                    if entry.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                        out.setdefault(h.index, []).append(pid)
                except OSError:
                    pass
        return out

    def raylet(self, i: int) -> int:
        pids = [pid for pid, cmd in ray_processes(self.tb, i) if "/raylet" in cmd.split(" ", 1)[0]]
        if not pids:
            raise RayError(f"h{i}: no raylet running")
        return pids[0]


    def restart_node(self, i: int) -> None:
        """Kill what is left of host i's Ray processes and start its node again (after a test killed its
        raylet); returns once Ray counts every node alive."""
        for pid, _cmd in ray_processes(self.tb, i):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            _start_node(self, i)
        except RayError:  # Ray gives a raylet 30 s to register, too short for a loaded machine: once more
            for pid, _cmd in ray_processes(self.tb, i):
                os.kill(pid, signal.SIGKILL)
            _start_node(self, i)
        _wait_alive(self)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def ray_processes(tb: testbed.Testbed, i: int) -> list[tuple[int, str]]:
    """(pid, command line) of Ray's processes inside host i: its daemons (gcs_server, raylet, agents, log
    monitor) and its workers (`ray::...`), by their command lines."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    out = []
    for pid in tb.on_host(i, pids):
        cmd = _cmdline(pid)
        if "/ray/" in cmd or cmd.startswith("ray::") or "ray/_private" in cmd or "/raylet" in cmd:
            out.append((pid, cmd))
    return out


def _mounted(tb: testbed.Testbed, i: int) -> bool:
    mountinfo = Path(f"/proc/{tb.holder_pid(i)}/mountinfo").read_text()
    return any(line.split()[4] == str(RAY_TMP) for line in mountinfo.splitlines())


def up(tb: testbed.Testbed) -> RayCluster:
    """Start the head on h1 and a node on every other host of `tb`; return once Ray counts every node alive.
    Removes what an earlier `up` left first; on any failure stops what it started and raises RayError."""
    down(tb)
    try:
        return _build(tb)
    except BaseException:
        down(tb)
        raise


def _start(rc: RayCluster, i: int, argv: list[str]) -> None:
    log = STATE_DIR / f"h{i}.out"
    path = f"{STATE_DIR / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"  # the stand-in nvidia-smi first
    with open(log, "ab") as f:
        p = subprocess.run(rc.argv(i, argv, "/"), stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                           env=rc.env({**HEALTH, "PATH": path}), timeout=120)
    if p.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RayError(f"h{i}: {' '.join(argv[:3])}: exit {p.returncode}: {' | '.join(tail)}")


def _build(tb: testbed.Testbed) -> RayCluster:
    rc = RayCluster(tb)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    RAY_TMP.mkdir(exist_ok=True)  # the mount point (each host mounts its own over it)
    STATE_DIR.mkdir(parents=True)
    token = STATE_DIR / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    (STATE_DIR / "bin").mkdir()
    smi = STATE_DIR / "bin" / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    for h in tb.hosts:
        d = STATE_DIR / h.name
        d.mkdir()
        if not _mounted(tb, h.index):
            testbed.sh(*tb.enter(h.index), "mount", "--bind", str(d), str(RAY_TMP))
    for h in tb.hosts:
        _start_node(rc, h.index)
    _wait_alive(rc)
    return rc


def _start_node(rc: RayCluster, i: int) -> None:
    ray = ray_exe()
    assert ray is not None
    common = ["--num-cpus", str(CPUS), "--num-gpus", str(GPUS), "--object-store-memory", str(100 * 1024 * 1024),
              "--disable-usage-stats", f"--node-ip-address={rc.tb.host(i).mgmt_ip}"]
    if i == HEAD:
        _start(rc, i, [ray, "start", "--head", f"--port={PORT}", "--include-dashboard=false", *common])
    else:
        _start(rc, i, [ray, "start", f"--address={rc.address}", *common])


def _wait_alive(rc: RayCluster) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while alive_nodes(rc) != len(rc.tb.hosts):
        if time.monotonic() > deadline:
            raise RayError(f"{alive_nodes(rc)} of {len(rc.tb.hosts)} Ray nodes alive after {UP_TIMEOUT_S:.0f} s; "
                           f"see {STATE_DIR}/hN.out")
        time.sleep(0.5)


ALIVE = "import ray; ray.init(logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"


def alive_nodes(rc: RayCluster) -> int:
    """How many nodes Ray counts alive (asked from h1 as a driver); 0 when it does not answer."""
    try:
        p = rc.run(HEAD, [sys.executable, "-c", ALIVE], timeout=60)
    except subprocess.TimeoutExpired:
        return 0
    lines = p.stdout.strip().splitlines()
    return int(lines[-1]) if p.returncode == 0 and lines and lines[-1].isdigit() else 0


def down(tb: testbed.Testbed | None = None) -> list[str]:
    """SIGKILL every Ray process inside the hosts (by pid), unmount the hosts' /tmp/ray; what is left (empty
    when all is gone)."""
    if tb is None:
        if not testbed.namespaces():
            return []
        tb = testbed.Testbed()
    for _ in range(3):  # a dying raylet may start a worker meanwhile
        for h in tb.hosts:
            for pid, _cmd in ray_processes(tb, h.index):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.3)
    left = [f"h{h.index}: {pid} {cmd[:80]}" for h in tb.hosts for pid, cmd in ray_processes(tb, h.index)]
    for h in tb.hosts:
        if _mounted(tb, h.index):
            testbed.sh(*tb.enter(h.index), "umount", str(RAY_TMP), check=False)
    return left


def _up(argv: list[str]) -> int:
    if testbed.namespaces() and testbed.Testbed().owner != "cli":
        print("ray_testbed: a test session's testbed is up; wait for it to end", file=sys.stderr)
        return 1
    tb = testbed.Testbed() if testbed.namespaces() else testbed.up(int(argv[1]) if len(argv) > 1 else 3)
    rc = up(tb)
    print(f"Ray up: head {rc.address}, {len(tb.hosts)} node(s); python3 scripts/ray_testbed.py exec 1 ...")
    return 0


def _down(argv: list[str]) -> int:
    left = down()
    if "--keep-hosts" not in argv:
        left += testbed.down()
    for line in left:
        print(f"left: {line}", file=sys.stderr)
    return 1 if left else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "down", "status", "exec"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] in ("up", "down"):
        reason = missing_requirement()
        if reason:
            print(f"ray_testbed: {reason}", file=sys.stderr)
            return 1
        fd = testbed.lock(blocking=False)  # as testbed.py's CLI: held while this changes things
        if fd is None:
            print(f"ray_testbed: the testbed is in use by another session (lock {testbed.LOCK_FILE})", file=sys.stderr)
            return 1
        try:
            return _up(argv) if argv[0] == "up" else _down(argv)
        except testbed.TestbedError as err:
            print(f"ray_testbed: {err}", file=sys.stderr)
            return 1
        finally:
            os.close(fd)
    if not testbed.namespaces():
        print("ray_testbed: no testbed is up (python3 scripts/ray_testbed.py up)", file=sys.stderr)
        return 1
    tb = testbed.Testbed()
    rc = RayCluster(tb)
    if argv[0] == "status":
        for i, procs in rc.processes().items():
            print(f"h{i}: {len(procs)} Ray process(es)")
        print(f"alive nodes: {alive_nodes(rc)}")
        return 0
    os.execvpe(rc.argv(int(argv[1]), argv[2:])[0], rc.argv(int(argv[1]), argv[2:]), rc.env())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
