"""The result channel of trainrun.run for ranks on the caller's machine: a Unix socket in the call's private
temporary folder (TRAINRUN_RUN_SOCKET), so a big return value crosses once, streamed, instead of as base64
lines through the launcher's output (which held several copies: 500 MB per rank took 3 GB in the caller).

A rank connects, sends one header line `<nonce> <attempt> <rank>\\n` and its outcome pickled straight into
the socket (no blob of it in the rank), then closes. The caller's `ResultServer` unpickles each connection
as it arrives, straight from the socket (no blob of it in the caller either: the value is the one copy).
A rank that cannot connect -- on another host, where the path does not exist (or names another machine's
socket on a shared disk: connecting to it fails) -- sends its outcome as lines (wire.py) instead.

The folder is the caller's TemporaryDirectory (mode 0700): only this user can connect; the nonce tells this
call's ranks from anything else.
"""
from __future__ import annotations

import os
import selectors
import socket
import threading

SOCKET_NAME = "results.sock"
IO_TIMEOUT_S = 120.0  # a peer that sends or reads nothing for this long is given up on (not a hang for ever)
_BUFFER = 1 << 20


def send_outcome(path: str, nonce: str, attempt: int, rank: int, record) -> bool:
    """Stream `record` (a rank's outcome) to the caller's ResultServer at `path`. False if the socket cannot
    be reached (another host) or stops reading: the rank sends lines then. Exceptions of pickling `record`
    propagate (the caller drops the cut stream; the rank reports the error as lines)."""
    import cloudpickle

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(IO_TIMEOUT_S)
        try:
            sock.connect(path)
        except OSError:
            return False
        try:
            with sock.makefile("wb", buffering=_BUFFER) as f:
                f.write(f"{nonce} {attempt} {rank}\n".encode())
                cloudpickle.dump(record, f, protocol=5)
        except OSError:  # the caller stopped reading (timeout, gone): the lines are the way left
            return False
        return True
    finally:
        sock.close()


class ResultServer:
    """Listens at `folder`/results.sock for this call's ranks (use as a context manager, or close()).
    `results`: {(attempt, rank): outcome record, or the exception that unpickling it raised in the caller}."""

    def __init__(self, folder: str, nonce: str):
        self.path = os.path.join(folder, SOCKET_NAME)
        self.nonce = nonce.encode()
        self.results: dict[tuple[int, int], object] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._readers: list[threading.Thread] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(128)
        self._accepter = threading.Thread(target=self._accept, name="trainrun-run-results", daemon=True)
        self._accepter.start()

    def __enter__(self) -> ResultServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close(wait=exc[0] is None)

    def _accept(self) -> None:
        """Take connections until close(); then the ones already queued (a rank may connect, send and exit
        just before the launcher ends)."""
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            while True:
                stopping = self._stop.is_set()
                if not sel.select(0 if stopping else 0.2):
                    if stopping:
                        return
                    continue
                conn, _ = self._sock.accept()
                reader = threading.Thread(target=self._receive, args=(conn,), daemon=True)
                self._readers.append(reader)
                reader.start()

    def _receive(self, conn: socket.socket) -> None:
        """One rank's outcome, unpickled from the stream. A cut stream (the rank died, or its value did not
        pickle: it says so as lines) leaves nothing; any other error is kept, raised to the caller later."""
        import pickle

        import cloudpickle

        conn.settimeout(IO_TIMEOUT_S)
        with conn, conn.makefile("rb", buffering=_BUFFER) as f:
            try:
                nonce, attempt, rank = f.readline(256).split()
                key = (int(attempt), int(rank))
            except (ValueError, OSError):
                return
            if nonce != self.nonce:
                return
            try:
                record: object = cloudpickle.load(f)
            except (EOFError, pickle.UnpicklingError, OSError):
                return
            except Exception as err:  # e.g. a class the caller cannot import: what cloudpickle.loads raised before
                record = err
        with self._lock:
            self.results[key] = record

    def close(self, wait: bool = True) -> None:
        """Stop listening; with `wait`, first take what is queued and let every reader finish."""
        self._stop.set()
        if wait:
            self._accepter.join()
            for reader in self._readers:
                reader.join()
        self._sock.close()
