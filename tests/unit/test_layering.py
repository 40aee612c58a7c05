"""Imports point down the layers written in docs/architecture.md ("Layers": that table is the one copy of
the rule; this test reads it from there). A module may import its own layer and the layers below it, never
one above; and the launcher's side and the ranks' side never import each other (the entry points may import
either, both import the shared layers). Every import counts, also those inside functions (they only postpone
the dependency to the first call) and `importlib.import_module("trainrun....")` with a literal name; imports
under `if TYPE_CHECKING:` do not (annotations only: a lower layer may name the type of a value handed down
to it, e.g. LaunchConfig). Nothing is imported, so torch, TensorFlow and mpi4py need not be installed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "launcher" / "trainrun"
DOC = ROOT / "docs" / "architecture.md"
SIDES = ("entry", "launcher", "ranks", "shared")


def read_layers(doc: str) -> list[tuple[str, str, list[str]]]:
    """(layer, side, its units) top first, from the markdown table after the "## Layers" heading: one row
    per layer, its side (SIDES) in the second column, its units in backticks in the third (a package, or a
    module: the planted test's `low.special`, which check_layers refuses; `__init__` is the package root). A module's unit is the longest one that
    is its name or a package above it."""
    section = doc.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or set(cells[0]) <= set("-: ") or cells[0] == "layer":
            continue
        assert len(cells) >= 3 and cells[1] in SIDES, f"a layer row needs a side of {SIDES}: {line!r}"
        units = re.findall(r"`([\w.]+)`", cells[2])
        assert units, f"a layer row names no module: {line!r}"
        layers.append((cells[0], cells[1], units))
    return layers


def module_names(root: Path) -> dict[str, Path]:
    """Name inside the package (`supervisor.job`; `__init__` for the root) -> file, for every .py."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> list[tuple[str, int]]:
    """(module of the package, line) for each import in module `name`, wherever it stands, except under
    `if TYPE_CHECKING:`. `from pkg import x` is `pkg.x` when that is a module, else `pkg`."""
    is_package = path.name == "__init__.py"
    here = [] if name == "__init__" else name.split(".")
    out = []

    def internal(dotted: str) -> str | None:
        if dotted == package:
            return "__init__"
        if dotted.startswith(package + "."):
            inner = dotted[len(package) + 1:]
            return inner if inner in modules else None
        return None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here if is_package else here[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join([package, *pkg, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if internal(f"{base}.{a.name}") else base for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == \
                "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            targets = [node.args[0].value]
        for target in targets:
            inner = internal(target)
            if inner is not None and inner != name:
                out.append((inner, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return out


def unit_of(name: str, units: list[str]) -> str | None:
    """The longest unit that is `name` or a package above it."""
    found = [u for u in units if name == u or name.startswith(u + ".")]
    return max(found, key=len) if found else None


def check_layers(root: Path, layers: list[tuple[str, str, list[str]]]) -> list[str]:
    """One line per problem: a module in no layer, a unit that names no module, an upward import, an
    import between the launcher's side and the ranks'."""
    modules = module_names(root)
    rank = {unit: i for i, (_, _, units) in enumerate(layers) for unit in units}
    units = list(rank)
    problems = [f"{u}: listed in more than one layer" for u in units if sum(u in us for _, _, us in layers) > 1]
    problems += [f"{u}: a module inside a package; the folders are the layers: move it to a package of its layer"
                 for u in units if "." in u]
    problems += [f"{u}: no such module or package" for u in units
                 if not any(m == u or m.startswith(u + ".") for m in modules)]
    layer_of = {}
    for name in modules:
        unit = unit_of(name, units)
        if unit is None:
            problems.append(f"{name}: in no layer (add it to the Layers table of docs/architecture.md)")
        else:
            layer_of[name] = rank[unit]
    for name, path in modules.items():
        if name not in layer_of:
            continue
        for target, line in imports_of(name, path, modules, root.name):
            if target not in layer_of:
                continue
            (here, side, _), (there, its_side, _) = layers[layer_of[name]], layers[layer_of[target]]
            if layer_of[target] < layer_of[name]:
                problems.append(f"{path.relative_to(root.parent)}:{line}: {name} ({here}) "
                                f"imports {target} ({there}), a layer above it")
            elif {side, its_side} == {"launcher", "ranks"}:
                problems.append(f"{path.relative_to(root.parent)}:{line}: {name} ({here}, {side} side) "
                                f"imports {target} ({there}, {its_side} side)")
    return problems


def test_imports_point_down_the_layers_of_the_architecture_doc():
    problems = check_layers(PACKAGE, read_layers(DOC.read_text()))
    assert not problems, "\n".join(problems)


def test_the_table_covers_both_sides_and_the_walk_sees_lazy_imports():
    layers = read_layers(DOC.read_text())
    units = [u for _, _, us in layers for u in us]
    for unit in ("cli", "launch", "supervisor", "fanout", "plan", "runtime", "torch", "errors"):
        assert unit in units, unit
    modules = module_names(PACKAGE)
    lazy = imports_of("runtime.lifecycle", modules["runtime.lifecycle"], modules, "trainrun")
    assert "runtime.rankhook" in [t for t, _ in lazy]  # imported inside init()


def test_a_planted_upward_import_fails(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "top.py").write_text("from pkg.low import base\n")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "base.py").write_text("from typing import TYPE_CHECKING\n"
                                         "if TYPE_CHECKING:\n    from pkg import top\n")
    (pkg / "low" / "special.py").write_text("from . import base\n")
    doc = ("# x\n\n## Layers\n\n| layer | side | modules | what |\n|---|---|---|---|\n"
           "| top | entry | `__init__` `top` | t |\n| special | launcher | `low.special` | s |\n"
           "| low | shared | `low` | l |\n\n## Next\n| no | entry | `top` | x |\n")
    layers = read_layers(doc)
    assert layers == [("top", "entry", ["__init__", "top"]), ("special", "launcher", ["low.special"]),
                      ("low", "shared", ["low"])]
    assert check_layers(pkg, layers) == [  # down, within a layer, and a type-only import up: only the unit is wrong
        "low.special: a module inside a package; the folders are the layers: move it to a package of its layer"]
    (pkg / "low" / "base.py").write_text("def f():\n    from ..low import special\n")
    (pkg / "other.py").write_text("import importlib\nimportlib.import_module('pkg.top')\n")
    assert check_layers(pkg, layers)[1:] == [
        "other: in no layer (add it to the Layers table of docs/architecture.md)",
        "pkg/low/base.py:2: low.base (low) imports low.special (special), a layer above it"]
    layers.append(("base", "shared", ["other"]))
    assert check_layers(pkg, layers)[-1] == "pkg/other.py:2: other (base) imports top (top), a layer above it"
    assert check_layers(pkg, layers + [("gone", "shared", ["nothing"])])[1] == "nothing: no such module or package"
    (pkg / "low" / "base.py").write_text("")
    (pkg / "other.py").write_text("from pkg.low import special\n")
    layers = [layers[0], ("ranks", "ranks", ["other"]), *layers[1:3]]  # down, but across the sides
    assert check_layers(pkg, layers)[1:] == [
        "pkg/other.py:1: other (ranks, ranks side) imports low.special (special, launcher side)"]


def package_cycles(root: Path) -> set[frozenset[str]]:
    """Pairs of packages (a top-level module counts as one) each of which imports the other."""
    modules = module_names(root)
    top = lambda name: name.split(".")[0]  # noqa: E731
    arrows = {(top(name), top(target)) for name, path in modules.items()
              for target, _ in imports_of(name, path, modules, root.name) if top(name) != top(target)}
    return {frozenset(a) for a in arrows if (a[1], a[0]) in arrows}


def test_the_only_packages_that_import_each_other_are_the_ones_the_map_explains():
    """docs/architecture.md's "Arrows back up" lists each pair as `a` <-> `b`: no other, and none stale."""
    section = DOC.read_text().split("**Arrows back up.**", 1)[1].split("\n\n", 1)[0]
    listed = {frozenset(pair) for pair in re.findall(r"`([\w.]+)` <-> `([\w.]+)`", section)}
    assert package_cycles(PACKAGE) == listed
    assert len(listed) <= 5
