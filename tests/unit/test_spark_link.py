"""wire/spark_link.py: the handshake a Spark task and the driver run before any byte is trusted (pure protocol,
over a socketpair): the right secret passes both ways and carries the Hello; a wrong one is refused by whichever
side checks first, and the secret never crosses the connection."""
from __future__ import annotations

import secrets
import socket
import threading
import time

import pytest

from trainrun.wire.spark_link import AuthError, Hello, driver_handshake, format_links, parse_links, task_handshake

HELLO = Hello("h2", 2, 3, "eth0")


def _pair(driver_secret: bytes, task_secret: bytes):
    d, t = socket.socketpair()
    d.settimeout(5)
    t.settimeout(5)
    task_result: list = []

    def task():
        try:
            task_handshake(t, task_secret, secrets.token_bytes(32), HELLO)
            task_result.append(None)
        except AuthError as err:
            task_result.append(err)
        finally:
            t.close()

    th = threading.Thread(target=task)
    th.start()
    try:
        try:
            got = driver_handshake(d, driver_secret, secrets.token_bytes(32))
        except AuthError as err:
            got = err
    finally:
        d.close()
        th.join(5)
    return got, task_result[0]


def test_the_same_secret_passes_and_carries_the_hello():
    key = secrets.token_bytes(32)
    got, task_err = _pair(key, key)
    assert got == HELLO and task_err is None


def test_a_task_without_the_secret_is_refused():
    got, _ = _pair(secrets.token_bytes(32), secrets.token_bytes(32))
    assert isinstance(got, AuthError) and "does not know the job's secret" in str(got)


def test_a_driver_without_the_secret_is_refused_by_the_task():
    """A driver that merely echoes would get a task's MAC; the task checks the driver's answer to its own
    challenge, so an impostor listening on the address cannot make it run an agent."""
    key = secrets.token_bytes(32)
    d, t = socket.socketpair()
    t.settimeout(5)
    errs: list = []

    def task():
        try:
            task_handshake(t, key, secrets.token_bytes(32), HELLO)
        except AuthError as err:
            errs.append(err)

    th = threading.Thread(target=task)
    th.start()
    d.sendall(secrets.token_bytes(32))   # a challenge
    d.recv(64)                           # the task's challenge and MAC
    d.sendall(b"\0" * 32)                # a wrong answer
    th.join(5)
    d.close()
    t.close()
    assert errs and "did not prove" in str(errs[0])


@pytest.mark.parametrize("text", ["h2", "h2=x", "=3"])
def test_bad_links_variable(text):
    with pytest.raises(ValueError):
        parse_links(text)


def test_links_round_trip():
    assert parse_links(format_links({"h2": 5, "h3-10.0.0.4": 7})) == {"h2": 5, "h3-10.0.0.4": 7}


def test_the_driver_drops_a_connection_without_the_secret_and_takes_the_next(capsys):
    """sparkrun/driver.accept_hosts on a real listener: an impostor is dropped with one line naming its address
    (never the secret), the task that knows the secret is taken, and the listener stops once the Hello's host
    count is in."""
    from trainrun.sparkrun.driver import accept_hosts

    class Stage:  # the barrier stage, still running (accept_hosts only reads its error)
        error = None

    key = secrets.token_bytes(32)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def client(secret: bytes):
        s = socket.create_connection(("127.0.0.1", port))
        try:
            task_handshake(s, secret, secrets.token_bytes(32), Hello("h9", 2, 1, None))
        except AuthError:
            s.close()
            return
        s.recv(1)  # holds the connection until the driver closes it
        s.close()

    bad = threading.Thread(target=client, args=(secrets.token_bytes(32),))
    bad.start()
    deadline = time.monotonic() + 5
    while bad.is_alive() and time.monotonic() < deadline and not _queued(listener):
        time.sleep(0.01)  # the impostor is first in the listener's queue
    good = threading.Thread(target=client, args=(key,))
    good.start()
    try:
        got = accept_hosts(listener, key, 2, 10.0, Stage())
    finally:
        listener.close()
    assert list(got) == ["h9"] and got["h9"][1].slots == 2
    for conn, _ in got.values():
        conn.close()
    good.join(5)
    bad.join(5)
    err = capsys.readouterr().err
    assert "trainrun: spark: dropped a connection from 127.0.0.1: the peer does not know the job's secret" in err
    assert key.hex() not in err


def _queued(listener: socket.socket) -> bool:
    """A connection waits in the listener's accept queue (select says it is readable)."""
    import select

    return bool(select.select([listener], [], [], 0)[0])
