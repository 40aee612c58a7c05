"""Print one JSON line: this rank's argv, interpreter, environment and CPU affinity."""
import json
import os
import stat
import sys


def pmi_fd_kind():
    """What PMI_FD names in this process: "socket", "other", "closed" or None (unset)."""
    fd = os.environ.get("PMI_FD")
    if fd is None:
        return None
    try:
        return "socket" if stat.S_ISSOCK(os.fstat(int(fd)).st_mode) else "other"
    except (OSError, ValueError):
        return "closed"


print(json.dumps({
    "argv": sys.argv[1:],
    "executable": sys.executable,
    "env": dict(os.environ),
    "affinity": sorted(os.sched_getaffinity(0)),
    "pid": os.getpid(),
    "pmi_fd": pmi_fd_kind(),
}), flush=True)
