"""trainrun.run's wire (pure): the call in the environment, outcome lines in and out of the output stream,
and horovodrun's --slots-per-host wrapper text."""
import os

from trainrun.horovodrun.slots import with_slots
from trainrun.wire.runfunc_lines import (ENV_PIECE, LINE_CHARS, MAX_ENV_BYTES, PIECE_CHARS, Collector, call_env,
                                   outcome_lines, read_call)


def test_call_round_trips_through_the_environment_in_pieces():
    blob = os.urandom(300_000)
    env = call_env(blob)
    assert all(len(v) <= PIECE_CHARS for k, v in env.items() if k.startswith(ENV_PIECE)) and len(env) > 2
    assert read_call(env) == blob


def test_call_too_big_for_the_environment():
    assert call_env(os.urandom(MAX_ENV_BYTES)) is None


def test_outcome_lines_are_taken_out_and_reassembled():
    blob = os.urandom(LINE_CHARS * 2)  # several lines
    c = Collector("abc")
    shown = []
    for line in outcome_lines("abc", 0, 1, blob).splitlines(keepends=True):
        shown.append(c.feed(b"[1]<stdout>:" + line))
    assert shown == [None] * len(shown) and len(shown) > 2
    assert c.outcomes() == {(0, 1): blob} and c.order == [(0, 1)]


def test_other_output_and_other_nonces_pass_through():
    c = Collector("abc")
    assert c.feed(b"[0]<stdout>:hello\n") == b"[0]<stdout>:hello\n"
    foreign = b"[0]<stdout>:" + outcome_lines("zzz", 0, 0, b"x")
    assert c.feed(foreign) == foreign and c.outcomes() == {}


def test_a_partial_line_before_the_outcome_is_shown_ended():
    c = Collector("abc")
    line = b"[0]<stdout>:no newline" + outcome_lines("abc", 2, 0, b"v")
    assert c.feed(line) == b"[0]<stdout>:no newline\n"
    assert c.outcomes() == {(2, 0): b"v"}


def test_slots_per_host_wrapper_text():
    assert with_slots("h1\nh2:4\n# note\n\n", 2) == "h1:2\nh2:4\n# note\n\n"
    assert with_slots("", 3) == ""
