"""What runs inside Ray for `trainrun --ray`: one NodeProcesses actor per node of the job, the parent of that
node's trainrun processes (the agent, and --check-style modules such as the NIC probe), relaying their
stdin/stdout/stderr bytes through Ray's own RPC (no port is opened; ray_engine.py is the launcher's end).

Contract (each point is a way something could be left running):
- A child is started by one long-lived thread of the actor with PR_SET_PDEATHSIG = SIGTERM (the signal
  follows the thread that forked, so never a pool thread that may end), and with its stdin a pipe from the
  actor: when the actor's process dies (ray.kill, its placement group removed, the driver gone, the node's
  raylet gone) the agent gets SIGTERM and EOF, and it kills its ranks on either.
- `read(key, wait)` is a long poll: it returns as soon as bytes are there, or after `wait` s, so one call
  in flight per child carries its output; `ended` is True once the child's stdout and stderr are closed.
- The environment of a child is the actor's, less what Ray sets for its workers (RAY_*, the thread and
  device limits it gives a zero-CPU actor), plus `env` (the engine's: the GPUs Ray assigned).
This module imports nothing of Ray at import time: the engine wraps the class with `ray.remote`.
"""
from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

# set by Ray for its worker processes; a rank must see the node's own environment, as over SSH
RAY_SET = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONBREAKPOINT")


def child_env(environ: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The environment of a child of the actor: `environ` less Ray's worker settings, plus `extra`. Pure."""
    env = {k: v for k, v in environ.items() if not k.startswith("RAY_") and k not in RAY_SET}
    env.update(extra)
    return env


class _Child:
    """One child process and what it wrote that was not read yet."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.out = bytearray()
        self.err = bytearray()
        self.open = 2  # stdout and stderr not yet at EOF
        self.cond = threading.Condition()
        for stream, buf in ((proc.stdout, self.out), (proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, buf), daemon=True).start()

    def _pump(self, stream: Any, buf: bytearray) -> None:
        fd = stream.fileno()
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            with self.cond:
                if data:
                    buf += data
                else:
                    self.open -= 1
                self.cond.notify_all()
            if not data:
                return


class NodeProcesses:
    """The actor (wrapped by ray.remote in ray_engine.py; threaded: a read may wait while a write goes on)."""

    def __init__(self) -> None:
        self._children: dict[str, _Child] = {}
        self._spawns: queue.Queue = queue.Queue()
        import ctypes

        self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        threading.Thread(target=self._spawner, daemon=True, name="trainrun-spawner").start()

    def node(self) -> dict[str, Any]:
        """Where this actor runs: Ray's node id and IP, the hostname, the worker's interpreter."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "python": sys.executable, "pid": os.getpid()}

    def gpu_ids(self) -> list[str]:
        """The GPUs Ray gave this actor's bundle (its num_gpus)."""
        import ray

        return [str(g) for g in ray.get_gpu_ids()]

    def _spawner(self) -> None:
        while True:
            argv, env, done, ready = self._spawns.get()
            try:
                done.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, env=env, start_new_session=True,
                                             preexec_fn=self._die_with_parent))
            except OSError as err:
                done.append(err)
            ready.set()

    def _die_with_parent(self) -> None:
        self._prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG

    def spawn(self, key: str, argv: list[str], env: dict[str, str]) -> int:
        """Start `argv` as child `key`; its pid. Raises OSError when it cannot start."""
        done: list = []
        ready = threading.Event()
        self._spawns.put((argv, child_env(dict(os.environ), env), done, ready))
        ready.wait()
        result = done[0]
        if isinstance(result, OSError):
            raise result
        self._children[key] = _Child(result)
        return int(result.pid)

    def read(self, key: str, wait: float) -> tuple[bytes, bytes, bool]:
        """(stdout bytes, stderr bytes, ended) of child `key`, waiting up to `wait` s for any."""
        child = self._children[key]
        with child.cond:
            child.cond.wait_for(lambda: child.out or child.err or not child.open, wait)
            out, err = bytes(child.out), bytes(child.err)
            child.out.clear()
            child.err.clear()
            ended = not child.open and not out and not err
        return out, err, ended

    def write(self, key: str, data: bytes) -> bool:
        """Bytes to child `key`'s stdin; False once it is closed."""
        stdin = self._children[key].proc.stdin
        try:
            assert stdin is not None
            stdin.write(data)
            stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def close_stdin(self, key: str) -> None:
        stdin = self._children[key].proc.stdin
        try:
            assert stdin is not None
            stdin.close()
        except OSError:
            pass

    def wait(self, key: str, timeout: float) -> int | None:
        """Child `key`'s exit status, or None if it still runs after `timeout` s."""
        try:
            return self._children[key].proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, key: str) -> None:
        """SIGKILL child `key`'s process group (its own session)."""
        proc = self._children[key].proc
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
