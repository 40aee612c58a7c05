"""Every command a reader can paste from the guide (docs/) or the README is run here, or is run by a named test,
or is marked as needing what a test machine cannot have. The line before each shell block says which:

    <!-- run -->                      run here (below), in a folder where train.py is a small stand-in program
    <!-- tested-by: PATH[::TEST] -->  an existing test runs it (PATH must exist, TEST be defined in it)
    <!-- needs: KIND why -->          KIND: hosts, root, slurm, docker or gpu

A Python block may be marked `<!-- run -->` too. Every fenced block must name its language, and no command may
hide in an indented (unfenced) block. The benchmark pages and architecture.md are others' measurements and map,
checked for their links by the strict build only.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
SHELLS = ("bash", "sh", "shell", "console")
NEEDS = ("hosts", "root", "slurm", "docker", "gpu")
MARKER = re.compile(r"^<!-- (run|tested-by: (.+?)|needs: (\S+)(?: .*)?) -->$")
COMMAND_WORDS = re.compile(r"^    (trainrun |horovodrun |salloc |sbatch |srun |sudo |bash |python3? |\.venv/bin/|pip )")
# the stand-in for "your program": prints its rank and arguments
TRAIN_PY = 'import os, sys\nprint("rank", os.environ.get("RANK"), "of", os.environ.get("WORLD_SIZE"), sys.argv[1:])\n'


def pages() -> list[Path]:
    docs = REPO / "docs"
    out = [REPO / "README.md"]
    out += [p for p in sorted(docs.rglob("*.md"))
            if p.name != "architecture.md" and not (p.parent.name == "benchmarks" and p.name != "index.md")]
    return out


class Block(NamedTuple):
    page: str
    line: int
    lang: str
    marker: str | None
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(```+)(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = before if MARKER.match(before) else None
        out.append(Block(str(path.relative_to(REPO)), i + 1, fence.group(2), marker, "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return out


ALL = [b for p in pages() for b in blocks(p)]


def test_the_guide_has_blocks_of_every_kind():
    kinds = {MARKER.match(b.marker).group(1).split(":")[0] for b in ALL if b.marker}
    assert {"run", "tested-by", "needs"} <= kinds, kinds
    assert len([b for b in ALL if b.marker == "<!-- run -->"]) >= 6


def test_every_fenced_block_names_its_language():
    assert [b.id for b in ALL if not b.lang] == []


def test_every_shell_block_is_run_tested_or_needs_what_a_test_cannot_have():
    unmarked = [b.id for b in ALL if b.lang in SHELLS and b.marker is None]
    assert not unmarked, f"shell blocks without <!-- run -->, <!-- tested-by: ... --> or <!-- needs: ... -->: {unmarked}"
    for b in ALL:
        m = MARKER.match(b.marker or "")
        if m and m.group(3):
            assert m.group(3) in NEEDS, f"{b.id}: needs {m.group(3)!r}: say one of {NEEDS}"


def test_no_command_hides_in_an_indented_block():
    found = []
    for path in pages():
        fenced = False
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and COMMAND_WORDS.match(line) and (n == 0 or not lines[n - 1].strip()):
                found.append(f"{path.relative_to(REPO)}:{n + 1}: {line.strip()}")
    assert not found, "put commands in a fenced, marked block: " + "; ".join(found)


@pytest.mark.parametrize("block", [b for b in ALL if b.marker and b.marker.startswith("<!-- tested-by:")], ids=lambda b: b.id)
def test_the_named_test_exists(block):
    refs = [w.rstrip(",;") for w in MARKER.match(block.marker).group(2).split() if "/" in w and not w.startswith("(")]
    assert refs, f"{block.id}: name the test: tested-by: PATH[::TEST]"
    for ref in refs:
        path, _, name = ref.partition("::")
        assert (REPO / path).exists(), f"{block.id}: {path} does not exist"
        if name:
            assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), f"{block.id}: no test {ref}"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A folder like the repository's root (its examples, hostfiles, scripts and .venv linked in) where `train.py`
    is the stand-in program, with this checkout's trainrun first on PATH."""
    root = tmp_path_factory.mktemp("guide")
    for name in ("examples", "hostfiles", "scripts", "launcher", "docs"):
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(sys.prefix)  # the environment running the tests (the checkout's .venv in CI)
    (root / "train.py").write_text(TRAIN_PY)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return root, env


RUN = [b for b in ALL if b.marker == "<!-- run -->"]


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_block_runs(block, sandbox):
    root, env = sandbox
    if block.lang in SHELLS:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    elif block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        pytest.fail(f"{block.id}: cannot run a {block.lang!r} block")
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=240, start_new_session=True)
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{block.code}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
