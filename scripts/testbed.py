#!/usr/bin/env python3
"""Simulated hosts for trainrun's cluster tests: network namespaces, each with its own hostname and sshd.

    python3 scripts/testbed.py up [N]         bring up N hosts h1..hN (default 3), print the state dir, the
                                              hostfile (hN slots=2) and a launch command using them
    python3 scripts/testbed.py down           remove everything `up` made; safe any time, even after a
                                              half-finished `up`, and repeatable
    python3 scripts/testbed.py status         what is up
    python3 scripts/testbed.py exec I CMD...  run CMD inside host I (its network, hostname and mounts)

Stdlib only. Needs root, iproute2 (`ip netns`), util-linux (unshare, nsenter, setsid), ssh-keygen and
Debian's openssh-server (/usr/sbin/sshd).

Topology (nothing is routed off the box; the hosts have no default route):
    eth0     management 10.241.0.0/24, hN = 10.241.0.(N+1); the root namespace is 10.241.0.1 (link trt-root)
    eth1     data 10.242.0.0/24, hN = 10.242.0.(N+1); hosts only
    docker0  172.17.0.1/16 on every host: a local-only decoy with the same address everywhere
    eth2     10.243.0.3/24 on host 2 only: up, but its peer is attached to nothing (unreachable)
The bridges live in namespace trt-sw: a dockerd's iptables FORWARD DROP in the root namespace would break them.
Host hN is namespace trt-hN plus a holder process (`sleep infinity`) that owns the host's UTS namespace
(hostname hN), IPC namespace and mount namespace (/etc/hosts from the state dir, /sys of its network namespace,
a /dev/shm of its own); sshd and `exec` join the holder's namespaces, so stopping sshd keeps the host.
The hosts share one kernel and its PID namespace, but not shared memory: their own /dev/shm and SysV IPC keep
MPICH's segments apart, and their own IPC namespace makes UCX (which takes the same boot_id for the same
machine) treat the other hosts as remote (its shared-memory transports, CMA included, require the same IPC
namespace), so MPI between hosts goes over their NICs, as between real machines.

State dir (env TRAINRUN_TESTBED_STATE, default /tmp/trainrun-testbed): state.json, id_ed25519 (client key,
root login on every host), ssh_config (Host h1..hN), known_hosts, hostfile (`hN slots=2`), hosts, hN/.
One testbed per machine: LOCK_FILE serialises users (the CLI holds it while it changes things, the pytest
fixture for its whole session).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PREFIX = "trt-"
SWITCH_NS = PREFIX + "sw"
ROOT_LINK = PREFIX + "root"
MGMT, DATA, ISOLATED = "10.241.0", "10.242.0", "10.243.0"
DOCKER_ADDR = "172.17.0.1/16"
ISOLATED_HOST = 2
SSHD = "/usr/sbin/sshd"
STATE_DIR = Path(os.environ.get("TRAINRUN_TESTBED_STATE", "/tmp/trainrun-testbed"))
LOCK_FILE = Path("/tmp/trainrun-testbed.lock")
TOOLS = ("ip", "unshare", "nsenter", "setsid", "ssh-keygen")
ENTER = ("-n", "-u", "-i", "-m")   # the holder's namespaces a host's processes join: net, UTS, IPC, mounts

SSHD_CONFIG = """\
Port 22
ListenAddress 0.0.0.0
HostKey {d}/ssh_host_ed25519_key
PidFile {d}/sshd.pid
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile {state}/authorized_keys
StrictModes no
UseDNS no
X11Forwarding no
PrintMotd no
PrintLastLog no
MaxStartups 200:30:400
MaxSessions 200
"""


class TestbedError(Exception):
    """A step of up/down failed; the message names the command and its stderr."""

    __test__ = False  # not a pytest test class


def sh(*argv: str, check: bool = True) -> str:
    """Run argv, return stdout; raise TestbedError with stderr when it fails and `check`."""
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode:
        raise TestbedError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def missing_requirement() -> str | None:
    """Why a testbed cannot be built here (a one-line reason), or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in TOOLS:
        if not shutil.which(tool):
            return f"`{tool}` not found (apt-get install iproute2 util-linux openssh-client)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (apt-get install --no-install-recommends openssh-server)"
    if subprocess.run(["unshare", "--net", "--uts", "--ipc", "--mount", "true"], capture_output=True).returncode:
        return "cannot create namespaces here (unshare --net --uts --ipc --mount failed: no CAP_SYS_ADMIN?)"
    return None


