"""SSH to remote hosts: options, ssh_config resolution, connecting with failures classified by stage, and the
one place the remote shell command line is built.

This is the only module that imports paramiko; the launcher imports it only when a job has a remote host.

Every connection failure becomes a `HostError(host, stage, message, hint=...)` whose stage says how far the
connection got:

    dns      the host name does not resolve
    tcp      no TCP connection: refused, unreachable, timed out
    ssh      TCP is up but no SSH session: no or bad banner, protocol negotiation failed
    hostkey  the host key is unknown (strict) or differs from known_hosts (always refused)
    auth     the server refused every key, or a key cannot be read

Messages are one line, with no traceback and no key material (only public-key fingerprints).
"""
from __future__ import annotations

import fcntl
import getpass
import os
import re
import shlex
import socket
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence


class _LazyInvoke:
    """Stands in for the `invoke` module inside paramiko.config until a `Match exec` needs it."""

    def run(self, *args, **kwargs):
        import invoke

        return invoke.run(*args, **kwargs)


if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    # paramiko imports the optional `invoke` (~50 ms, 40% of its import) only for `Match exec` in ssh
    # configs: make that import fail fast, then hand paramiko a lazy stand-in.
    sys.modules["invoke"] = None  # type: ignore[assignment]  # None there: `import invoke` fails
    try:
        import paramiko
    finally:
        del sys.modules["invoke"]
    paramiko.config.invoke = _LazyInvoke()

import paramiko  # noqa: E402  (after the block above)

from trainrun import log  # noqa: E402
from trainrun.errors import HostError, HostsError, UsageError  # noqa: E402

PORT_HINT = "check -p/--ssh-port"
KEY_HINT = "check -i/--ssh-identity-file and the remote user's authorized_keys"


def _default_ssh_config() -> str | None:
    path = os.path.expanduser("~/.ssh/config")
    return path if os.path.isfile(path) else None


@dataclass(frozen=True)
class SSHOptions:
    """How to reach remote hosts. A None field is taken from the ssh config, then from OpenSSH's default
    (port 22, the local user, ~/.ssh/id_* and the agent, ~/.ssh/known_hosts). Explicit fields win over the
    config. `strict` refuses hosts not in known_hosts; otherwise they are trusted on first use and appended.
    Raises UsageError for a bad port, timeout or a missing ssh config file."""

    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    ssh_config: str | None = field(default_factory=_default_ssh_config)
    known_hosts: str | None = None
    strict: bool = False
    connect_timeout: float = 10.0

    def __post_init__(self):
        if self.port is not None and not 1 <= self.port <= 65535:
            raise UsageError(f"--ssh-port must be in 1..65535, not {self.port}")
        if not self.connect_timeout > 0:
            raise UsageError(f"SSH connect timeout must be positive, not {self.connect_timeout}")
        if self.ssh_config is not None and not os.path.isfile(os.path.expanduser(self.ssh_config)):
            raise UsageError(f"ssh config file {self.ssh_config} does not exist")


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to connect for one host name, after the ssh config and the options."""

    host: str                       # the name as the user gave it; used in every message
    hostname: str                   # what is resolved and connected to
    port: int
    user: str
    identity_files: tuple[str, ...]  # empty: ~/.ssh/id_* and the agent, like ssh
    identities_only: bool            # True: only identity_files, no agent
    known_hosts: str


def resolve(host: str, opts: SSHOptions) -> SSHTarget:
    """`host` may be `user@name` (that user wins over everything). Apply the ssh config's HostName, Port, User, IdentityFile, IdentitiesOnly and UserKnownHostsFile (the
    first file: read and appended to) to `host`, then the explicit options. IdentityFiles from the config that
    do not exist are skipped, like ssh does. Raises UsageError for an unreadable config or a bad Port."""
    given_user, _, name = host.rpartition("@")  # `user@host` from -H or a hostfile
    cfg: dict = {}
    if opts.ssh_config:
        path = os.path.expanduser(opts.ssh_config)
        try:
            cfg = paramiko.SSHConfig.from_path(path).lookup(name)
        except (OSError, paramiko.SSHException) as e:
            raise UsageError(f"cannot read ssh config {path}: {e}") from None
    try:
        port = opts.port or int(cfg.get("port", 22))
    except ValueError:
        raise UsageError(f"{opts.ssh_config}: bad Port {cfg['port']!r} for host {host}") from None
    if opts.identity_file:
        identities, only = (os.path.expanduser(opts.identity_file),), True
    else:
        found = (os.path.expanduser(p) for p in cfg.get("identityfile", []))
        identities, only = tuple(p for p in found if os.path.isfile(p)), cfg.get("identitiesonly") == "yes"
    config_known = (cfg.get("userknownhostsfile") or "").split()
    known = opts.known_hosts or (config_known[0] if config_known else "~/.ssh/known_hosts")
    return SSHTarget(host=host, hostname=cfg.get("hostname", name), port=port,
                     user=given_user or opts.user or cfg.get("user") or getpass.getuser(),
                     identity_files=identities, identities_only=only, known_hosts=os.path.expanduser(known))


class UnknownHostKey(paramiko.SSHException):
    """The host is not in known_hosts and strict host key checking is on."""


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for a host with no known key: refuse when strict, else trust on first use."""

    def __init__(self, known_hosts: str, strict: bool):
        self.known_hosts, self.strict = known_hosts, strict

    def missing_host_key(self, client, hostname, key):
        if self.strict:
            raise UnknownHostKey(hostname)
        _append_known_host(self.known_hosts, hostname, key)
        log.warning("%s: unknown host, added its %s key %s to %s", hostname, key.get_name(), key.fingerprint,
                    self.known_hosts)


