"""The per-host agent (`python -m trainrun.agent`) that a fan-out engine starts on every remote host.

It reports its host's facts (HELLO), waits for its share of the job (JOB), starts those ranks with
the same LocalRanks the launcher uses for its own host, and relays their output, exits (with the time
and OOM verdict), PMI lines, runtime progress and stall notices over stdout as frames (wire.py), taking
SIGNAL/KILL/PMI/DUMP frames on stdin. It answers each launcher BEAT at once with its own clock, so the
launcher can put the exit times on its own clock.

Cleanup contract: when stdin reaches EOF (the launcher closed the channel, died, or the connection
dropped), SIGTERM arrives, or the launcher has been silent for the JOB's `patience` (its heartbeat timeout:
a cut network sends no EOF), the agent SIGKILLs every process group of its ranks, the trees below them and
every process of the job on its host that left them (it is a child subreaper: supervisor/reaper.py), and exits. A
write to the launcher that blocks (a full channel) is given up on by the same silence rule. If the agent
itself is killed, its Watchdog does the same; if it is stopped (SIGSTOP) for `patience` seconds, the
Watchdog kills it and its ranks. HELLO carries the agent's pid and start time, so that the launcher can
kill this agent's tree over a fresh connection when it stops answering (supervisor/reaper.py's main).
When all its ranks have exited it exits 0 -- unless the job is elastic (AgentJob.elastic): then it
cleans up after the ranks (SIGKILL of their groups, /dev/shm), sends DONE and waits for the next JOB (a
restart) or EOF, keeping its host's committed-state segment (elasticjob/control.py) across attempts; it removes the
segment when it exits, and its Watchdog does if it is killed.
"""
from __future__ import annotations

import json
import os
import select
import selectors
import signal
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from trainrun.wire import agent_frames as wire
from trainrun.wire.agent_messages import AgentJob, Beat, DumpReply, DumpRequest, ExitReport
from trainrun.errors import TrainrunError
from trainrun.facts.collect import launch_facts
from trainrun.supervisor.groups import ExitInfo
from trainrun.supervisor.local import LocalRanks
from trainrun.supervisor.watchdog import Watchdog

if TYPE_CHECKING:
    from trainrun.elasticjob.control import ControlServer
    from trainrun.elasticjob.spares import SparePool


class LauncherGone(Exception):
    """A write to the launcher stayed blocked past the patience without word from it."""


