"""A rank that starts two processes no environment sweep can find, then ends as told.

    escapees.py TOKEN MODE      MODE: ok (exit 0), fail (rank 1 exits 3, the others sleep), sleep

Each rank starts (1) `env -i setsid PYTHON -c sleep TOKEN-rR-setsid &` from a shell that exits (an orphan
with an empty environment in a session of its own) and (2) a double-forked daemon exec'd with an empty
environment (TOKEN-rR-daemon). Both sleep 1000 s. The rank prints `up` once both run, then follows MODE.
Tests find them by TOKEN in their command line (all simulated hosts share one PID namespace)."""
import os
import shlex
import subprocess
import sys
import time

token, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
sleeper = "import time; time.sleep(1000)"
mine = f"{token}-r{rank}-"

cmd = f"env -i setsid {shlex.quote(sys.executable)} -c {shlex.quote(sleeper)} {mine}setsid >/dev/null 2>&1 </dev/null &"
subprocess.run(["sh", "-c", cmd], check=True)

pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execve(sys.executable, [sys.executable, "-c", sleeper, f"{mine}daemon"], {})
    os._exit(0)
os.waitpid(pid, 0)


def running() -> int:
    n = 0
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                n += mine.encode() in f.read()
        except OSError:
            pass
    return n


deadline = time.monotonic() + 20
while running() < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print("up", running(), flush=True)
if mode == "ok" or (mode == "fail" and rank != 1):
    if mode == "fail":
        time.sleep(120)
    sys.exit(0)
if mode == "fail":
    time.sleep(0.5)
    sys.exit(3)
time.sleep(120)
