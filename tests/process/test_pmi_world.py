"""Real MPICH ranks (mpi4py) form one MPI_COMM_WORLD served by trainrun.mpiworld.pmi over PMI_FD socket pairs.

The select() driver here is a stand-in for the launcher's event loop (job.py): it only moves bytes
between the rank sockets and `PmiServer`, and stops at an abort, when all sockets close, or at a deadline.
"""
import json
import os
import select
import socket
import subprocess
import sys
import time

import pytest

from trainrun.mpiworld import pmi, pmienv, shm

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.timeout(120)

WORLD = """
import json
from mpi4py import MPI
c = MPI.COMM_WORLD
shared = c.Split_type(MPI.COMM_TYPE_SHARED)
print(json.dumps({"rank": c.rank, "size": c.size, "sum": c.allreduce(c.rank + 1), "shared": shared.size}))
"""

ABORT = """
import time
from mpi4py import MPI
c = MPI.COMM_WORLD
c.allreduce(1)
if c.rank == 2:
    c.Abort(3)
time.sleep(60)
"""


class World:
    """Ranks started with PMI_FD socket pairs; `close()` kills them and unlinks the job's shm segments."""

    def __init__(self, program, ranks_per_node):
        size = sum(ranks_per_node)
        self.kvsname = shm.kvsname_for(f"test-{os.urandom(6).hex()}")
        self.server = pmi.PmiServer(pmi.PmiJob(size, self.kvsname, pmi.process_mapping(ranks_per_node)))
        self.procs, self.socks = [], {}
        self.initialized, self.finalized, self.errors, self.aborted = set(), set(), [], None
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("PMI_")}
        for rank in range(size):
            ours, theirs = socket.socketpair()
            with theirs:
                env = dict(base_env, **pmienv.socket_env(rank, size, theirs.fileno()))
                self.procs.append(subprocess.Popen([sys.executable, "-c", program], env=env,
                                                   pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, text=True))
            self.socks[rank] = ours

    def serve(self, deadline_s=60.0):
        """Relay PMI traffic until every rank closed its socket or one aborted; fail at the deadline."""
        open_socks = {s: r for r, s in self.socks.items()}
        end = time.monotonic() + deadline_s
        while open_socks and self.aborted is None:
            assert time.monotonic() < end, f"PMI world stuck; initialized={sorted(self.initialized)}"
            readable, _, _ = select.select(list(open_socks), [], [], 1.0)
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    del open_socks[sock]
                    continue
                step = self.server.feed(open_socks[sock], data)
                for rank, reply in step.replies:
                    self.socks[rank].sendall(reply)
                self.initialized.update(step.initialized)
                self.finalized.update(step.finalized)
                self.errors += step.errors
                self.aborted = self.aborted or step.aborted

    def outputs(self, timeout=30):
        return [json.loads(p.communicate(timeout=timeout)[0]) for p in self.procs]

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
            p.stdout.close()
        for s in self.socks.values():
            s.close()
        return shm.remove_shm_segments(self.kvsname)


@pytest.mark.parametrize("ranks_per_node, shared", [([4], [4, 4, 4, 4]), ([3, 1], [3, 3, 3, 1])])
def test_four_ranks_form_one_world(ranks_per_node, shared):
    world = World(WORLD, ranks_per_node)
    try:
        world.serve()
        results = world.outputs()
    finally:
        world.close()
    assert world.errors == [] and world.aborted is None
    assert world.initialized == world.finalized == {0, 1, 2, 3}
    assert [p.returncode for p in world.procs] == [0, 0, 0, 0]
    # The PMI_process_mapping we serve is what MPICH uses to decide which ranks share a node.
    assert results == [{"rank": r, "size": 4, "sum": 10, "shared": shared[r]} for r in range(4)]


def test_abort_is_reported_and_shm_segments_are_removed():
    world = World(ABORT, [4])
    try:
        world.serve()
    finally:
        removed = world.close()
    assert world.aborted[:2] == (2, 3)
    # MPICH does not end the ranks at MPI_Abort; close() killed them (SIGKILL) and found leaked segments.
    assert [p.returncode for p in world.procs] == [-9] * 4
    assert removed, "expected MPICH's /dev/shm segment of this job to be leaked by the kill"
    pattern = shm.shm_segment_pattern(world.kvsname)
    assert [n for n in os.listdir("/dev/shm") if pattern.fullmatch(n)] == []
