"""`--check --tf-cluster`: per host, the ports its tasks will use; and that every host of the job reaches every
parameter server on its port, before the job starts.

    port_rows(tasks, ranks, workers)   pure: (host, its tasks, their ports) per host
    ps_targets(tasks, ranks, workers)  pure: (ps host, "ps I", address, port) per parameter server
    reach_problems(...)                each ps host listens on its ps ports (this module's `serve`), every host
                                       connects to all of them (net/nics.probe); refused, filtered or unbindable
                                       ports become one problem line each

The listeners answer with "HOST NONCE", so a port that some other machine answers does not count.
"""
from __future__ import annotations

import json
import secrets
import selectors
import socket
import sys
import threading
from typing import cast


def port_rows(tasks, ranks, workers: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(host, "chief:0 worker:1", "41000,41001") per host, in rank order. Pure."""
    rows: dict[str, tuple[list[str], list[str]]] = {}
    for a, t, w in zip(ranks, tasks, workers):
        roles, ports = rows.setdefault(a.host.name, ([], []))
        roles.append(f"{t.role}:{t.index}")
        ports.append(w.rsplit(":", 1)[1])
    return [(h, " ".join(r), ",".join(p)) for h, (r, p) in rows.items()]


def ps_targets(tasks, ranks, workers: tuple[str, ...]) -> list[tuple[str, str, str, int]]:
    """(host, "ps I", address, port) of every parameter server. Pure."""
    out = []
    for a, t, w in zip(ranks, tasks, workers):
        if t.role == "ps":
            addr, port = w.rsplit(":", 1)
            out.append((a.host.name, f"ps {t.index}", addr, int(port)))
    return out


def listen(host: str, binds: list[list]) -> tuple[selectors.BaseSelector, dict]:
    """Listen on each [label, address, port] of `binds`; {"host", "listen": [...], "failed": [[label, addr, port,
    why]]}."""
    sel, ok, failed = selectors.DefaultSelector(), [], []
    for label, addr, port in binds:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, int(port)))
            s.listen(64)
        except OSError as e:
            s.close()
            failed.append([label, addr, port, e.strerror or type(e).__name__])
            continue
        sel.register(s, selectors.EVENT_READ)
        ok.append([label, addr, port])
    return sel, {"host": host, "listen": ok, "failed": failed}


def answer(sel: selectors.BaseSelector, identity: bytes, stop: threading.Event | None = None) -> None:
    """Answer every connection with `identity` until `stop` is set (forever without one)."""
    while stop is None or not stop.is_set():
        for key, _ in sel.select(0.2):
            try:
                conn, _ = cast(socket.socket, key.fileobj).accept()
                with conn:
                    conn.sendall(identity)
            except OSError:
                pass


def serve(host: str, nonce: str, binds: list[list], lifetime: float = 120.0) -> None:
    """On a ps host: print listen()'s JSON as one line, then answer until stdin's EOF or `lifetime` s."""
    import os

    sel, doc = listen(host, binds)
    print(json.dumps(doc), flush=True)
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()
    threading.Timer(lifetime, os._exit, (0,)).start()
    answer(sel, f"{host} {nonce}\n".encode())


def _problems(listened: dict, results: dict) -> list[str]:
    """One line per port a ps host could not listen on, and per (host, ps) that did not connect. Pure."""
    out = [f"{h}: {label} cannot listen on {addr}:{port} there ({why}); free the port or run --check again"
           for h, doc in listened.items() for label, addr, port, why in doc["failed"]]
    ports = {(h, label): port for h, doc in listened.items() for label, _, port in doc["listen"]}
    for src, rows in results.items():
        out += [f"{src} cannot reach {label} on {host} at {addr}:{ports[host, label]} ({why}); "
                "open that port between the hosts" for host, label, addr, why in rows if why != "ok"]
    return out


def reach_problems(targets, hosts: list[str], engine=None, pythons: dict | None = None, timeout: float = 10.0) -> list[str]:
    """Every host in `hosts` connects to every target; with no `engine` (a one-machine job) all in this process."""
    from trainrun.net.nics import probe

    nonce = secrets.token_hex(8)
    binds: dict[str, list[list]] = {}
    for host, label, addr, port in targets:
        binds.setdefault(host, []).append([label, addr, port])
    if engine is None:
        stop = threading.Event()
        opened = {h: listen(h, b) for h, b in binds.items()}
        threads = [threading.Thread(target=answer, args=(sel, f"{h} {nonce}\n".encode(), stop), daemon=True)
                   for h, (sel, _) in opened.items()]
        for t in threads:
            t.start()
        try:
            listened = {h: doc for h, (_, doc) in opened.items()}
            spec = {"targets": _probe_targets(listened, nonce), "timeout": 2.0}
            results = {h: probe(spec) for h in hosts}
        finally:
            stop.set()
            for t in threads:
                t.join()
            for sel, _ in opened.values():
                for key in list(sel.get_map().values()):
                    cast(socket.socket, key.fileobj).close()
        return _problems(listened, results)
    assert pythons is not None  # given with an engine
    channels = []
    try:
        servers = {}
        for h, b in binds.items():
            words = [f"{label.split()[1]},{addr},{port}" for label, addr, port in b]  # plain words, no JSON
            ch = engine.run_module(h, "trainrun.check.ps_ports", "serve", h, nonce, *words,
                                   python=pythons[h], timeout=timeout)
            channels.append(ch)
            servers[h] = ch
        listened = {h: json.loads(ch.readline()) for h, ch in servers.items()}
        line = json.dumps({"targets": _probe_targets(listened, nonce), "timeout": 2.0}).encode()
        probers = {}
        for h in hosts:
            probers[h] = ch = engine.run_module(h, "trainrun.net.nics", "probe", python=pythons[h], timeout=timeout)
            channels.append(ch)
            ch.send(line)
            ch.close_stdin()
        results = {h: json.loads(ch.read())["results"] for h, ch in probers.items()}
    finally:
        for ch in channels:
            ch.close()
    return _problems(listened, results)


def _probe_targets(listened: dict, nonce: str) -> list[list]:
    """net/nics.probe's targets: [host, label, addr:port, port, expected identity]."""
    return [[h, label, addr, port, f"{h} {nonce}"] for h, doc in listened.items() for label, addr, port in doc["listen"]]


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "serve":
        binds = [[f"ps {i}", addr, int(port)] for i, addr, port in (w.split(",") for w in argv[3:])]
        serve(argv[1], argv[2], binds)
        return 0
    print("usage: python -m trainrun.check.ps_ports serve HOST NONCE INDEX,ADDRESS,PORT...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
