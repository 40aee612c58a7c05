"""Pure parts of the diagnosis: first failure by time, the traceback tail, clock offsets, stack parsing
and grouping."""
import pytest

from trainrun.diag.stack_report import group_stacks, headline, render
from trainrun.diag.stacks import Frame, RankStack, ThreadStack, parse_faulthandler, parse_py_spy
from trainrun.fanout.clock import ClockOffset
from trainrun.supervisor.result import Failure, JobResult, named_rank, settle, tail_to_show


def f(rank, at, code=1):
    return Failure(code, f"rank {rank} failed", rank, (), at)


@pytest.mark.parametrize("failures, stopped_at, trigger, first, later", [
    ([f(0, 10.0), f(2, 9.5)], 10.1, 0, 2, [0]),            # reported later, happened first
    ([f(0, 10.0), f(1, 10.5)], 10.1, 0, 0, [1]),           # after the stop began: a consequence only
    ([f(0, 10.2)], 10.1, 0, 0, []),                         # the trigger itself always counts
    ([], None, None, None, []),
    ([f(3, 5.0), f(1, 4.0), f(2, 6.0)], None, 3, 1, [3, 2]),
])
def test_settle(failures, stopped_at, trigger, first, later):
    trig = next((x for x in failures if x.rank == trigger), None)
    got_first, got_later = settle(failures, stopped_at, trig)
    assert (got_first.rank if got_first else None) == first
    assert [x.rank for x in got_later] == later



STOPPED = "trainrun.runtime.exceptions.HorovodInternalError: trainrun: rank 0 stopped: it exited with an unhandled exception"


@pytest.mark.parametrize("tails, first, later", [
    # rank 1 raised the runtime's "rank 0 stopped" error before rank 0 (the cause) had finished exiting
    ({1: ("Traceback (most recent call last):", STOPPED), 0: ("RuntimeError: boom",)}, 0, [1]),
    ({1: (STOPPED, "", "  "), 0: ("RuntimeError: boom",)}, 0, [1]),       # trailing blank lines
    ({1: (STOPPED,), 2: ("x",)}, 1, [2]),                                  # rank 0 did not fail: no one to blame
    ({1: (STOPPED, "more", "lines", "after"), 0: ("y",)}, 1, [0]),         # not among its last lines
    ({1: ("ValueError: rank 0 stopped: in the user's own words",), 0: ("y",)}, 1, [0]),  # not the runtime's error
])
def test_settle_blames_the_rank_the_error_names(tails, first, later):
    failures = [Failure(1, f"rank {r} failed", r, tail, 10.0 + 0.1 * i) for i, (r, tail) in enumerate(tails.items())]
    got_first, got_later = settle(failures, 20.0, failures[0])
    assert got_first.rank == first
    assert [x.rank for x in got_later] == later


def test_named_rank_and_its_reason():
    assert named_rank(Failure(1, "x", 1, ("Traceback ...", STOPPED + "; collectives cannot complete (...)"))) == \
        (0, "it exited with an unhandled exception")
    assert named_rank(Failure(1, "x", 1, (STOPPED,))) == (0, "it exited with an unhandled exception")
    assert named_rank(Failure(1, "x", 1, ("RuntimeError: boom",))) is None


def test_summary_says_earlier_for_a_consequence_that_exited_first():
    cause = Failure(1, "rank 0 on h (local rank 0) exited with code 1", 0, ("RuntimeError: boom",), 10.3)
    consequence = Failure(1, "rank 1 on h (local rank 1) exited with code 1", 1, (STOPPED,), 10.0)
    text = JobResult(exit_code=1, failure=cause, consequences=[consequence]).summary(2)
    assert "rank 1 on h (local rank 1) exited with code 1, 0.30s earlier: " in text

TB = ["noise"] * 50 + [
    "Traceback (most recent call last):",
    '  File "train.py", line 40, in <module>',
    "    main()",
    '  File "train.py", line 30, in main',
    "    step()",
    "ValueError: bad batch",
    "after 1", "after 2", "after 3", "after 4", "after 5",
]


@pytest.mark.parametrize("tail, shown", [
    (["a", "b"], ["a", "b"]),
    ([str(i) for i in range(30)], [str(i) for i in range(20, 30)]),
    (TB, TB[50:56] + ["after 1", "after 2", "after 3"]),
    (["Traceback (most recent call last):"] + ['  File "x.py", line 1, in f', "    f()"] * 40 + ["RecursionError: deep"],
     ["Traceback (most recent call last):", "  ..."] + ['  File "x.py", line 1, in f', "    f()"] * 12 + ["RecursionError: deep"]),
])
def test_tail_to_show(tail, shown):
    assert tail_to_show(tail) == shown