def _append_known_host(path: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one known_hosts line; safe against concurrent appends from threads and processes."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        sep = b"" if size == 0 or os.pread(fd, 1, size - 1) == b"\n" else b"\n"
        os.write(fd, sep + f"{hostname} {key.get_name()} {key.get_base64()}\n".encode())
    finally:
        os.close(fd)


def known_hosts_lines(path: str, name: str) -> list[int]:
    """1-based numbers of the lines of known_hosts file `path` that name host `name` (plain or hashed)."""
    lines = []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                fields = line.split()
                if len(fields) < 3 or line.lstrip().startswith("#"):
                    continue
                names = fields[1] if fields[0].startswith("@") else fields[0]
                for entry in names.split(","):
                    hashed = entry.startswith("|1|")
                    if entry == name or (hashed and paramiko.HostKeys.hash_host(name, entry) == entry):
                        lines.append(number)
                        break
    except OSError:
        pass
    return lines


def connect(host: str, opts: SSHOptions) -> paramiko.SSHClient:
    """An authenticated SSHClient for `host` (the caller closes it). Raises HostError classified by stage
    (see the module docstring) or UsageError for a bad ssh config."""
    t = resolve(host, opts)
    if opts.identity_file and not os.access(t.identity_files[0], os.R_OK):
        raise HostError(host, "auth", f"cannot read identity file {t.identity_files[0]}",
                        hint="check -i/--ssh-identity-file")
    client = paramiko.SSHClient()
    try:
        if os.path.exists(t.known_hosts):
            client.load_system_host_keys(t.known_hosts)
        client.set_missing_host_key_policy(_HostKeyPolicy(t.known_hosts, opts.strict))
        timeout = opts.connect_timeout
        client.connect(t.hostname, t.port, username=t.user, key_filename=list(t.identity_files) or None,
                       look_for_keys=not t.identity_files, allow_agent=not t.identities_only,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
    except (OSError, EOFError, UnicodeError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey) as e:
        transport = client.get_transport()
        authenticating = bool(transport and transport.active and transport.initial_kex_done)
        client.close()
        raise classify(t, e, authenticating) from None
    return client


def classify(t: SSHTarget, e: BaseException, authenticating: bool = False) -> HostError:
    """The HostError (stage, one-line message, hint) for exception `e` raised while connecting to `t`;
    `authenticating`: the key exchange was done (so a protocol error is about the keys)."""
    where = f"{t.hostname}:{t.port}"
    if isinstance(e, socket.gaierror):
        return HostError(t.host, "dns", f"cannot resolve {t.hostname!r}: {e.strerror}",
                         hint="check the host name and any HostName in the ssh config")
    if isinstance(e, UnicodeError):  # the resolver's idna codec: an ssh-config HostName that is no DNS name (a..b)
        return HostError(t.host, "dns", f"HostName {t.hostname!r} is not a valid host name",
                         hint="fix the HostName in the ssh config")
    if isinstance(e, paramiko.BadHostKeyException):
        name = t.hostname if t.port == 22 else f"[{t.hostname}]:{t.port}"
        lines = known_hosts_lines(t.known_hosts, name)
        at = f"line {lines[0]} of {t.known_hosts}" if lines else t.known_hosts
        return HostError(t.host, "hostkey", f"host key for {name} CHANGED: it offers {e.key.get_name()} "
                         f"{e.key.fingerprint}, {at} has {e.expected_key.fingerprint}; refusing to connect",
                         hint=f"if the host was reinstalled, delete {at}; otherwise someone may be intercepting")
    if isinstance(e, UnknownHostKey):
        return HostError(t.host, "hostkey", f"{t.hostname} is not in {t.known_hosts} and host keys are checked "
                         "strictly", hint=f"add its key to {t.known_hosts} (ssh-keyscan) or turn strict checking off")
    if isinstance(e, paramiko.hostkeys.InvalidHostKey):
        return HostError(t.host, "hostkey", f"unreadable line in {t.known_hosts}: {_one_line(e.line)}",
                         hint=f"fix or delete that line of {t.known_hosts}")
    if isinstance(e, paramiko.PasswordRequiredException):
        return HostError(t.host, "auth", "the identity file is encrypted and no passphrase can be asked",
                         hint="load the key into ssh-agent, or check -i/--ssh-identity-file")
    keys = ", ".join(t.identity_files) or "~/.ssh/id_* and the agent"
    if isinstance(e, paramiko.AuthenticationException):
        return HostError(t.host, "auth", f"{t.user}@{where} accepted none of the keys ({keys})", hint=KEY_HINT)
    if authenticating and isinstance(e, paramiko.SSHException):
        return HostError(t.host, "auth", f"cannot authenticate as {t.user}@{where} with {keys}: "
                         f"{_one_line(str(e))}", hint=KEY_HINT)
    if isinstance(e, (paramiko.SSHException, EOFError)):
        return HostError(t.host, "ssh", f"no SSH session with {where}: {_one_line(str(e)) or 'connection closed'}",
                         hint=f"is an SSH server listening on port {t.port}? {PORT_HINT}")
    if isinstance(e, (TimeoutError, socket.timeout)):
        return HostError(t.host, "tcp", f"connection to {where} timed out",
                         hint=f"is the host up and the port open? {PORT_HINT}")
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        e = next(iter(e.errors.values()))
    if isinstance(e, ConnectionRefusedError):
        return HostError(t.host, "tcp", f"connection to {where} refused",
                         hint=f"is sshd running there? {PORT_HINT}")
    return HostError(t.host, "tcp", f"cannot connect to {where}: {getattr(e, 'strerror', None) or _one_line(str(e))}",
                     hint="check the host's address and network")


def _one_line(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def connect_each(hosts: Iterable[str], opts: SSHOptions, parallelism: int = 32) -> tuple[dict, dict[str, HostError]]:
    """Connect to every host (duplicates once) with at most `parallelism` connections in flight. Returns
    ({host: client} of those reached, in the given order; {host: HostError} of the others); the caller closes
    the clients. A UsageError (bad ssh config) is raised after closing the clients that connected."""
    hosts = list(dict.fromkeys(hosts))
    pool = ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(hosts))), thread_name_prefix="ssh-connect")
    futures = {h: pool.submit(connect, h, opts) for h in hosts}
    try:
        wait(futures.values())
    except BaseException:  # Ctrl-C: let started connects end, close what connected
        pool.shutdown(wait=True, cancel_futures=True)
        _close_connected(futures.values())
        raise
    pool.shutdown()
    failed = {h: err for h, f in futures.items() if (err := f.exception()) is not None}
    others = [err for err in failed.values() if not isinstance(err, HostError)]
    if others:
        _close_connected(futures.values())
        raise others[0]
    clients = {h: f.result() for h, f in futures.items() if h not in failed}
    return clients, {h: err for h, err in failed.items() if isinstance(err, HostError)}


