"""waiting.TransferWait, the wait the engine gives its MPI backend when it is made (instead of patching
the backend's wait while the background thread drives): a caller's thread waits in MPI_Wait after a few
MPI_Tests (spin mode: by the policy's wait_request, the behaviour before); the bound background thread
polls the request itself, yielding, until it completes or a caller blocks on the engine, then hands the
rest of the wait to the caller's wait."""
from __future__ import annotations

import threading

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
    tw = TransferWait(policy, lambda: 0)
    in_thread(tw.bind_background)  # another thread is the background one
    req = Request(5)
    tw.wait(req)
    assert policy.waited == [req] and req.tests == 0


def test_the_background_thread_polls_itself_until_done():
    policy = RecordingPolicy()
    tw = TransferWait(policy, lambda: 0)
    req = Request(50)

    def background():
        tw.bind_background()
        tw.wait(req)

    in_thread(background)
    assert policy.waited == [] and req.tests == 50


def test_the_background_thread_hands_over_once_a_caller_blocks():
    policy = RecordingPolicy()
    blocked = [0]
    tw = TransferWait(policy, lambda: blocked[0])
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


def test_a_caller_thread_outside_spin_mode_tests_a_few_times_then_waits_in_mpi():
    for mode in ("auto", "block"):
        tw = TransferWait(Policy(mode), lambda: 0)
        in_thread(tw.bind_background)
        quick, slow = Request(3), Request(10 ** 9)
        tw.wait(quick)
        tw.wait(slow)
        assert (quick.tests, quick.waits) == (3, 0)  # done while polled: no MPI_Wait
        assert (slow.tests, slow.waits) == (BLOCKED_TESTS, 1)


def test_the_background_thread_hands_over_to_mpi_wait_once_a_caller_blocks():
    blocked = [0]
    tw = TransferWait(Policy("block"), lambda: blocked[0])
    req = Request(10 ** 9)
    test = req.Test

    def test_then_block():
        blocked[0] = req.tests >= 20  # a caller enters wait() after 20 polls
        return test()

    req.Test = test_then_block

    def background():
        tw.bind_background()
        tw.wait(req)

    in_thread(background)
    assert req.waits == 1 and req.tests == 21 + BLOCKED_TESTS


def test_set_mode_switches_the_callers_wait_between_waits():
    policy = RecordingPolicy()
    tw = TransferWait(policy, lambda: 0)
    in_thread(tw.bind_background)
    policy.set_mode("auto")
    req = Request(10 ** 9)
    tw.wait(req)
    assert req.waits == 1 and policy.waited == []
    policy.set_mode("spin")
    tw.wait(req2 := Request(10 ** 9))
    assert policy.waited == [req2]