def test_summary_names_first_and_consequences():
    r = JobResult(exit_code=137, failure=Failure(137, "rank 2 on h2 (local rank 0) was killed by SIGKILL", 2, ("x",), 1.0,
                                                   "out of memory: the kernel's OOM killer killed it (...)"),
                  consequences=[Failure(1, "rank 0 on h1 (local rank 0) exited with code 1", 0, ("ConnectionResetError: by peer",), 1.25)])
    text = r.summary(4)
    assert text.splitlines()[0] == "trainrun: rank 2 on h2 (local rank 0) was killed by SIGKILL (the first failure); stopped all 4 rank(s)"
    assert "trainrun: rank 2: out of memory" in text
    assert "  rank 0 on h1 (local rank 0) exited with code 1, 0.25s later: ConnectionResetError: by peer" in text


def test_clock_offset_takes_the_shortest_round_trip():
    c = ClockOffset()
    assert c.offset == 0.0 and c.error is None
    c.add(100.0, 105.6, 101.0)   # round trip 1.0: offset 5.1 +- 0.5
    c.add(200.0, 205.02, 200.02)  # round trip 0.02: offset 5.01 +- 0.01
    c.add(300.0, 306.0, 300.5)
    assert c.offset == pytest.approx(5.01) and c.error == pytest.approx(0.01)
    assert c.to_launcher(1005.01) == pytest.approx(1000.0)


FH = """Thread 0x00007fe26c81d6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007fe26d299b80 (most recent call first):
  File "/w/train.py", line 3 in slow
  File "/w/train.py", line 9 in <module>
"""


def test_parse_faulthandler_main_thread_first():
    threads = parse_faulthandler(FH, main_ident=0x7FE26D299B80)
    assert [t.main for t in threads] == [True, False]
    assert threads[0].frames == (Frame("slow", "/w/train.py", 3), Frame("<module>", "/w/train.py", 9))


def test_parse_py_spy_json():
    doc = [{"pid": 5, "thread_name": "worker", "os_thread_id": 6, "frames": [{"name": "run", "filename": "/t.py", "line": 2, "module": None}]},
           {"pid": 5, "thread_name": "MainThread", "os_thread_id": 5, "frames": [
               {"name": "clock_nanosleep", "filename": "libc.so.6", "line": 0, "module": "/lib/libc.so.6"},
               {"name": "main", "filename": "/t.py", "line": 7, "module": None}]}]
    threads = parse_py_spy(doc)
    assert threads[0].main and threads[0].frames[0].native and not threads[0].frames[1].native


def stack(rank, *frames):
    return RankStack(rank, "h", 100 + rank, "py-spy", (ThreadStack("MainThread", True, tuple(Frame(*x) for x in frames)),))


API = "/site-packages/trainrun/runtime/api.py"
ENGINE = "/site-packages/trainrun/runtime/engine.py"


def test_grouping_cuts_at_the_call_into_trainrun():
    waiting = [stack(r, ("_drive_until", ENGINE, 340 + r), ("allreduce", API, 82), ("step", "/w/train.py", 42)) for r in (0, 2, 3)]
    sleeping = stack(1, ("read", "/usr/lib/python3.11/socket.py", 700), ("__next__", "/w/loader.py", 30), ("step", "/w/train.py", 40))
    groups = group_stacks(waiting + [sleeping])
    assert [g[0] for g in groups] == [[0, 2, 3], [1]]
    assert headline(groups[0][1].threads[0].frames) == "allreduce <- step (train.py:42)"
    assert headline(sleeping.threads[0].frames) == "read (socket.py:700) <- __next__ (loader.py:30)"
    text = render(waiting + [sleeping, RankStack(4, "h", 9, "", error="py-spy: denied")], "SIGUSR1", missing=[5, 6, 7])
    assert "ranks 0,2,3: allreduce <- step (train.py:42)" in text
    assert "rank 4: no stack: py-spy: denied" in text and "ranks 5-7: no answer from their host" in text


def test_rank_stack_round_trips_as_json():
    s = stack(3, ("f", "/a.py", 1))
    assert RankStack.from_dict(s.to_dict()) == s
