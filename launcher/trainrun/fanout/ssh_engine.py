"""The SSH fan-out engine: one paramiko connection per host, an agent per host on its own session.

Sessions have no pty: the agent's stdin EOF, not SIGHUP, is what tells it the launcher is gone. Every
remote command line is built by ssh.remote_command (shlex-quoted); environment for ranks travels inside
the agent's channel, never on a command line. `sweep` cleans up a host whose agent stopped answering over
a NEW connection (the old one may be wedged behind a stopped agent or a dead link).
"""
from __future__ import annotations

from trainrun.errors import HostError
from trainrun.fanout import ssh
from trainrun.fanout.python_pick import EarlyStderr, python_module_argv
from trainrun.plan.hosts import HostSpec


def python_module_command(python: str, module: str, *args: str, strict: bool = False) -> str:
    """The shell line that runs `python -m module args...` on a host: the requested interpreter if it
    exists there, else python3 (the --python rule, python_pick.py); with `strict` (--python given) that one only."""
    return ssh.remote_command(python_module_argv(python, module, *args, strict=strict))


class SSHLink:
    """An agent started over one SSH session."""

    def __init__(self, host: str, client, command: str):
        self.host = host
        self.client = client
        self._first_err = EarlyStderr(host)  # a no-python line there ends the start at once
        transport = client.get_transport()
        self.peer_address = transport.getpeername()[0]
        self.local_address = transport.sock.getsockname()[0]
        self.channel = transport.open_session()
        self.channel.exec_command(command)
        self.kernel_watch = ssh.watch_connection(client)  # a cut shows in seconds, not after --heartbeat-timeout

    def why_ended(self) -> str | None:
        """What the kernel said about the connection when it ended (ssh.connection_end), or None."""
        return ssh.connection_end(self.client)

    def fileno(self) -> int:
        return self.channel.fileno()

    def read(self) -> tuple[bytes, bytes, bool]:
        ch, out, err = self.channel, bytearray(), bytearray()
        while ch.recv_ready():
            out += ch.recv(1 << 16)
        while ch.recv_stderr_ready():
            err += ch.recv_stderr(1 << 16)
        ended = (ch.eof_received or ch.closed) and not ch.recv_ready()
        self._first_err.feed(err)
        return bytes(out), bytes(err), ended

    def write(self, data: bytes) -> None:
        try:
            self.channel.sendall(data)
        except OSError:
            pass  # the channel is gone; read() reports it

    def shutdown(self) -> None:
        try:
            self.channel.shutdown_write()
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        self.channel.status_event.wait(timeout)
        self.channel.close()

    def close(self, wait: float) -> None:
        self.shutdown()
        self.wait(wait)

    def disconnect(self) -> None:
        self.client.close()


class SSHModuleChannel:
    """`python -m MODULE` on one session (a bare channel, not exec_command's files: collecting those
    would send EOF and end a server that serves until its stdin closes)."""

    def __init__(self, channel):
        self.channel = channel
        self._out = channel.makefile("rb")

    def readline(self) -> bytes:
        return self._out.readline()

    def read(self) -> bytes:
        return self._out.read()

    def send(self, data: bytes) -> None:
        self.channel.sendall(data)

    def close_stdin(self) -> None:
        self.channel.shutdown_write()

    def exit_status(self) -> int:
        return self.channel.recv_exit_status()

    def stderr_text(self) -> str:
        ch, err = self.channel, bytearray()
        while ch.recv_stderr_ready():
            err += ch.recv_stderr(1 << 16)
        return err.decode(errors="replace")

    def close(self) -> None:
        self.channel.close()


class SSHEngine:
    """FanoutEngine over SSH (paramiko). `python`: the interpreter asked for on remote hosts; `strict_python`:
    it was given with --python, so no other is taken in its place."""

    name = "ssh"
    reaches_local = False

    def __init__(self, opts: ssh.SSHOptions, python: str, parallelism: int = 64, strict_python: bool = False):
        self.opts, self.python, self.parallelism, self.strict_python = opts, python, parallelism, strict_python
        self.clients: dict = {}
        self.targets: dict[str, str] = {}  # host name -> what was connected to (user@host:port)

    def reach(self, hosts: list[HostSpec]) -> dict[str, HostError]:
        """Connect to every host at once (at most `parallelism` in flight); a UsageError (bad ssh config)
        propagates."""
        clients, failures = ssh.connect_each([str(h) for h in hosts], self.opts, self.parallelism)
        names = {str(h): h.name for h in hosts}
        self.targets.update({h.name: str(h) for h in hosts})
        self.clients.update({names[k]: c for k, c in clients.items()})
        return {names[k]: err for k, err in failures.items()}

    def start_agent(self, host: str) -> SSHLink:
        return SSHLink(host, self.clients[host], python_module_command(self.python, "trainrun.agent", strict=self.strict_python))

    def run_module(self, host: str, module: str, *args: str, python: str | None = None,
                   timeout: float = 30.0) -> SSHModuleChannel:
        """Raises OSError/EOFError/paramiko.SSHException when the connection is gone."""
        ch = self.clients[host].get_transport().open_session(timeout=timeout)
        ch.settimeout(timeout)
        ch.exec_command(python_module_command(python or self.python, module, *args, strict=self.strict_python and not python))
        return SSHModuleChannel(ch)

    def sweep(self, host: str, job_id: str, mark_host: str, agent: str | None,
              connect_timeout: float = 5.0, timeout: float = 15.0) -> str | None:
        """Over a fresh SSH connection to `host`, kill the tree of agent `agent` ("PID:START") and every
        process of job `job_id` marked for `mark_host` (supervisor/reaper.py). None when nothing is left, else why not."""
        from dataclasses import replace

        opts = replace(self.opts, connect_timeout=min(self.opts.connect_timeout, connect_timeout))
        try:
            client = ssh.connect(self.targets.get(host, host), opts)
        except HostError as err:
            return f"{err.stage}: {err.message}"
        except Exception as err:  # noqa: BLE001 - whatever stops the cleanup is reported, not raised
            return f"cannot connect: {err}"
        try:
            ch = client.get_transport().open_session(timeout=timeout)
            ch.settimeout(timeout)
            ch.exec_command(python_module_command(self.python, "trainrun.supervisor.reaper", job_id, mark_host,
                                                  *([agent] if agent else [])))
            if not ch.status_event.wait(timeout):
                return f"the cleanup did not answer in {timeout:g}s"
            out = ch.recv(4096).decode(errors="replace").strip() if ch.recv_ready() else ""
            code = ch.recv_exit_status()
            return None if code == 0 else f"processes left after the cleanup: {out or f'exit {code}'}"
        except Exception as err:  # noqa: BLE001 - paramiko raises many kinds
            return f"cleanup failed: {err}"
        finally:
            client.close()

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()