class Agent:
    def __init__(self, out_fd: int = 1, in_fd: int = 0):
        self.out_fd, self.in_fd = out_fd, in_fd
        self.reader = wire.FrameReader()
        self.ranks: LocalRanks | None = None
        self.sel = selectors.DefaultSelector()
        self.done = False
        self.patience = float("inf")  # seconds of launcher silence before giving up (from the JOB)
        self.kvsname: str | None = None  # the MPI world's name, to remove its /dev/shm segments here
        self.elastic = False
        self.restartable = False  # a parameter-server job's host: stay until the launcher closes the channel
        self.control: ControlServer | None = None  # an elastic job's ControlServer; its SegmentStore lives as long as the agent
        self.spares: SparePool | None = None  # an elastic job's warm ranks (--warm-ranks), kept between attempts
        self._last_heard = self._last_beat = time.monotonic()
        self.batch_time = time.time()  # RankEvents: when the loop woke for the events it dispatches

    def send(self, data: bytes) -> None:
        """Write a frame to the launcher; raises LauncherGone when the channel stays full while the launcher
        has been silent for the patience (a cut network: nothing drains the channel, no EOF comes)."""
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except BrokenPipeError:  # the launcher is gone: stdin EOF follows and ends us
                return
            except BlockingIOError:
                if time.monotonic() - self._last_heard > self.patience:
                    raise LauncherGone() from None
                select.select([], [self.out_fd], [], 1.0)
                continue
            view = view[n:]

    # RankEvents
    def on_output(self, rank: int, stream: int, data: bytes) -> None:
        self.send(wire.frame(wire.STREAM_KIND[stream], rank, data))

    def on_exit(self, rank: int, returncode: int, info: ExitInfo | None = None) -> None:
        report = ExitReport(returncode, info.at if info else time.time(), info.oom if info else None)
        self.send(wire.frame(wire.EXIT, rank, report.to_bytes()))

    def on_pmi(self, rank: int, data: bytes) -> None:
        self.send(wire.frame(wire.PMI, rank, data))

    def on_host_lost(self, host: str, message: str) -> None:
        """Not reported by LocalRanks (it runs on this host)."""

    def on_host_failed(self, host: str, message: str, exit_code: int) -> None:
        """Not reported by LocalRanks (start-up errors are raised, then sent as FATAL)."""

    def on_progress(self, rank: int, perf: str = "") -> None:
        self.send(wire.frame(wire.PROGRESS, rank, perf.encode()))

    def on_stall(self, rank: int, notice: str) -> None:
        self.send(wire.frame(wire.STALL, rank, notice.encode()))

    def on_stacks(self, request: int, stacks: list) -> None:
        self.send(wire.frame(wire.STACKS, -1, DumpReply(request, tuple(stacks)).to_bytes()))

    def _on_stdin(self, watchdog: Watchdog) -> None:
        try:
            data = os.read(self.in_fd, 1 << 16)
        except BlockingIOError:  # stdin and stdout may share one file (a socket): it is non-blocking too
            return
        if not data:
            self.done = True  # launcher gone: the finally in run() kills everything
            return
        self._last_heard = time.monotonic()
        for kind, rank, payload in self.reader.feed(data):
            if kind == wire.JOB:
                self._start(AgentJob.from_bytes(payload), watchdog)
            elif kind == wire.SIGNAL and self.ranks:
                self.ranks.signal(int(payload))
            elif kind == wire.KILL and self.ranks:
                self.ranks.kill()
            elif kind == wire.RESTART and self.ranks:
                self.ranks.restart(rank, int(payload))
            elif kind == wire.PMI and self.ranks:
                self.ranks.pmi_send(rank, payload)
            elif kind == wire.DUMP:
                req = DumpRequest.from_bytes(payload)
                if self.ranks:
                    self.ranks.dump(req.request, req.py_spy)
                else:
                    self.on_stacks(req.request, [])
            elif kind == wire.BEAT and (beat := Beat.from_bytes(payload)) is not None:
                self.send(wire.frame(wire.BEAT, -1, Beat(time.time(), beat.t).to_bytes()))  # for the clock offset
            elif kind == wire.NOTIFY and self.control is not None:
                self.control.notify(json.loads(payload))

    def _start(self, job: AgentJob, watchdog: Watchdog) -> None:
        self.patience = job.patience
        if job.patience != float("inf"):
            watchdog.stop_limit(job.patience)
        self.kvsname = job.kvsname
        self.elastic = job.elastic
        self.restartable = job.restartable
        if job.elastic and self.control is None:
            from trainrun.elasticjob.control import ControlServer, SegmentStore

            self.control = ControlServer(SegmentStore())
            watchdog.unlink_on_death(self.control.store.prefix)  # the state segments, if this agent is killed
        if job.elastic and job.warm and self.spares is None:
            from trainrun.elasticjob.spares import SparePool

            self.spares = SparePool(watchdog)
        if self.control is not None and job.procs:  # new segments are named after the attempt's job
            self.control.store.job_id = job.procs[0].env.get("TRAINRUN_JOB_ID", "nojob")
        # .py programs run on the agent's interpreter (the launcher's path may not exist here)
        specs = [replace(s, argv=(sys.executable, *s.argv[1:])) if s.argv and s.argv[0] == job.python else s
                 for s in job.procs]
        self.ranks = LocalRanks(specs, pmi=job.pmi, control=self.control if job.elastic else None,
                                spares=self.spares if job.elastic else None)
        try:
            self.ranks.start(self.sel, watchdog, self)
        except TrainrunError as err:
            self.send(wire.frame(wire.FATAL, -1, f"{err}|{err.exit_code}".encode()))
            if job.elastic:  # stay for the next attempt: report every rank ended, then DONE
                for spec in specs:
                    self.on_exit(spec.rank, err.exit_code)
                self._end_attempt()
            else:
                self.done = True
            return
        self.send(wire.json_frame(wire.STARTED, {str(r): x.proc.pid for r, x in self.ranks.ranks.items()}))

    def _end_attempt(self) -> None:
        """An elastic job's attempt ended here: nothing of it is left, then DONE (the launcher waits for it)."""
        assert self.ranks is not None  # an attempt's ranks end once
        self.ranks.kill()
        self.ranks.close(self.sel)
        self.ranks = None
        if self.kvsname:
            from trainrun.mpiworld.shm import remove_shm_segments

            remove_shm_segments(self.kvsname)
        self.send(wire.frame(wire.DONE))

    def run(self) -> int:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        # SIGTERM (scancel of a Slurm step or allocation, a host shutting down): kill the ranks, then exit
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "done", True))
        watchdog = Watchdog()
        from trainrun.supervisor.reaper import stat

        me = stat(os.getpid())
        hello = {**launch_facts(with_nics=True).to_json(), "agent": f"{me.pid}:{me.start}" if me else None}
        self.send(wire.json_frame(wire.HELLO, hello))
        os.set_blocking(self.out_fd, False)  # send() bounds a blocked write by the patience
        self.sel.register(self.in_fd, selectors.EVENT_READ, lambda: self._on_stdin(watchdog))
        try:
            while not self.done:
                ready = self.sel.select(0.05)
                self.batch_time = time.time()
                for key, _ in ready:
                    key.data()
                now = time.monotonic()
                if now - self._last_beat >= wire.HEARTBEAT_EVERY:
                    self._last_beat = now
                    self.send(wire.frame(wire.BEAT, -1, Beat(time.time()).to_bytes()))
                if now - self._last_heard > self.patience:
                    sys.stderr.write(f"trainrun agent: no word from the launcher for {now - self._last_heard:.0f}s; killing the ranks\n")
                    break
                if self.ranks is not None:
                    self.ranks.tick(now)
                    if not self.ranks.running and not self.restartable:
                        if not self.elastic:
                            break
                        self._end_attempt()
        except LauncherGone:
            sys.stderr.write(f"trainrun agent: the channel to the launcher stayed full and no word from it for "
                             f"{self.patience:.0f}s; killing the ranks\n")
        finally:
            if self.ranks is not None:
                self.ranks.kill()
                self.ranks.close(self.sel)
            if self.spares is not None:
                self.spares.close()
            watchdog.close()
            if self.control is not None:
                self.control.store.remove()
            if self.kvsname:
                from trainrun.mpiworld.shm import remove_shm_segments

                remove_shm_segments(self.kvsname)
        return 0

