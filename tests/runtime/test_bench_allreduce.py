"""scripts/bench_allreduce.py keeps running: a `--quick --paths-only` smoke run on 2 ranks writes its
report with every call-path row, the issue's target table and the floors under it. It asserts the
report's shape, never a speed (speed is the benchmark's to report, not a test's to time)."""
import re
from pathlib import Path

import pytest

from tests.runtime.launch import run_ranks

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_allreduce.py"


def test_call_paths_report_has_every_row_target_and_floor(tmp_path):
    out = tmp_path / "paths.md"
    proc = run_ranks(SCRIPT, 2, ["--paths-only", "--quick", "--out", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    rows = dict(re.findall(r"^\| (.+?) \| ([\d.]+ [um]s) \| [\d.]+x \(", text, re.M))
    for size in ("4 KiB", "16 MiB"):
        for path in ("raw `Allreduce(IN_PLACE)`", "raw `Allreduce` into a fresh output",
                     "torch `allreduce_(t)` unnamed", "torch `allreduce(t)` unnamed, out of place",
                     "NumPy `allreduce_(x)` unnamed"):
            assert f"{path}, {size}" in rows, f"no row {path}, {size}:\n{text}"
    for path in ("raw: one fused call", "raw: one memcpy in, the fused call, one memcpy out (the floor of a copied group)",
                 "torch `grouped_allreduce_` unnamed", "torch 160 `allreduce_async_` unnamed"):
        assert f"160 x 4 KiB, {path}" in rows, f"no row 160 x 4 KiB, {path}:\n{text}"
    targets = re.findall(r"^\| (.+?) \| ([\d.]+x(?:, [\d.]+x)?) \| (yes|no) \|$", text, re.M)
    assert len(targets) == 11, text
    assert re.search(r"^The floor of a copied group .* is [\d.]+x \([\d.]+-[\d.]+\) of one fused raw call",
                     text, re.M), text
    assert re.search(r"^4 KiB: the floor of a torch out-of-place call .* is [\d.]+x", text, re.M), text
