"""The runtime's parts own their state (docs/architecture.md, "The runtime"): no class of
launcher/trainrun/runtime/ reads or writes another object's private fields. Two checks:
- every `x._name` (not a dunder) in those modules has `self` or `cls` as `x`; the few exceptions are
  Python's own documented private-looking APIs, listed in ALLOWED with why;
- every `self._name` a class uses is defined by that class (assigned to self, a method, a class
  attribute) or by one of its bases in the runtime: a mixin that works on fields another class's
  __init__ makes (as Engine's Driver, LoneOp and Completion once did) fails.
A part that needs another's state asks for it through a method or a public attribute, which makes the
hand-off visible."""
from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "launcher" / "trainrun" / "runtime"

ALLOWED = {
    "sys._current_frames",  # the stuck watchdog reads other threads' frames (documented CPython API)
    "os._exit",             # abort(): end a hung rank without MPI_Finalize
}


def private_accesses(source: str, filename: str = "<string>") -> list[str]:
    """`file:line: expr._attr` for each attribute access with a private name on something other than
    self/cls (and not in ALLOWED)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or (attr.startswith("__") and attr.endswith("__")):
            continue
        owner = ast.unparse(node.value)
        if owner in ("self", "cls") or f"{owner}.{attr}" in ALLOWED:
            continue
        found.append(f"{filename}:{node.lineno}: {owner}.{attr}")
    return found


def _defined(cls: ast.ClassDef) -> set[str]:
    """Private names a class defines: methods, class attributes, `self._x = ...` anywhere in it."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "self":
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)  # class-level assignments (and locals: harmless, they are not self._x)
    return names


def borrowed_fields(sources: dict[str, str]) -> list[str]:
    """`file:line: Class uses self._x` for each private name a class uses without defining it (itself
    or a base class among `sources`' classes, matched by name)."""
    classes = {}
    for filename, source in sources.items():
        for node in ast.walk(ast.parse(source, filename)):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (filename, node)
    own = {name: _defined(node) for name, (_, node) in classes.items()}

    def allowed(name: str, seen=()) -> set[str]:
        out = set(own[name])
        for base in classes[name][1].bases:
            b = ast.unparse(base)
            if b in classes and b not in seen:
                out |= allowed(b, seen + (name,))
        return out

    found = []
    for name, (filename, node) in classes.items():
        ok = allowed(name)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and ast.unparse(sub.value) in ("self", "cls") \
                    and sub.attr.startswith("_") and not sub.attr.startswith("__") and sub.attr not in ok:
                found.append(f"{filename}:{sub.lineno}: {name} uses self.{sub.attr}, which it does not define")
    return sorted(found)


def test_every_class_of_the_runtime_uses_only_the_private_fields_it_defines():
    sources = {str(f.relative_to(RUNTIME)): f.read_text() for f in sorted(RUNTIME.rglob("*.py"))}
    found = borrowed_fields(sources)
    assert not found, "private fields used by a class that does not own them:\n" + "\n".join(found)


def test_the_check_finds_a_mixin_using_fields_another_class_makes():
    sources = {"engine.py": "class Engine(Driver):\n    def __init__(self):\n        self._queue = []\n",
               "driver.py": "class Driver:\n    def step(self):\n        return self._queue or self._step()\n"
                            "    def _step(self):\n        return self._own\n"}
    assert borrowed_fields(sources) == ["driver.py:3: Driver uses self._queue, which it does not define",
                                        "driver.py:5: Driver uses self._own, which it does not define"]


def test_no_part_of_the_runtime_reads_another_s_private_fields():
    files = sorted(RUNTIME.rglob("*.py"))
    assert len(files) > 20, "the runtime's modules were not found"
    found = [hit for f in files for hit in private_accesses(f.read_text(), str(f.relative_to(RUNTIME)))]
    assert not found, "private fields read across objects:\n" + "\n".join(found)


def test_the_check_finds_a_private_read_through_another_object():
    """What the check catches (it would have caught the mixin Engine's parts writing each other's fields
    through a shared object, or a part reading `engine._driver._bycid`)."""
    source = ("class A:\n"
              "    def f(self, other):\n"
              "        self._mine = 1\n"
              "        other._theirs += 1\n"
              "        return self._queue._names, os._exit, x.__class__\n")
    assert private_accesses(source) == ["<string>:4: other._theirs", "<string>:5: self._queue._names"]
