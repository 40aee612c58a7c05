"""The stuck watchdog's rule (runtime/rankhook.StuckWatch) and how the launcher names the absent ranks
(run/stall.describe), on fakes; the state-named stack report, on real stopped and zombie processes."""
import signal
import subprocess
import time

import pytest

from trainrun.runtime.rankhook import SLOWEST_TRANSFER_BPS, STUCK_OTHER_FACTOR, StuckWatch
from trainrun.diag.stack_report import render
from trainrun.diag.stacks import RankStack, Target, find_py_spy, proc_state, take_stacks
from trainrun.supervisor.stall import Stuck, describe


class FakeEngine:
    stall_timeout = 10.0

    def __init__(self):
        self.live = None
        self.transfers: list[int] = []

    def liveness(self):
        return self.live

    def waiting_on(self):
        return "allreduce 'x'"

    def transfers_in_progress(self):
        return self.transfers


def test_stuck_after_the_stall_timeout_with_no_round_completing_reported_once():
    e, w = FakeEngine(), StuckWatch()
    e.live = (5, 2, True)
    assert w.check([e], 0.0) is None
    assert w.check([e], 9.0) is None
    assert w.check([e], 10.5) == "10 allreduce 'x'"
    assert w.check([e], 20.0) is None  # once per stuck spell
    e.live = (6, 2, True)              # a round completed: a new spell may begin
    assert w.check([e], 21.0) is None
    assert w.check([e], 31.5) == "10 allreduce 'x'"


def test_not_stuck_while_rounds_complete_or_nothing_is_outstanding():
    e, w = FakeEngine(), StuckWatch()
    for t in range(30):
        e.live = (t, 0, True) if t % 3 else None  # rounds complete, or the rank waits for nothing
        assert w.check([e], float(t)) is None


def test_inside_a_transfer_the_limit_grows_with_its_bytes():
    e, w = FakeEngine(), StuckWatch()
    e.live, e.transfers = (1, 1, False), [int(50 * SLOWEST_TRANSFER_BPS)]  # a transfer of 50 s at the floor
    assert w.check([e], 0.0) is None
    assert w.check([e], 59.0) is None
    assert w.check([e], 60.5) is not None
    e2, w2 = FakeEngine(), StuckWatch()
    e2.live = (1, 1, False)  # neither in a round nor in an MPI transfer (a phase, a GPU wait)
    w2.check([e2], 0.0)
    assert w2.check([e2], 10.0 * STUCK_OTHER_FACTOR - 1) is None
    assert w2.check([e2], 10.0 * STUCK_OTHER_FACTOR) is not None


def where(rank):
    return f"rank {rank} on h{rank} (local rank 0)"


@pytest.mark.parametrize("ranks, stuck, returncodes, states, message, about", [
    (2, [Stuck(0, 3, "allreduce 'x'")], {}, {1: "T"}, "rank 1 on h1 (local rank 0) is stopped (state T) while rank 0 "
     "waited in allreduce 'x' (no collective round completed for 3 s)", 1),
    (3, [Stuck(2, 60, "allreduce 'x'"), Stuck(0, 61, "shutdown")], {1: 0}, {}, "rank 1 on h1 (local rank 0) exited 0 "
     "while ranks 0,2 waited in allreduce 'x' (no collective round completed for 60 s)", 1),
    (4, [Stuck(0, 3, "allreduce 'x'")], {}, {1: "D", 2: "D", 3: "Z"}, "ranks 1,2 are in uninterruptible sleep (state D): "
     "blocked in the kernel (disk, network filesystem, device) while rank 0 waited in allreduce 'x' (no collective "
     "round completed for 3 s); rank 3 is a zombie (state Z): it exited and was not reaped", 1),
    (2, [Stuck(1, 3, "allreduce 'x'")], {}, {}, "rank 0 on h0 (local rank 0) took no part in it (it runs: its stack is "
     "above) while rank 1 waited in allreduce 'x' (no collective round completed for 3 s)", 0),
    (2, [Stuck(0, 3, "allreduce 'x'"), Stuck(1, 3, "allreduce 'x'")], {}, {}, "ranks 0,1 waited in allreduce 'x' and no "
     "collective round completed for 3 s, though every rank waits (MPI delivers nothing: see the stacks above)", 0),
])
def test_describe_names_the_absent_ranks(ranks, stuck, returncodes, states, message, about):
    assert describe(stuck, list(range(ranks)), returncodes, states, where) == (message, about)


def test_stuck_and_stall_notices_parse():
    assert Stuck.parse(3, "stuck 60 allreduce 'x', broadcast 'y'") == Stuck(3, 60.0, "allreduce 'x', broadcast 'y'")
    assert Stuck.parse(0, "stall 1,4-6 10 'x', 'y' and 2 more") == Stuck(0, 10.0, "'x', 'y' and 2 more",
                                                                         frozenset({1, 4, 5, 6}))
    for bad in ("garbage", "stuck", "stuck x y", "stall", "stall 1", "stall a 10 'x'", "stall 1 ten 'x'"):
        assert Stuck.parse(3, bad) is None, bad


