"""trainrun.run's result channel (runfunc/channel.py) on real Unix sockets in one process: a value streamed
whole, a cut stream or a foreign nonce leaving nothing, a path that is not there (another host) refused."""
import os
import socket

import pytest

from trainrun.runfunc.channel import ResultServer, send_outcome
from trainrun.wire.runfunc_lines import max_lines_bytes


def test_a_value_is_streamed_whole_and_keyed_by_attempt_and_rank(tmp_path):
    value = os.urandom(3 << 20)
    with ResultServer(str(tmp_path), "n1") as server:
        assert send_outcome(server.path, "n1", 2, 1, ("ok", value, 4))
    assert server.results == {(2, 1): ("ok", value, 4)}


def test_cut_streams_and_other_nonces_leave_nothing(tmp_path):
    import cloudpickle

    with ResultServer(str(tmp_path), "n1") as server:
        assert send_outcome(server.path, "other", 0, 0, ("ok", 1, 1))
        blob = cloudpickle.dumps(("ok", b"x" * 100_000, 1))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # a rank that died halfway
            s.connect(server.path)
            s.sendall(b"n1 0 1\n" + blob[: len(blob) // 2])
    assert server.results == {}


def test_an_unpicklable_value_raises_in_the_rank_and_leaves_nothing(tmp_path):
    """2 MB are sent before the lock fails to pickle: the caller drops the cut stream."""
    import threading

    with ResultServer(str(tmp_path), "n1") as server:
        with pytest.raises(TypeError, match="pickle"):
            send_outcome(server.path, "n1", 0, 0, ("ok", [b"y" * 2_000_000, threading.Lock()], 1))
    assert server.results == {}


def test_no_socket_at_the_path_is_false_not_an_error(tmp_path):
    assert send_outcome(str(tmp_path / "absent.sock"), "n1", 0, 0, ("ok", 1, 1)) is False


def test_lines_limit_setting():
    assert max_lines_bytes({}) == 64 << 20
    assert max_lines_bytes({"TRAINRUN_RUN_REMOTE_RESULT_MB": "0.5"}) == 1 << 19
    assert max_lines_bytes({"TRAINRUN_RUN_REMOTE_RESULT_MB": "lots"}) == 64 << 20
