"""The launcher's side of a host agent: AgentRanks drives one host's ranks through one channel.

The channel is a links.AgentLink: SSHLink (a paramiko session running `python -m trainrun.agent`
on the host) or PipeLink (a local subprocess, for tests). AgentRanks has the same interface as procs.LocalRanks, so the ProcessGroup treats a remote
host exactly like its own.

States: opened (HELLO read: host facts known) -> started (JOB sent) -> done (every rank reported, or
the channel ended, or the agent was silent for `heartbeat_timeout` s, or the launcher gave up on it
after SIGKILL: every unreported rank is then reported lost).
"""
from __future__ import annotations

import json
import selectors
import sys
import time

from trainrun import log
from trainrun import wire
from trainrun.errors import HostError
from trainrun.links import AgentLink, PipeLink, SSHLink
from trainrun.plan import ProcessSpec, spec_to_dict

LOST = 255  # returncode reported for ranks of a host whose agent or connection was lost
AGENT_PATIENCE = 4  # x heartbeat_timeout: how long an agent waits for a silent launcher


class AgentRanks:
    def __init__(self, link: AgentLink, facts: dict):
        self.link = link
        self.host = link.host
        self.facts = facts
        self.reader = wire.FrameReader()
        self.events = None
        self.specs: list[ProcessSpec] = []
        self._pending: set[int] = set()
        self._ended = False
        self.heartbeat_timeout = 15.0
        self._last_heard = self._last_beat = time.monotonic()

    def bind(self, specs: list[ProcessSpec], events, *, pmi: bool, python: str, env: dict[str, str],
             heartbeat_timeout: float = 15.0) -> None:
        """Give this agent its share of the job (sent on start). `env` (the launcher's forwarded
        variables) goes under each rank's own env; it travels in the channel, never on a command line.
        The agent gives up on a silent launcher after AGENT_PATIENCE x heartbeat_timeout (the launcher
        may be blocked writing to a paused pager; ranks then block too, so waiting long costs little)."""
        self.specs, self.events = specs, events
        self.heartbeat_timeout = heartbeat_timeout
        self._pending = {s.rank for s in specs}
        procs = [spec_to_dict(s) for s in specs]
        for p in procs:
            p["env"] = {**env, **p["env"]}
        self._job = {"procs": procs, "pmi": pmi, "python": python, "patience": AGENT_PATIENCE * heartbeat_timeout}
        if pmi and specs:
            from trainrun.pmi import kvsname_for

            self._job["kvsname"] = kvsname_for(specs[0].env["TRAINRUN_JOB_ID"])  # its shm segments to remove

    def start(self, sel: selectors.BaseSelector, watchdog) -> None:
        self._last_heard = time.monotonic()
        self.link.write(wire.json_frame(wire.JOB, self._job))
        sel.register(self.link.fileno(), selectors.EVENT_READ, lambda: self._on_readable(sel))

    def _on_readable(self, sel) -> None:
        out, err, ended = self.link.read()
        if out or err:
            self._last_heard = time.monotonic()
        if err:
            for line in err.decode(errors="replace").splitlines():
                log.warning("agent on %s: %s", self.host, line)
        for kind, rank, payload in self.reader.feed(out):
            self._dispatch(kind, rank, payload)
        if ended and not self._ended:
            self._ended = True
            sel.unregister(self.link.fileno())
            self._lose(f"lost the agent on {self.host} (connection dropped or agent killed)")

    def _lose(self, message: str) -> None:
        """Report every rank not yet reported as lost (the host is gone for this job)."""
        if self._pending:
            self.events.on_host_lost(self.host, message)
            for rank in sorted(self._pending):
                self.events.on_exit(rank, LOST)
            self._pending.clear()

    def _dispatch(self, kind: bytes, rank: int, payload: bytes) -> None:
        if kind in wire.KIND_STREAM:
            self.events.on_output(rank, wire.KIND_STREAM[kind], payload)
        elif kind == wire.EXIT:
            self._pending.discard(rank)
            self.events.on_exit(rank, int(payload))
        elif kind == wire.PMI:
            self.events.on_pmi(rank, payload)
        elif kind == wire.FATAL:
            message, _, code = payload.decode().rpartition("|")
            self.events.on_host_failed(self.host, message, int(code))
        elif kind == wire.STARTED:
            log.info("%s: ranks started, pids %s", self.host, json.loads(payload))

    @property
    def running(self) -> int:
        return len(self._pending)

    def tick(self, now: float) -> None:
        """Heartbeats: send ours; a host silent for heartbeat_timeout is lost (hung, paused, cut off)."""
        if not self._pending:
            return
        if now - self._last_beat >= wire.HEARTBEAT_EVERY:
            self._last_beat = now
            self.link.write(wire.frame(wire.BEAT))
        silent = now - self._last_heard
        if silent > self.heartbeat_timeout:
            self._lose(f"no word from the agent on {self.host} for {silent:.0f}s (host hung or unreachable; "
                       "--heartbeat-timeout)")

    def abandon(self) -> None:
        """Stop waiting for this host (after SIGKILL went unanswered)."""
        self._lose(f"no answer from the agent on {self.host} after SIGKILL")

    def signal(self, sig: int) -> None:
        self.link.write(wire.frame(wire.SIGNAL, -1, str(int(sig)).encode()))

    def kill(self) -> None:
        self.link.write(wire.frame(wire.KILL))

    def pmi_send(self, rank: int, data: bytes) -> None:
        self.link.write(wire.frame(wire.PMI, rank, data))

    def disconnect(self) -> None:
        """Close the host's connection (after close())."""
        self.link.disconnect()

    def close(self, sel) -> None:
        """End the channel's input: the agent kills whatever is left and exits (see wait_closed)."""
        try:
            sel.unregister(self.link.fileno())
        except (KeyError, ValueError):
            pass
        self.link.shutdown()

    def wait_closed(self) -> None:
        """Wait until the agent has ended; called after close() on every group, so agents end in parallel.
        A host that stopped answering is not waited for."""
        if time.monotonic() - self._last_heard < self.heartbeat_timeout:
            self.link.wait(5.0)


