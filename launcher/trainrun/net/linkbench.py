"""The host side of `trainrun --check --perf`: one process per host, driven over the engine's channel.

    python -m trainrun.net.linkbench HOST

reads one JSON line {"token": SECRET} on stdin (never on the command line, where `ps` would show it),
listens on each IPv4 address of each up, non-loopback NIC (ports chosen by the kernel, like the NIC probe's
server), prints {"host", "boot_id", "listen": [[nic, addr, port], ...]} as one line, then answers one JSON
line per JSON command line until stdin closes (the channel ended: it exits at once) or LIFETIME seconds:

    {"op": "time"}                                       {"t": this host's time.time()}
    {"op": "compute", "seconds": S}                      {"gflops", "load1", "mem_avail_mib", "cpus", "gpus"}
    {"op": "link", "peer", "addr", "port", "seconds", "pings"}
        measure the link to another host's linkbench: RTT (median of `pings` 1-byte round trips), then
        `seconds` of sending (tx: this host -> peer) and `seconds` of receiving (rx: peer -> this host);
        {"rtt_us", "tx_mbps", "rx_mbps"} or {"error": why}

The listening sockets serve only connections that present the token (every other connection is closed
unread), answer with this host's name (the client checks it is the peer it meant: the NIC probe's identity
check), and live only while `--check --perf` runs. Bandwidth is what the receiver counted over the sender's
whole interval, including the final drain (iperf3's receiver figure).
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import threading
import time

MAGIC = "TRLB1"
CHUNK = 1 << 18
MAX_SECONDS = 10.0   # a server never streams longer than this, whatever a client asks
CONNECT_TIMEOUT = 3.0
LIFETIME = 3600.0


def boot_id() -> str:
    """The kernel's boot id: hosts that print the same one share a machine (and its CPUs: namespaces,
    containers), so --check --perf probes their compute one at a time."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _recv_line(conn: socket.socket, limit: int = 256) -> str:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        b = conn.recv(1)
        if not b or len(buf) > limit:
            break
        buf += b
    return buf.decode(errors="replace").strip()


def _serve_conn(conn: socket.socket, host: str, token: str) -> None:
    with conn:
        try:
            conn.settimeout(MAX_SECONDS + 5)
            parts = _recv_line(conn).split()
            if len(parts) != 4 or parts[0] != MAGIC or parts[1] != token:
                return  # not one of this check's hosts: closed unread
            mode, seconds = parts[2], min(float(parts[3]), MAX_SECONDS)
            conn.sendall(f"{host}\n".encode())
            if mode == "ping":
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while (b := conn.recv(1)):
                    conn.sendall(b)
            elif mode == "send":  # the client sends; count until its EOF, then say how much arrived
                total, buf = 0, bytearray(CHUNK)
                while (n := conn.recv_into(buf)):
                    total += n
                conn.sendall(f"{total}\n".encode())
            elif mode == "recv":  # the client receives for `seconds`
                data, end = memoryview(bytes(CHUNK)), time.monotonic() + seconds
                while time.monotonic() < end:
                    conn.sendall(data)
                conn.shutdown(socket.SHUT_WR)
        except (OSError, ValueError):
            pass  # a client that gave up; nothing to report on this side


