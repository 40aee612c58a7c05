"""Run in a private network namespace (unshare -n) by tests/process/test_ssh_liveness.py: a TCP connection over
lo with fanout/ssh.watch_connection's options on the client end, then MODE happens to the server end:

    cut      every packet on lo is dropped (iptables): the server's kernel no longer answers
    stopped  the server process is SIGSTOPped: its kernel still answers

The client sends a 4-byte beat every 0.5 s (BEATS=send) or nothing (BEATS=idle: keepalive probes only) and
prints `ended SECONDS` when the kernel ends the connection (an error or end of stream), `alive` after 8 s."""
import os
import signal
import socket
import subprocess
import sys
import time
import types

from trainrun.fanout import ssh

mode, beats = sys.argv[1], sys.argv[2]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
srv = socket.create_server(("127.0.0.1", 0))
pid = os.fork()
if pid == 0:
    conn, _ = srv.accept()
    while conn.recv(1 << 16):
        pass
    os._exit(0)
cli = socket.create_connection(srv.getsockname())
transport = types.SimpleNamespace(sock=cli)
assert ssh.watch_connection(types.SimpleNamespace(get_transport=lambda: transport))
time.sleep(0.3)
if mode == "cut":
    subprocess.run(["iptables", "-A", "INPUT", "-i", "lo", "-j", "DROP"], check=True)
else:
    os.kill(pid, signal.SIGSTOP)
t0 = time.monotonic()
cli.settimeout(0.5)
try:
    while time.monotonic() - t0 < 8:
        try:
            if beats == "send":
                cli.send(b"beat")
            if cli.recv(1) == b"":
                raise ConnectionError("end of stream")
        except socket.timeout:
            continue
        except OSError:
            print(f"ended {time.monotonic() - t0:.1f}", flush=True)
            break
    else:
        print("alive", flush=True)
finally:
    os.kill(pid, signal.SIGKILL)