def read_hello(link: AgentLink, timeout: float) -> AgentRanks:
    """Wait for the agent's HELLO; raises HostError if it fails to start (e.g. trainrun missing there)."""
    reader, errors, deadline = wire.FrameReader(), b"", time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(link.fileno(), selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                continue
            out, err, ended = link.read()
            errors += err
            for kind, _rank, payload in reader.feed(out):
                if kind == wire.HELLO:
                    agent = AgentRanks(link, json.loads(payload))
                    agent.reader = reader
                    return agent
            if ended:
                break
    finally:
        sel.close()
    text = errors.decode(errors="replace").strip().splitlines()
    last = text[-1] if text else "no output"
    if "No module named" in last and "trainrun" in last:
        raise HostError(link.host, "agent", f"trainrun is not installed for the remote Python ({last})", hint="pip install trainrun there, or pass --python")
    raise HostError(link.host, "agent", f"the trainrun agent did not start: {last}", hint="run trainrun --check")


def local_agent(host: str, timeout: float = 30.0) -> AgentRanks:
    """An agent in a local subprocess, for tests of the agent protocol."""
    return read_hello(PipeLink(host, [sys.executable, "-m", "trainrun.agent"]), timeout)


def python_module_command(python: str, module: str, *args: str) -> str:
    """The shell line that runs `python -m module args...` on a host: the requested interpreter if it
    exists there, else python3 (the --python rule)."""
    from trainrun.ssh import remote_command

    pick = 'p=$1; shift; [ -x "$p" ] || p=python3; exec "$p" -m "$@"'
    return remote_command(["sh", "-c", pick, "trainrun", python, module, *args])


def agent_command(python: str) -> str:
    return python_module_command(python, "trainrun.agent")


def ssh_options(cfg):
    """SSHOptions from the launch options (None fields fall back to the ssh config, then OpenSSH defaults)."""
    from trainrun import ssh

    kwargs = dict(port=cfg.ssh_port, identity_file=cfg.ssh_identity_file, strict=cfg.ssh_strict,
                  connect_timeout=cfg.ssh_timeout)
    if cfg.ssh_config:
        kwargs["ssh_config"] = cfg.ssh_config
    return ssh.SSHOptions(**kwargs)


def open_agents(hosts, cfg) -> dict[str, AgentRanks]:
    """Connect to every host in parallel, start an agent on each and read its HELLO.

    Raises HostsError with every host's cause (after closing the others) if any host fails.
    """
    from trainrun import ssh
    from trainrun.errors import HostsError

    clients = ssh.connect_all([str(h) for h in hosts], ssh_options(cfg), parallelism=cfg.ssh_parallelism)
    command = agent_command(cfg.python or sys.executable)
    links, agents, failures = [], {}, []
    try:
        for h in hosts:
            links.append(SSHLink(h.name, clients[str(h)], command))
        for link in links:  # started together above, so the HELLOs arrive in parallel
            try:
                agents[link.host] = read_hello(link, timeout=cfg.ssh_timeout + 30)
            except HostError as err:
                failures.append(err)
    finally:
        if failures or len(agents) < len(hosts):
            for link in links:
                link.close(wait=2.0)
            for client in clients.values():
                client.close()
    if failures:
        raise HostsError(failures)
    return agents
