"""pytest imports a test file of a folder without __init__.py by its bare name (rootdir-relative "rootdir"
import mode), so two such files with one name in one run stop the whole collection ("import file mismatch"):
the suite runs as one pytest call (scripts/test.sh), so every test file outside a package needs its own name."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_files_outside_packages_have_unique_names():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
