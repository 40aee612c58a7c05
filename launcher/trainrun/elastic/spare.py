"""A warm rank: an interpreter that imports the framework before an elastic restart needs it, then becomes a rank.

    python -m trainrun.elastic.spare FD PROGRAM [ARGS...]

Started by the owner of a host's ranks (elasticjob/spares.py) with the rank's interpreter, working
directory and start-up environment while the job trains. It imports the frameworks that PROGRAM's source
imports (`preload`: torch and `torch._dynamo`, which the first `torch.optim` optimizer would import;
TensorFlow, Keras, NumPy), says READY on the socketpair FD and waits. At a restart the owner sends one
Handoff (wire/spare_handoff.py) with the new rank's descriptors; the spare takes the rank's environment,
working directory, CPU set and argv, and runs the program as `python PROGRAM` or `python -m MODULE` would
(`__name__ == "__main__"`, sys.path[0] the script's directory, an uncaught exception's traceback from the
program's frames and exit 1). A restarted rank so skips its interpreter's start and `import torch`: about
85% of a restart's time on a quiet machine (docs/benchmarks/elastic.md).

What a spare must not do before the hand-off: initialise MPI (mpi4py.MPI reads PMI_FD at import), read
a rank's variables, or open anything the rank would inherit. At EOF on FD (the owner ended it or died) it
exits 0. Its thread name is `trainrun-warm` while it waits (visible in `ps -e`), the interpreter's again
once it is a rank.
"""
from __future__ import annotations

import ast
import importlib
import os
import runpy
import socket
import sys
import traceback

from trainrun.wire.spare_handoff import PAD_VARIABLE, READY, Handoff, recv_handoff

WAITING_NAME = "trainrun-warm"
# what `import X` in a program means for the spare: the modules to import ahead (never mpi4py: see above)
_PRELOADS = {
    "torch": ("torch", "torch._dynamo"),
    "tensorflow": ("tensorflow",),
    "keras": ("keras",),
    "numpy": ("numpy",),
}
_ALIASES = {"horovod.torch": "torch", "trainrun.torch": "torch", "horovod.tensorflow": "tensorflow",
            "trainrun.tensorflow": "tensorflow", "horovod.keras": "keras", "trainrun.keras": "keras"}


def preload(source: str) -> list[str]:
    """The modules to import ahead for a program whose source is `source`, in a fixed order. Pure: the
    source is parsed, not run; a program that does not parse gets none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    frameworks = set()
    for name in names:
        top = name.split(".")[0]
        if top in _PRELOADS:
            frameworks.add(top)
        for prefix, framework in _ALIASES.items():
            if name == prefix or name.startswith(prefix + "."):
                frameworks.add(framework)
    return [m for fw in _PRELOADS if fw in frameworks for m in _PRELOADS[fw]]


def _module_path(name: str) -> str | None:
    """The file of module `name` on sys.path, found without importing it or its parent packages
    (importlib.util.find_spec would run their __init__, which may read the rank's variables too early)."""
    from importlib.machinery import PathFinder

    parts, spec, path = name.split("."), None, None
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec.origin if spec is not None else None


def _program_source(program: list[str]) -> str:
    """PROGRAM's source: a script's file, or a `-m` module's (found without importing it); "" if unknown."""
    try:
        if program[0] == "-m":
            path = _module_path(program[1])
        else:
            path = program[0]
        if not path:
            return ""
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (ImportError, OSError, IndexError, ValueError):
        return ""


def _set_name(name: str) -> None:
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def _show_environ(env: dict[str, str]) -> bool:
    """Make /proc/self/environ (what `ps e`, psutil and trainrun's sweep of a job's marked processes read: the
    environment block the kernel copied at exec) show the rank's variables, as a cold rank's does: they are
    written over the room its owner left at the block's end (PAD_VARIABLE), the variables before it keep
    their bytes (a library may hold a pointer into them). False, and nothing written, where it does not fit."""
    pad = f"{PAD_VARIABLE}=".encode()
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51 of proc(5)
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
        at = 0 if block.startswith(pad) else block.find(b"\0" + pad) + 1  # 0 also when it is not there
        if (at == 0 and not block.startswith(pad)) or len(block) != end - start:
            return False
        before = dict(e.split(b"=", 1) for e in block[:at].split(b"\0") if b"=" in e)
        new = b"".join(k.encode() + b"=" + v.encode() + b"\0" for k, v in env.items()
                       if before.get(k.encode()) != v.encode() and k != PAD_VARIABLE)
        room = len(block) - at - len(new) - len(pad) - 1
        if room < 0:
            return False
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start + at)
            mem.write(new + pad + b" " * room + b"\0")
        return True
    except (OSError, ValueError, IndexError):
        return False


def become(handoff: Handoff, fds: list[int]) -> None:
    """Turn this process into the rank `handoff` describes and run its program; returns when it ends."""
    env = handoff.with_fds(fds)
    os.environ.clear()  # the spare's strings leave libc's environ: the block is ours to write
    os.environ.update(env)
    _show_environ(env)
    os.chdir(handoff.cwd)
    if handoff.cpus is not None:  # every thread, as a cold rank bound before exec would have them
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), handoff.cpus)
            except OSError:
                pass
    program = list(handoff.argv[1:])
    if program[0] == "-m":
        sys.path[0] = handoff.cwd
        sys.argv = [program[1], *program[2:]]
        runpy._run_module_as_main(program[1], alter_argv=True)  # type: ignore[attr-defined]  # what `python -m` calls
        return
    script = os.path.abspath(program[0])
    sys.path[0] = os.path.dirname(os.path.realpath(script))  # as CPython computes it for `python SCRIPT`
    sys.argv = program
    try:
        runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:  # the traceback a cold `python SCRIPT` prints: from the script's frames on
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        traceback.print_exception(type(err), err, tb or err.__traceback__)
        sys.stderr.flush()
        sys.exit(1)


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    program = argv[1:]
    if not program:
        return 2
    with open("/proc/self/comm") as f:
        own_name = f.read().strip()
    for module in preload(_program_source(program)):
        try:
            importlib.import_module(module)
        except Exception:  # a rank would fail (or not) on its own import: no spare, a cold start
            return 3
    try:
        sock.sendall(READY)
    except OSError:  # the owner handed us a rank before we were ready and closed its end: the hand-off is queued
        pass
    _set_name(WAITING_NAME)
    got = recv_handoff(sock)
    sock.close()
    if got is None:
        return 0
    _set_name(own_name)
    become(*got)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