def listen_all(host: str, token: str) -> list[list]:
    """Listen on every up, non-loopback IPv4 address; serve connections in threads. [[nic, addr, port]]."""
    from trainrun.net.nics import listen_on_nics, local_nics

    sel, listen = listen_on_nics(local_nics())

    def accept_loop():
        while True:
            for key, _ in sel.select():
                try:
                    conn, _ = key.fileobj.accept()
                except OSError:
                    continue
                threading.Thread(target=_serve_conn, args=(conn, host, token), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return listen


def _connect(addr: str, port: int, token: str, mode: str, seconds: float, peer: str) -> socket.socket:
    c = socket.create_connection((addr, port), timeout=CONNECT_TIMEOUT)
    c.settimeout(seconds + 10)
    c.sendall(f"{MAGIC} {token} {mode} {seconds}\n".encode())
    got = _recv_line(c)
    if got != peer:
        c.close()
        raise ConnectionError(f"{addr}:{port} answered as {got or 'nobody'}, not {peer}")
    return c


def measure_link(addr: str, port: int, token: str, peer: str, seconds: float, pings: int) -> dict:
    """RTT, then tx, then rx to a peer's linkbench server; see the module docstring."""
    try:
        with _connect(addr, port, token, "ping", seconds, peer) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rtts = []
            for _ in range(pings):
                t0 = time.perf_counter()
                c.sendall(b"x")
                if not c.recv(1):
                    raise ConnectionError("ping: peer closed")
                rtts.append(time.perf_counter() - t0)
        with _connect(addr, port, token, "send", seconds, peer) as c:
            data, t0 = memoryview(bytes(CHUNK)), time.perf_counter()
            end = t0 + seconds
            while time.perf_counter() < end:
                c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            received = int(_recv_line(c) or 0)
            tx = received * 8 / (time.perf_counter() - t0) / 1e6
        with _connect(addr, port, token, "recv", seconds, peer) as c:
            buf, total, t0 = bytearray(CHUNK), 0, time.perf_counter()
            while (n := c.recv_into(buf)):
                total += n
            rx = total * 8 / (time.perf_counter() - t0) / 1e6
    except (OSError, ValueError) as e:
        return {"error": str(e) or type(e).__name__}
    return {"rtt_us": statistics.median(rtts) * 1e6 if rtts else None, "tx_mbps": tx, "rx_mbps": rx}


def compute_probe(seconds: float) -> dict:
    """Single-threaded float32 matmul GFLOP/s over `seconds` of wall time (contention shows), load, free
    memory, usable CPUs and, where nvidia-smi answers, each GPU's free memory and processes."""
    import numpy as np

    n = 256
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    a @ b  # warm-up: BLAS start-up is not compute
    count, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or count < 3:
        a @ b
        count += 1
    return {"gflops": 2 * n ** 3 * count / elapsed / 1e9, "load1": os.getloadavg()[0],
            "mem_avail_mib": _mem_available_mib(), "cpus": len(os.sched_getaffinity(0)), "gpus": gpu_state()}


def _mem_available_mib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return 0


def gpu_state() -> list[dict]:
    """Per GPU: index, name, free and total memory (MiB), and how many compute processes hold it."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        gpus = subprocess.run([exe, "--query-gpu=index,uuid,name,memory.free,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
        apps = subprocess.run([exe, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_gpu_state(gpus, apps)


def parse_gpu_state(gpus: str, apps: str) -> list[dict]:
    """nvidia-smi's two CSV answers as gpu_state's rows. Pure."""
    holders: dict[str, int] = {}
    for line in apps.strip().splitlines():
        uuid = line.split(",")[0].strip()
        if uuid:
            holders[uuid] = holders.get(uuid, 0) + 1
    out = []
    for line in gpus.strip().splitlines():
        p = [x.strip() for x in line.split(",")]
        if len(p) >= 5 and p[0].isdigit():
            out.append({"index": int(p[0]), "name": p[2], "mem_free_mib": int(p[3]) if p[3].isdigit() else 0,
                        "mem_total_mib": int(p[4]) if p[4].isdigit() else 0, "procs": holders.get(p[1], 0)})
    return out


def answer(cmd: dict, token: str) -> dict:
    op = cmd.get("op")
    if op == "time":
        return {"t": time.time()}
    if op == "compute":
        return compute_probe(float(cmd["seconds"]))
    if op == "link":
        return measure_link(cmd["addr"], int(cmd["port"]), token, cmd["peer"], min(float(cmd["seconds"]), MAX_SECONDS),
                            int(cmd.get("pings", 20)))
    return {"error": f"unknown op {op!r}"}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainrun.net.linkbench HOST  (token as {\"token\": ...} on stdin)", file=sys.stderr)
        return 2
    # One BLAS thread: the compute probe measures one core the same way on every host, and a host's
    # extra cores must not hide a process that competes with the job for its CPUs.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    import numpy  # noqa: F401  (now: an import must not land inside the first compute probe)

    token = json.loads(sys.stdin.readline() or "{}").get("token")
    if not token:
        print("linkbench: no token on stdin", file=sys.stderr)
        return 2
    listen = listen_all(argv[0], token)
    timer = threading.Timer(LIFETIME, os._exit, (0,))
    timer.daemon = True
    timer.start()
    print(json.dumps({"host": argv[0], "boot_id": boot_id(), "listen": listen}), flush=True)
    for line in sys.stdin:
        try:
            reply = answer(json.loads(line), token)
        except (ValueError, KeyError, TypeError) as e:
            reply = {"error": f"bad command: {e}"}
        print(json.dumps(reply), flush=True)
    os._exit(0)  # stdin closed: the check is over; server threads end with the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