def namespaces() -> list[str]:
    """This testbed's network namespaces that exist now (from `ip netns list`)."""
    names = [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(PREFIX))


@dataclass(frozen=True)
class Host:
    index: int
    name: str        # hN: hostname inside, ssh_config alias outside
    ns: str          # network namespace
    mgmt_ip: str     # eth0, reachable from the root namespace
    data_ip: str     # eth1, reachable from the other hosts only
    dir: Path        # host key, sshd_config, sshd.pid, sshd.log, holder.pid


class Testbed:
    """A testbed that is up, read from its state dir. Hosts are numbered from 1, like their names."""

    def __init__(self, state_dir: Path = STATE_DIR):
        self.state_dir = Path(state_dir)
        state = json.loads((self.state_dir / "state.json").read_text())
        self.owner: str = state["owner"]
        self.hosts = [Host(h["index"], h["name"], h["ns"], h["mgmt_ip"], h["data_ip"], Path(h["dir"]))
                      for h in state["hosts"]]
        self.ssh_config = self.state_dir / "ssh_config"
        self.key = self.state_dir / "id_ed25519"
        self.known_hosts = self.state_dir / "known_hosts"
        self.hostfile = self.state_dir / "hostfile"

    def host(self, i: int) -> Host:
        return self.hosts[i - 1]

    def holder_pid(self, i: int) -> int:
        return int((self.host(i).dir / "holder.pid").read_text())

    def on_host(self, i: int, pids) -> list[int]:
        """Those of `pids` that run inside host i (its UTS namespace: all hosts share one PID namespace)."""
        uts = os.readlink(f"/proc/{self.holder_pid(i)}/ns/uts")
        out = []
        for pid in pids:
            try:
                if os.readlink(f"/proc/{pid}/ns/uts") == uts:
                    out.append(pid)
            except OSError:
                pass
        return out

    def enter(self, i: int) -> list[str]:
        """The argv prefix that runs a command inside host i."""
        return ["nsenter", "-t", str(self.holder_pid(i)), *ENTER, "--"]

    @contextmanager
    def link_down(self, i: int, nic: str = "eth0") -> Iterator[float]:
        """Host i's `nic` down for the block (a cut network), up again after it whatever happens; yields the
        time.monotonic() of the cut."""
        assert self.run(i, ["ip", "link", "set", nic, "down"]).returncode == 0, f"h{i}: {nic} did not go down"
        try:
            yield time.monotonic()
        finally:
            self.run(i, ["ip", "link", "set", nic, "up"])

    def run(self, i: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(argv) inside host i; kwargs go to subprocess.run (default: text, captured)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.enter(i) + list(argv), **kwargs)

    def sshd_pid(self, i: int) -> int | None:
        """The pid of host i's listening sshd, or None when it is stopped."""
        try:
            pid = int((self.host(i).dir / "sshd.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start_sshd(self, i: int) -> None:
        """Start host i's sshd (no-op if running) and return once it answers with an SSH banner."""
        if self.sshd_pid(i) is None:
            h = self.host(i)
            sh(*self.enter(i), SSHD, "-f", str(h.dir / "sshd_config"), "-E", str(h.dir / "sshd.log"))
        _wait_banner(self.host(i).mgmt_ip)

    def stop_sshd(self, i: int) -> None:
        """Stop host i's listening sshd (open sessions live on); return once it is gone."""
        pid = self.sshd_pid(i)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            _wait(lambda: not _alive(pid), f"sshd {pid} did not exit")
        (self.host(i).dir / "sshd.pid").unlink(missing_ok=True)


def _wait(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TestbedError(f"timed out: {what}")
        time.sleep(0.02)


def _wait_banner(ip: str) -> None:
    def answers() -> bool:
        try:
            with socket.create_connection((ip, 22), timeout=1) as s:
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False
    _wait(answers, f"sshd on {ip}:22")


def up(n: int = 3, state_dir: Path = STATE_DIR, owner: str = "cli") -> Testbed:
    """Bring up n hosts. Raises TestbedError if one is already up; on any failure removes what it made."""
    if not 1 <= n <= 250:
        raise TestbedError(f"host count must be 1..250, not {n}")
    if namespaces():
        raise TestbedError(f"a testbed is already up ({', '.join(namespaces())}): run `testbed.py down` first")
    try:
        _build(n, Path(state_dir), owner)
    except BaseException:
        down(state_dir)
        raise
    return Testbed(state_dir)


def _build(n: int, st: Path, owner: str) -> None:
    shutil.rmtree(st, ignore_errors=True)
    st.mkdir(mode=0o700, parents=True)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation dir, normally made by systemd
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainrun-testbed", "-f", str(st / "id_ed25519"))
    shutil.copy(st / "id_ed25519.pub", st / "authorized_keys")
    hosts = [Host(i, f"h{i}", f"{PREFIX}h{i}", f"{MGMT}.{i + 1}", f"{DATA}.{i + 1}", st / f"h{i}")
             for i in range(1, n + 1)]
    (st / "hosts").write_text(_hosts_file(hosts))
    if n > 16:  # one ARP table for all namespaces: a full mesh overflows the default gc_thresh3 (1024)
        keys = [f"net.ipv4.neigh.default.gc_thresh{k}" for k in (1, 2, 3)]
        (st / "neigh.saved").write_text(json.dumps({k: sh("sysctl", "-n", k).strip() for k in keys}))
        need = 4 * n * n + 1024
        sh("sysctl", "-qw", f"{keys[1]}={need // 2}", f"{keys[2]}={need}")

    sh("ip", "netns", "add", SWITCH_NS)
    ipsw = ("ip", "-n", SWITCH_NS)
    sh(*ipsw, "link", "set", "lo", "up")
    for br in ("br0", "br1"):
        sh(*ipsw, "link", "add", br, "type", "bridge")
        sh(*ipsw, "link", "set", br, "up")
    sh("ip", "link", "add", ROOT_LINK, "type", "veth", "peer", "name", "root", "netns", SWITCH_NS)
    sh(*ipsw, "link", "set", "root", "master", "br0", "up")
    sh("ip", "addr", "add", f"{MGMT}.1/24", "dev", ROOT_LINK)
    sh("ip", "link", "set", ROOT_LINK, "up")

    for h in hosts:
        _build_host(h, st)
    _write_client_files(hosts, st, owner)
    for h in hosts:
        _wait_banner(h.mgmt_ip)


def _hosts_file(hosts: list[Host]) -> str:
    text = Path("/etc/hosts").read_text().rstrip("\n") + "\n"
    return text + "".join(f"{h.mgmt_ip} {h.name}\n{h.data_ip} {h.name}-data\n" for h in hosts)


def _write_client_files(hosts: list[Host], st: Path, owner: str, hostfile: bool = True) -> None:
    """known_hosts, ssh_config, state.json and (with `hostfile`) the hostfile for `hosts`, rewritten."""
    known = []
    for h in hosts:
        key = (h.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        names = [h.name, f"{h.name}-data", h.mgmt_ip, h.data_ip]
        if h.index == ISOLATED_HOST:
            names.append(f"{ISOLATED}.{h.index + 1}")
        known.append(f"{','.join(names)} {' '.join(key)}\n")
    (st / "known_hosts").write_text("".join(known))
    (st / "ssh_config").write_text(
        "".join(f"Host {h.name}\n  HostName {h.mgmt_ip}\n" for h in hosts)
        + f"Host h* {MGMT}.* {DATA}.* {ISOLATED}.*\n  User root\n  IdentityFile {st}/id_ed25519\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {st}/known_hosts\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  ConnectTimeout 5\n  LogLevel ERROR\n")
    if hostfile:
        (st / "hostfile").write_text("".join(f"{h.name} slots=2\n" for h in hosts))
    state = {"owner": owner, "hosts": [{**h.__dict__, "dir": str(h.dir)} for h in hosts]}
    (st / "state.json").write_text(json.dumps(state, indent=1))


def grow(n: int, state_dir: Path = STATE_DIR) -> Testbed:
    """Add hosts to the testbed that is up until it has n (no-op when it has as many), for tests that need
    more hosts than the session's testbed has, without taking it down: its hosts, keys, sshds and hostfile
    (still the hosts `up` made) stay as they are; ssh_config and known_hosts gain the new hosts."""
    tb = Testbed(state_dir)
    if n <= len(tb.hosts):
        return tb
    if n > 16:
        raise TestbedError("grow is for small testbeds (up to 16 hosts); bring up a bigger one with up(n)")
    st = tb.state_dir
    new = [Host(i, f"h{i}", f"{PREFIX}h{i}", f"{MGMT}.{i + 1}", f"{DATA}.{i + 1}", st / f"h{i}")
           for i in range(len(tb.hosts) + 1, n + 1)]
    hosts = tb.hosts + new
    with open(st / "hosts", "r+") as f:  # in place: every host's /etc/hosts is a bind mount of this inode
        f.write(_hosts_file(hosts))
        f.truncate()
    try:
        for h in new:
            _build_host(h, st)
    finally:
        _write_client_files([h for h in hosts if (h.dir / "holder.pid").exists()], st, tb.owner, hostfile=False)
    for h in new:
        _wait_banner(h.mgmt_ip)
    return Testbed(state_dir)


def _build_host(h: Host, st: Path) -> None:
    h.dir.mkdir()
    ipn = ("ip", "-n", h.ns)
    sh("ip", "netns", "add", h.ns)
    sh(*ipn, "link", "set", "lo", "up")
    legs = [("eth0", f"{h.name}-m", "br0", f"{h.mgmt_ip}/24"), ("eth1", f"{h.name}-d", "br1", f"{h.data_ip}/24")]
    if h.index == ISOLATED_HOST:
        legs.append(("eth2", f"{h.name}-x", None, f"{ISOLATED}.{h.index + 1}/24"))
    for ifname, swname, bridge, addr in legs:
        sh("ip", "link", "add", swname, "netns", SWITCH_NS, "type", "veth", "peer", "name", ifname, "netns", h.ns)
        sh("ip", "-n", SWITCH_NS, "link", "set", swname, *(("master", bridge) if bridge else ()), "up")
        sh(*ipn, "addr", "add", addr, "dev", ifname)
        sh(*ipn, "link", "set", ifname, "up")
    # No CONFIG_DUMMY on every kernel: a veth pair with both ends inside the host stands in for docker0.
    sh(*ipn, "link", "add", "docker0", "type", "veth", "peer", "name", "veth-docker0")
    sh(*ipn, "addr", "add", DOCKER_ADDR, "dev", "docker0")
    sh(*ipn, "link", "set", "veth-docker0", "up")
    sh(*ipn, "link", "set", "docker0", "up")

    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(h.dir / "ssh_host_ed25519_key"))
    (h.dir / "sshd_config").write_text(SSHD_CONFIG.format(d=h.dir, state=st))
    # `ip netns exec` gives a mount namespace with this netns's /sys; unshare adds the host's own UTS, IPC and
    # mounts, and a tmpfs on /dev/shm (before sshd starts, so every session and rank sees it: no shared memory
    # between hosts). setsid -f: the holder is re-parented to init, so nobody has to reap it. It must not
    # inherit a pipe.
    script = (f"hostname {h.name} && mount --bind {st}/hosts /etc/hosts"
              " && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm"
              f" && echo $$ > {h.dir}/holder.pid && exec sleep infinity")
    with open(h.dir / "holder.log", "w") as log:
        subprocess.run(["setsid", "-f", "ip", "netns", "exec", h.ns, "unshare", "--uts", "--ipc", "--mount",
                        "--propagation", "private", "sh", "-c", script], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=log, check=True)
    _wait(lambda: (h.dir / "holder.pid").exists() and (h.dir / "holder.pid").read_text().strip(),
          f"holder of {h.name}")
    sh("nsenter", "-t", (h.dir / "holder.pid").read_text().strip(), *ENTER, "--",
       SSHD, "-f", str(h.dir / "sshd_config"), "-E", str(h.dir / "sshd.log"))


def down(state_dir: Path = STATE_DIR) -> list[str]:
    """Remove every namespace, process in them, link and state `up` made; returns what is still left (empty
    when all is gone). Never raises for things that are already gone."""
    st = Path(state_dir)
    nss = namespaces()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = {int(p) for ns in nss for p in sh("ip", "netns", "pids", ns, check=False).split()}
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if _alive(p)}
            time.sleep(0.02)
    for ns in nss:
        sh("ip", "netns", "del", ns, check=False)  # also removes the veth pairs with an end inside
    if Path(f"/sys/class/net/{ROOT_LINK}").exists():
        sh("ip", "link", "del", ROOT_LINK, check=False)
    saved = st / "neigh.saved"
    if saved.exists():
        sh("sysctl", "-qw", *(f"{k}={v}" for k, v in json.loads(saved.read_text()).items()), check=False)
    shutil.rmtree(st, ignore_errors=True)
    left = namespaces() + ([ROOT_LINK] if Path(f"/sys/class/net/{ROOT_LINK}").exists() else [])
    return left + ([str(st)] if st.exists() else [])


def procs_with(token: str) -> list[int]:
    """Live (not zombie) processes anywhere on this machine, every host's included, whose command line
    contains `token` (this process excepted): how tests and benchmarks find a job's processes."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                hit = token.encode() in f.read()
        except OSError:
            continue
        if hit and _alive(int(name)):
            out.append(int(name))
    return out


def timed_lines(stream, into: list[tuple[float, str]]) -> threading.Thread:
    """A started daemon thread that appends (time.monotonic(), line) to `into` for each line of the binary
    `stream` until its end: when each line of a job's output came, for tests and benchmarks that time it."""
    def read() -> None:
        for line in iter(stream.readline, b""):
            into.append((time.monotonic(), line.decode(errors="replace").rstrip("\n")))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def kill_procs_with(token: str) -> None:
    """SIGKILL (after a SIGCONT, for stopped ones) every process procs_with(token) finds: a test's cleanup."""
    for pid in procs_with(token):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    """True while pid runs; a zombie counts as gone (daemons are re-parented to a pid 1 that may not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def lock(blocking: bool) -> int | None:
    """Take the machine-wide testbed lock; returns its fd (closing it releases), or None if busy."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def status(state_dir: Path = STATE_DIR) -> str:
    if not namespaces():
        return "down"
    try:
        tb = Testbed(state_dir)
    except (FileNotFoundError, ValueError, KeyError):
        return f"broken: namespaces {namespaces()} but no readable {state_dir}/state.json (run down)"
    lines = [f"up: {len(tb.hosts)} hosts, owner {tb.owner}, state {tb.state_dir}"]
    for h in tb.hosts:
        sshd = "sshd " + ("running" if tb.sshd_pid(h.index) else "stopped")
        lines.append(f"  {h.name}: ns {h.ns} eth0 {h.mgmt_ip} eth1 {h.data_ip} {sshd}")
    return "\n".join(lines)


def up_report(tb: Testbed, seconds: float) -> str:
    """What `up` prints: the state dir, an ssh line, the hostfile it wrote (path and contents) and a launch
    line that uses both, for a user to copy."""
    lines = [f"testbed up: {len(tb.hosts)} hosts in {seconds:.2f} s; state {tb.state_dir}",
             f"  ssh -F {tb.ssh_config} h1 hostname",
             f"hostfile {tb.hostfile}:",
             *(f"  {line}" for line in tb.hostfile.read_text().splitlines()),
             "launch:",
             f"  {_trainrun_exe()} --ssh-config {tb.ssh_config} --hostfile {tb.hostfile} train.py"]
    return "\n".join(lines) + "\n"


def _trainrun_exe() -> str:
    """This checkout's trainrun (its venv's) when it has one, else `trainrun` from PATH: for the launch line."""
    exe = Path(__file__).resolve().parents[1] / ".venv/bin/trainrun"
    return str(exe) if exe.exists() else "trainrun"


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "help"
    if cmd == "status":
        print(status())
        return 0
    if cmd == "exec" and len(argv) >= 3:
        tb = Testbed()
        os.execvp("nsenter", tb.enter(int(argv[1])) + argv[2:])
    if cmd not in ("up", "down"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    reason = missing_requirement()
    if reason:
        print(f"testbed: {reason}", file=sys.stderr)
        return 1
    fd = lock(blocking=False)
    if fd is None:
        print(f"testbed: in use by another session (lock {LOCK_FILE})", file=sys.stderr)
        return 1
    try:
        if cmd == "down":
            left = down()
            print("testbed down" + (f"; LEFT OVER: {left}" if left else ""))
            return 1 if left else 0
        t0 = time.monotonic()
        tb = up(int(argv[1]) if len(argv) > 1 else 3)
        print(up_report(tb, time.monotonic() - t0), end="")
        return 0
    except TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
