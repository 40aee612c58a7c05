"""Container healthcheck: healthy once sshd on port 22 sends its SSH banner."""
import socket
import sys

try:
    with socket.create_connection(("127.0.0.1", 22), timeout=2) as s:
        sys.exit(0 if s.recv(8).startswith(b"SSH-") else 1)
except OSError:
    sys.exit(1)
