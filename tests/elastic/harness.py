"""Helpers of the elastic tests (tests/elastic, tests/cluster/test_elastic.py): a launcher run whose output
is read line by line while the test acts on the job, a discovery script backed by a file, process and
/dev/shm checks."""
from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).parents[2]
WORKER = str(Path(__file__).parent / "workers" / "elastic_train.py")
NUMPY_WORKER = str(Path(__file__).parent / "workers" / "elastic_numpy.py")


class LiveRun:
    """`python -m trainrun ARGS` with stdout read line by line (wait_for) and stderr collected."""

    def __init__(self, args: list[str], cwd, env: dict | None = None, launcher: list[str] | None = None):
        full_env = {**os.environ, "PYTHONPATH": str(REPO / "launcher"), **(env or {})}
        argv = (launcher or [sys.executable, "-m", "trainrun"]) + args
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                                     env=full_env)
        self.lines: list[str] = []
        self.err: list[str] = []
        self.timeline: list[tuple[float, str]] = []  # (seconds since start, stderr line)
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._q), daemon=True).start()
        self._err_thread = threading.Thread(target=self._collect_err, daemon=True)
        self._err_thread.start()

    def _collect_err(self):
        t0 = time.monotonic()
        for line in self.proc.stderr:
            self.err.append(line)
            self.timeline.append((time.monotonic() - t0, line.rstrip("\n")))

    @staticmethod
    def _pump(stream, q):
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    def wait_for(self, text: str, timeout: float = 120.0) -> str:
        """Read stdout until a line containing `text`; AssertionError with the output so far on timeout/EOF."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._q.put(None)
                break
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r}; stdout tail {self.lines[-15:]}; stderr {''.join(self.err)[-3000:]}")

    def finish(self, timeout: float = 180.0) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        while (line := self._q.get(timeout=10)) is not None:
            self.lines.append(line)
        self._err_thread.join(10)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.err)


def discovery(tmp_path, hosts: list[str]) -> tuple[Path, Path]:
    """(script, hosts file): the script prints the file; rewrite the file to change what it lists."""
    listing = tmp_path / "hosts.txt"
    listing.write_text("".join(f"{h}\n" for h in hosts))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(0o755)
    return script, listing


def procs_with(token: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or ()) and p.pid != os.getpid():
            out.append(p)
    return out


def wait_gone(token: str, seconds: float = 15.0) -> list:
    deadline = time.monotonic() + seconds
    while (left := procs_with(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def leftover_segments(stderr: str) -> list[str]:
    """/dev/shm segments (MPICH's, committed state's) of the jobs a `trainrun -v` run logged (`attempt N: job ID`); other users' MPI jobs
    (other test sessions) have their own names, so this is exact where a before/after listing is not."""
    from trainrun.mpiworld.shm import kvsname_for, shm_segment_pattern
    from trainrun.elasticjob.control import state_segments

    jobs = set(re.findall(r"attempt \d+: job ([0-9a-f]+)", stderr))
    assert jobs, "no job ids in the launcher's log (run it with -v)"
    patterns = [shm_segment_pattern(kvsname_for(j)) for j in jobs]
    mpich = [n for n in os.listdir("/dev/shm") if any(p.fullmatch(n) for p in patterns)]
    return mpich + [os.path.basename(p) for j in jobs for p in state_segments(j)]


def by_rank(lines: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in lines:
        tag, _, text = line.partition("<stdout>:")
        if tag.startswith("["):
            out.setdefault(int(tag.strip("[]")), []).append(text)
    return out


def steps_seen(lines: list[str]) -> list[tuple[int, int, int]]:
    """(step, size, restart) of rank 0's `step S size N restart R` lines, in order."""
    out = []
    for text in by_rank(lines).get(0, []):
        if text.startswith("step "):
            _, s, _, n, _, r = text.split()
            out.append((int(s), int(n), int(r)))
    return out
