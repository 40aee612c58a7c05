"""waiting.TransferWait, the wait the engine gives its MPI backend when it is made (instead of patching
the backend's wait while the background thread drives): a caller's thread waits by the policy's
wait_request; the bound background thread polls the request itself, yielding, until it completes or a
caller blocks on the engine, then hands the rest of the wait to the policy."""
from __future__ import annotations

import threading

from trainrun.runtime.waiting import Policy, TransferWait


class Request:
    def __init__(self, done_after: int):
        self.left, self.tests = done_after, 0

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.tests += 1
        self.left -= 1
        return self.left <= 0


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
