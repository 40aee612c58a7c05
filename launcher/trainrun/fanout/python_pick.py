"""Which interpreter runs `python -m MODULE` on a remote host, for every engine that starts one there (SSH,
srun): one shell argv, and the one-line error when the host has none. Pure, no transport.

The rule: the requested interpreter (a path, or a bare name looked up on PATH) when it is a file that can
run; else python3 from PATH, unless --python was given ("strict": that one or nothing). When there is none,
a stderr line is NO_PYTHON and the name, and the exit is 127 (rather than the shell's
"exec: python3: not found" or "Permission denied"); `no_python_error` turns that line into the HostError
`h2: python: python3 not found (pass --python)`.
"""
from __future__ import annotations

from trainrun.errors import HostError

NO_PYTHON = "trainrun-no-python:"
_PICK = ('g=$1; s=$2; shift 2; p=$g; case $p in */*) ;; *) p=$(command -v "$p") || p=$g ;; esac; '
         'if [ ! -f "$p" ] || [ ! -x "$p" ]; then '
         f'if [ "$s" = strict ]; then echo "{NO_PYTHON} $g" >&2; exit 127; fi; '
         f'p=$(command -v python3) && [ -f "$p" ] && [ -x "$p" ] || {{ echo "{NO_PYTHON} python3" >&2; exit 127; }}; '
         'fi; exec "$p" -m "$@"')


def python_module_argv(python: str, module: str, *args: str, strict: bool = False) -> list[str]:
    """The argv (`sh -c PICK ...`) that runs `python -m module args...` on a host under the rule above."""
    return ["sh", "-c", _PICK, "trainrun", python, "strict" if strict else "", module, *args]


def no_python_error(host: str, stderr: str) -> HostError | None:
    """The HostError for a host where the pick found no interpreter (a line of its stderr says which; srun may
    write its own lines before it), else None."""
    line = next((ln.strip() for ln in stderr.splitlines() if ln.strip().startswith(NO_PYTHON)), None)
    if line is None:
        return None
    name = line[len(NO_PYTHON):].strip()
    if name == "python3":
        return HostError(host, "python", "python3 not found", hint="pass --python")
    return HostError(host, "python", f"--python {name}: no such interpreter there", hint="check the path given to --python")


class EarlyStderr:
    """An agent's first KiB of stderr: raises the no-python HostError as soon as a whole line there says so
    (the agent link's read() feeds it, so the start ends at once with the one line)."""

    LIMIT = 1024

    def __init__(self, host: str):
        self.host, self._buf = host, b""

    def feed(self, err: bytes | bytearray) -> None:
        if err and len(self._buf) < self.LIMIT:
            self._buf += err
            whole = self._buf[:self._buf.rfind(b"\n") + 1]
            if whole and (failed := no_python_error(self.host, whole.decode(errors="replace"))):
                raise failed