def test_a_stall_names_the_ranks_that_did_not_submit_whatever_they_do():
    """A StallError says who did not submit: those are named (even a rank in another collective),
    not inferred from the stacks; a rank waiting by its stack joins the waiting ones."""
    stall = Stuck(0, 10, "'x'", frozenset({1}))
    assert describe([stall], [0, 1, 2], {}, {}, where, in_call={2}) == (
        "rank 1 on h1 (local rank 0) took no part in it (it runs: its stack is above) while ranks 0,2 waited in "
        "'x' (not submitted by rank 1 within the 10 s stall timeout)", 1)
    assert describe([stall], [0, 1, 2], {}, {}, where, in_call={1, 2}) == (
        "rank 1 on h1 (local rank 0) waits in another collective (its stack is above) while ranks 0,2 waited in "
        "'x' (not submitted by rank 1 within the 10 s stall timeout)", 1)
    two = [Stuck(0, 10, "'x'", frozenset({1, 3})), Stuck(2, 10, "'x'", frozenset({1, 3}))]
    assert describe(two, [0, 1, 2, 3], {3: -9}, {1: "T"}, where) == (
        "rank 1 on h1 (local rank 0) is stopped (state T) while ranks 0,2 waited in 'x' (not submitted by ranks "
        "1,3 within the 10 s stall timeout); rank 3 was killed by SIGKILL", 1)


def test_stall_notice_from_a_stall_error():
    from trainrun.runtime.rankhook import stall_line
    from trainrun.runtime.exceptions import StallError

    assert stall_line(StallError("m", absent=(1, 2, 3, 7), names=("a", "b", "c", "d"), seconds=2.5)) == \
        "stall 1-3,7 2.5 'a', 'b', 'c' and 1 more"
    assert Stuck.parse(0, stall_line(StallError("m", absent=(5,), names=("x",), seconds=60))) == \
        Stuck(0, 60.0, "'x'", frozenset({5}))


def test_report_names_silent_states():
    stacks = [RankStack(1, "h", 11, "", error="is stopped (state T)", state="T"),
              RankStack(3, "h", 13, "", error="is stopped (state T)", state="T"),
              RankStack(5, "h", 15, "", error="is a zombie (state Z): it exited and was not reaped", state="Z")]
    text = render(stacks, "SIGUSR1")
    assert "ranks 1,3 are stopped (state T)\n" in text
    assert "rank 5 is a zombie (state Z): it exited and was not reaped\n" in text
    assert "no stack" not in text
    assert RankStack.from_dict(stacks[0].to_dict()) == stacks[0]


def test_take_stacks_names_a_stopped_and_a_zombie_process_without_py_spy():
    sleeper = subprocess.Popen(["sleep", "60"])
    zombie = subprocess.Popen(["true"])
    try:
        sleeper.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while (proc_state(sleeper.pid), proc_state(zombie.pid)) != ("T", "Z") and time.monotonic() < deadline:
            time.sleep(0.02)
        stopped, dead = take_stacks([Target(0, "h", sleeper.pid, None), Target(1, "h", zombie.pid, None)], find_py_spy())
        assert (stopped.state, stopped.error) == ("T", "is stopped (state T)")  # no py-spy error in it
        assert dead.state == "Z" and dead.error.startswith("is a zombie (state Z)")
    finally:
        sleeper.kill()
        sleeper.wait()
        zombie.wait()


def test_a_rank_whose_stack_is_in_a_trainrun_call_waits_too():
    """Rank 2's own report has not come yet when the stacks are in: its stack says it waits too."""
    message, about = describe([Stuck(0, 3, "allreduce 'x'")], [0, 1, 2], {}, {1: "T"}, where, in_call={0, 2})
    assert (message, about) == ("rank 1 on h1 (local rank 0) is stopped (state T) while ranks 0,2 waited in "
                                "allreduce 'x' (no collective round completed for 3 s)", 1)


def test_in_trainrun_call_reads_the_main_thread():
    from trainrun.diag.stack_report import in_trainrun_call
    from trainrun.diag.stacks import Frame, ThreadStack

    def stack(*files):
        frames = tuple(Frame("f", path, 1) for path in files)
        return RankStack(0, "h", 1, "py-spy", (ThreadStack("MainThread", True, frames),))

    assert in_trainrun_call(stack("/x/trainrun/runtime/engine.py", "/x/trainrun/numpy.py", "train.py"))
    assert not in_trainrun_call(stack("/usr/lib/python3.11/time.py", "train.py"))
    assert not in_trainrun_call(RankStack(0, "h", 1, "", error="is stopped (state T)", state="T"))
