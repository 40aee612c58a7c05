#!/usr/bin/env python3
"""How long the ranks of a lost host live on (issue 25 item 2), on the simulated hosts (scripts/testbed.py).

    .venv/bin/python scripts/bench_host_loss.py [--rounds N] [--out FILE]

Per case, a job `-H h1:1,hX:2` whose ranks each leave an `env -i setsid` sleeper and an empty-environment
daemon (tests/process/workers/escapees.py) is hit mid-run:
    stop   the agent on h2 gets SIGSTOP (sshd still answers: the launcher's fresh-connection sweep kills it)
    cut    h3's eth0 (the launcher's route) goes down (no fresh connection: the agent's own patience acts)
with --heartbeat-timeout 3 and 15 (the default). Times are from the hit: when the launcher exited (255)
and when the last process of the job on that host was gone (polled every 50 ms). Prints a Markdown table.
Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, machine_lines, testbed_session, write_out  # noqa: E402
from testbed import procs_with  # noqa: E402

ESCAPEES = str(REPO / "tests" / "process" / "workers" / "escapees.py")


def on_host(tb, i: int, pids) -> list[int]:
    return tb.on_host(i, pids)


def agent_on(tb, i: int) -> int:
    agents = procs_with("trainrun.agent")
    here = on_host(tb, i, agents)
    ppid = {p: int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) for p in here}
    return next(p for p in here if ppid[p] not in here)


def one(tb, case: str, heartbeat: float) -> tuple[float, float, str]:
    """(launcher exit, last process on the hit host gone), seconds after the hit; the summary's host line."""
    host = 2 if case == "stop" else 3
    token = f"hl{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(tb.ssh_config), "--heartbeat-timeout", str(heartbeat),
            "--ssh-timeout", "5", "-H", f"h1:1,h{host}:2", sys.executable, ESCAPEES, token, "sleep"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/tmp")
    agent = None
    try:
        for _ in range(3):
            proc.stdout.readline()
        if case == "stop":
            agent = agent_on(tb, host)
            os.kill(agent, signal.SIGSTOP)
        else:
            tb.run(host, ["ip", "link", "set", "eth0", "down"], check=True)
        t0 = time.monotonic()
        gone = []

        def watch():
            while on_host(tb, host, procs_with(token)) and time.monotonic() - t0 < 120:
                time.sleep(0.05)
            gone.append(time.monotonic() - t0)

        w = threading.Thread(target=watch)
        w.start()
        _, err = proc.communicate(timeout=180)
        exited = time.monotonic() - t0
        w.join()
        line = next((ln for ln in err.decode().splitlines() if f"h{host}: killed" in ln or f"h{host} unreachable" in ln), "")
        return exited, gone[0], line.removeprefix("trainrun: ")
    finally:
        if case == "cut":
            tb.run(host, ["ip", "link", "set", "eth0", "up"])
        if agent is not None:
            try:
                os.kill(agent, signal.SIGCONT)
            except OSError:
                pass
        proc.kill()
        proc.communicate()
        for pid in procs_with(token):
            os.kill(pid, signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    rows, notes = [], {}
    with testbed_session(3) as tb:
        for case in ("stop", "cut"):
            for hb in (3.0, 15.0):
                runs = [one(tb, case, hb) for _ in range(args.rounds)]
                ex = statistics.median(r[0] for r in runs)
                gone = statistics.median(r[1] for r in runs)
                rows.append(f"| {case} | {hb:g} s | {ex:.1f} s | {gone:.1f} s | {max(r[1] for r in runs):.1f} s |")
                notes[(case, hb)] = runs[-1][2]
    text = "\n".join([
        "# Ranks of a lost host (bench_host_loss.py)", "", *machine_lines(), f"- rounds per row: {args.rounds}", "",
        "| hit | --heartbeat-timeout | launcher exits (255) | last process there gone (median) | (max) |",
        "|---|---|---|---|---|", *rows, "", "What the summary said (last round):", "",
        *(f"- {case}, {hb:g} s: `{line}`" for (case, hb), line in notes.items()), ""])
    write_out(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
