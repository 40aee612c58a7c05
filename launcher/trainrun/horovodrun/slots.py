"""`python -m trainrun.horovodrun.slots N SCRIPT`: run a host discovery script and give its hosts that
print no slots N of them (horovodrun's --slots-per-host; trainrun's discovery counts a bare host as 1).
Prints `host:slots` lines; exits with the script's code (its stderr passes through)."""
from __future__ import annotations

import subprocess
import sys


def with_slots(text: str, slots: int) -> str:
    """Each non-empty, non-comment line `host` becomes `host:slots`; `host:n` stays."""
    out = []
    for line in text.splitlines():
        entry = line.strip()
        if entry and not entry.startswith("#") and ":" not in entry:
            entry = f"{entry}:{slots}"
        out.append(entry)
    return "\n".join(out) + ("\n" if out else "")


def main(argv: list[str]) -> int:
    slots, script = int(argv[0]), argv[1]
    r = subprocess.run([script], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    sys.stdout.write(with_slots(r.stdout, slots))
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
