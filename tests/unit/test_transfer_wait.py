"""waiting.TransferWait, the wait the engine gives its MPI backend when it is made (instead of patching
the backend's wait while the background thread drives): a caller's thread waits by the policy's
wait_request, or, under auto among more than 2 ranks, by whichever of that and MPI_Wait its tuner
measured faster; the bound background thread polls the request itself, yielding, until it completes or
a caller blocks on the engine, then hands the rest of the wait to the caller's wait."""
from __future__ import annotations

import threading
import time

from trainrun.runtime.transfer_tuner import EXPLORE
from trainrun.runtime.waiting import BLOCKED_TESTS, Policy, TransferWait


class Request:
    def __init__(self, done_after: int):
        self.left, self.tests, self.waits = done_after, 0, 0

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.tests += 1
        self.left -= 1
        return self.left <= 0

    def Wait(self) -> None:  # noqa: N802
        self.waits += 1
        self.left = 0


class RecordingPolicy(Policy):
    def __init__(self):
        super().__init__("spin")
        self.waited = []

    def wait_request(self, request, budget_s=0.0):
        self.waited.append(request)


def in_thread(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join(10)
    assert not t.is_alive()


def test_a_caller_thread_waits_by_the_policy():
    policy = RecordingPolicy()
    tw = TransferWait(policy, lambda: 0, 6)
    in_thread(tw.bind_background)  # another thread is the background one
    req = Request(5)
    tw.wait(req)
    assert policy.waited == [req] and req.tests == 0


def test_the_background_thread_polls_itself_until_done():
    policy = RecordingPolicy()
    tw = TransferWait(policy, lambda: 0, 6)
    req = Request(50)

    def background():
        tw.bind_background()
        tw.wait(req)

    in_thread(background)
    assert policy.waited == [] and req.tests == 50


def test_the_background_thread_hands_over_once_a_caller_blocks():
    policy = RecordingPolicy()
    blocked = [0]
    tw = TransferWait(policy, lambda: blocked[0], 6)
    req = Request(10 ** 9)

    def test_then_block():
        blocked[0] = req.tests >= 20  # a caller enters wait() after 20 polls
        req.left -= 1
        req.tests += 1
        return False

    req.Test = test_then_block

    def background():
        tw.bind_background()
        tw.wait(req)

    in_thread(background)
    assert policy.waited == [req] and req.tests == 21


class AutoRecording(Policy):
    """auto mode, never oversubscribed; records its wait_request calls (returning at once)."""

    def __init__(self):
        super().__init__("auto", NeverOversubscribed())
        self.waited = []

    def wait_request(self, request, budget_s=0.0):
        self.waited.append(request)


class NeverOversubscribed:
    cores = 64

    def running(self, now):
        return 1


class SlowWait(Request):
    """MPI_Wait takes 2 ms (the policy's way returns at once): the tuner must come to prefer the policy's."""

    def Wait(self) -> None:  # noqa: N802
        time.sleep(0.002)
        super().Wait()


def test_among_more_than_2_ranks_a_callers_transfers_measure_both_ways_then_keep_the_better():
    policy = AutoRecording()
    tw = TransferWait(policy, lambda: 0, 3)
    in_thread(tw.bind_background)
    reqs = [SlowWait(10 ** 9) for _ in range(2 * EXPLORE + 5)]
    for r in reqs:
        tw.wait(r, 1 << 20)
    measured = reqs[:2 * EXPLORE]
    assert [r.waits for r in measured] == [0] * EXPLORE + [1] * EXPLORE  # a block of the policy's, one of MPI_Wait
    assert all(r.tests == BLOCKED_TESTS for r in measured[EXPLORE:])    # a few MPI_Tests before MPI_Wait
    assert [r.waits for r in reqs[2 * EXPLORE:]] == [0] * 5              # then the better way only
    assert policy.waited == measured[:EXPLORE] + reqs[2 * EXPLORE:]


def test_a_quick_transfer_never_reaches_mpi_wait():
    tw = TransferWait(AutoRecording(), lambda: 0, 3)
    in_thread(tw.bind_background)
    for _ in range(EXPLORE):  # the policy's block first
        tw.wait(Request(3), 1 << 20)
    tw.wait(quick := Request(3), 1 << 20)  # MPI_Wait's block: done within the MPI_Tests
    assert (quick.tests, quick.waits) == (3, 0)


def test_between_2_ranks_or_outside_auto_a_caller_always_waits_by_the_policy():
    for mode, size in (("auto", 2), ("block", 6), ("spin", 6)):
        policy = AutoRecording()
        policy.set_mode(mode)
        tw = TransferWait(policy, lambda: 0, size)
        in_thread(tw.bind_background)
        reqs = [SlowWait(10 ** 9) for _ in range(2 * EXPLORE + 2)]
        for r in reqs:
            tw.wait(r, 1 << 20)
        assert policy.waited == reqs and not any(r.waits for r in reqs), mode


def test_the_background_thread_hands_over_to_the_callers_wait_once_a_caller_blocks():
    blocked = [0]
    policy = AutoRecording()
    tw = TransferWait(policy, lambda: blocked[0], 3)
    first = Request(10 ** 9)
    test = first.Test

    def test_then_block():
        blocked[0] = first.tests >= 20  # a caller enters wait() after 20 polls
        return test()

    first.Test = test_then_block

    def background():
        tw.bind_background()
        tw.wait(first, 1 << 20)   # the policy's block comes first
        for _ in range(EXPLORE - 1):
            tw.wait(Request(1), 1 << 20)
        tw.wait(later, 1 << 20)  # MPI_Wait's block (a caller is blocked by now)

    later = Request(10 ** 9)
    in_thread(background)
    assert policy.waited[0] is first and first.tests == 21
    assert later.waits == 1 and later.tests == BLOCKED_TESTS