def connect_all(hosts: Iterable[str], opts: SSHOptions, parallelism: int = 32) -> dict[str, paramiko.SSHClient]:
    """connect_each, all or nothing: if any host fails, closes the clients that connected and raises
    HostsError with every host's HostError."""
    clients, failures = connect_each(hosts, opts, parallelism)
    if failures:
        for c in clients.values():
            c.close()
        raise HostsError(list(failures.values()))
    return clients


def _close_connected(futures) -> None:
    for f in futures:
        if f.done() and not f.cancelled() and f.exception() is None:
            f.result().close()


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def remote_command(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The one shell command line run on a remote host: `cd CWD && exec env K=V ... ARGV...` (parts left out
    when cwd or env is empty). Every piece goes through shlex.quote, so a POSIX login shell (sh, bash, dash,
    zsh, ksh) runs exactly argv with exactly env, whatever characters they hold. Env rides on the command
    line because sshd drops most channel env. Raises ValueError for an empty argv, a program name env would
    misread (starting with '-' or holding '='), a bad variable name, a cwd starting with '-', or a NUL byte."""
    env = dict(env or {})
    if not argv:
        raise ValueError("empty argv")
    if argv[0].startswith("-") or "=" in argv[0]:
        raise ValueError(f"program name {argv[0]!r} would be read by env as an option or assignment")
    bad = [k for k in env if not _ENV_NAME.match(k)]
    if bad:
        raise ValueError(f"invalid environment variable name {bad[0]!r}")
    if cwd is not None and (not cwd or cwd.startswith("-")):
        raise ValueError(f"invalid remote working directory {cwd!r}")
    pieces = [*argv, *env.values(), cwd or ""]
    if any("\0" in p for p in pieces):
        raise ValueError("NUL byte in argv, env or cwd")
    command = shlex.join(["exec", *(["env", *(f"{k}={v}" for k, v in env.items())] if env else []), *argv])
    return f"cd {shlex.quote(cwd)} && {command}" if cwd is not None else command


# How long the kernel may go without an answer from the other host's kernel before it ends an agent's TCP
# connection (TCP_USER_TIMEOUT), and when it asks on a quiet connection (keepalive probes: first after
# KEEPALIVE_IDLE_S of silence, then every KEEPALIVE_EVERY_S). ACKs come from the peer's kernel whatever its
# processes do, so a loaded, swapping or paused agent host still answers: only a cut network, or a host
# that is down, goes silent this long. The heartbeat (--heartbeat-timeout) stays for what the kernel cannot
# see: an agent that is hung or stopped while its host is fine.
KERNEL_TIMEOUT_S = 2.0
KEEPALIVE_IDLE_S, KEEPALIVE_EVERY_S = 1, 1


def watch_connection(client: paramiko.SSHClient, timeout_s: float = KERNEL_TIMEOUT_S) -> bool:
    """Have the kernel end `client`'s TCP connection after `timeout_s` without an answer from the other host
    (TCP_USER_TIMEOUT over our data and keepalive probes): paramiko's transport then fails with ETIMEDOUT, its
    channels close, and the agent's link reads as ended at once (ssh_engine.SSHLink.why_ended says why).
    False where it cannot be set (no TCP socket under the transport, e.g. a ProxyCommand; no such option on
    this system): the heartbeat alone then notices a cut."""
    sock = getattr(client.get_transport(), "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is None or not hasattr(socket, "TCP_KEEPIDLE"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_EVERY_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, int(timeout_s // KEEPALIVE_EVERY_S) + 1))
        sock.setsockopt(socket.IPPROTO_TCP, user_timeout, int(timeout_s * 1000))
    except OSError as err:
        log.info("cannot set TCP liveness options on the SSH connection: %s", err)
        return False
    return True


def connection_end(client: paramiko.SSHClient) -> str | None:
    """Why `client`'s SSH connection ended, in words, or None while it is up (an agent's channel that ended
    on a live connection: the agent exited or was killed, the host answers). The kernel's error is said
    when paramiko got it; a timeout often reaches paramiko as a plain end of stream (whichever call runs
    first takes the socket's error), hence the wording of the last case."""
    import errno

    transport = client.get_transport()
    if transport is None or transport.is_active():
        return None
    err = transport.saved_exception
    if isinstance(err, OSError) and err.errno is not None:
        if err.errno == errno.ETIMEDOUT:
            return f"the SSH connection timed out: no answer from the host for {KERNEL_TIMEOUT_S:g}s (network cut or host down)"
        if err.errno in (errno.ECONNRESET, errno.EPIPE):
            return "the SSH connection was reset by the host"
        return f"the SSH connection failed: {err.strerror or err}"
    return f"the SSH connection ended: the host stopped answering for {KERNEL_TIMEOUT_S:g}s, or closed it"
