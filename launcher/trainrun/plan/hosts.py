"""Hosts: what `-H` and `--hostfile` say, parsed into HostSpec values.

This module is one of the three that see user strings (with cli.py and config.py). Every error is a
UsageError naming the entry, or `file:line` and the quoted line, and what to do.

Accepted forms
    -H         host[:slots][,host[:slots]...]      user@host and [ipv6]:slots allowed
    hostfile   `host slots=N`, `host:N`, `host` (1 slot), `# comments`, blank lines; a UTF-8 BOM is skipped

A hostfile is read line by line and each line parsed as it is read, so the first bad line ends the read;
the file is at most MAX_HOSTFILE_BYTES, a line at most MAX_HOSTFILE_LINE bytes, and `-H` or a hostfile lists at
most as many hosts as a job may have ranks: any input, /dev/zero too, ends in one line at once.

A host is a DNS name (dot-separated labels of 1-63 letters, digits, '-' and '_', no label starting or ending
with '-', 253 characters at most, one trailing dot allowed), an IPv4 address (a name whose last label is all
digits must be one) or an IPv6 address in brackets. '_' is allowed because ssh-config aliases and container
service names use it and resolvers accept it. The name is checked as typed (an ssh-config alias too, before its
HostName is looked up), so a bad one is a one-line usage error, never a resolver's traceback. Slots per host
and the ranks of a job are capped (plan/limits.py).
"""
from __future__ import annotations

import itertools
import re
import socket
from dataclasses import dataclass
from functools import lru_cache
from typing import BinaryIO, Iterable, Iterator

from trainrun.errors import UsageError
from trainrun.plan.limits import max_ranks

_NAME = re.compile(r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?\Z")
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "::1", "[::1]"}


@dataclass(frozen=True)
class HostSpec:
    """One host of the job: its name as the user wrote it, the slots it offers, an optional SSH user, and
    `via`: the engine that placed it ("ray": a Ray node), which then reaches it even when it is this machine."""

    name: str
    slots: int = 1
    user: str | None = None
    via: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("host name is empty")
        if self.slots < 1:
            raise ValueError(f"host {self.name}: slots must be >= 1, got {self.slots}")

    @property
    def is_local(self) -> bool:
        """True when this host is the machine the launcher runs on (no SSH needed) and no engine placed it
        (a Ray node's ranks run under its agent, inside the bundles Ray reserved, also on this machine)."""
        return self.user is None and self.via is None and is_local_name(self.name)

    def __str__(self) -> str:
        return f"{self.user}@{self.name}" if self.user else self.name


def _parse_name(text: str) -> tuple[str, str | None]:
    m = _NAME.match(text)
    if not m:
        raise ValueError(f"'{text}' is not a host name")
    host = m.group("host")
    if host.startswith("["):
        import ipaddress  # (here and below: only for a name that is an address)

        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"'{host}' is not an IPv6 address") from None
        return host[1:-1], m.group("user")
    check_host_name(host)
    return host, m.group("user")


def check_host_name(name: str) -> None:
    """Raise ValueError (saying why) unless `name` is a DNS name or an IPv4 address (module docstring)."""
    if len(name) > 253:
        raise ValueError(f"'{name[:20]}...' is not a valid host name ({len(name)} characters; at most 253)")
    labels = (name[:-1] if name.endswith(".") else name).split(".")
    if labels[-1].isdigit():
        import ipaddress

        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            raise ValueError(f"'{name}' is not a valid IPv4 address") from None
        return
    for label in labels:
        why = ("an empty label (two dots in a row, or a dot at the start)" if not label else
               f"label '{label[:20]}...' is {len(label)} characters (at most 63)" if len(label) > 63 else
               None if _LABEL.match(label) else
               f"label '{label}' starts or ends with '-'")
        if why:
            raise ValueError(f"'{name}' is not a valid host name: {why}")


def _parse_slots(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"slots '{text}' is not a positive whole number")
    slots = int(text)
    if slots < 1:
        raise ValueError("slots must be at least 1")
    if slots > (cap := max_ranks()):
        raise ValueError(f"slots {slots} is more than the {cap} ranks a job may have (TRAINRUN_MAX_RANKS)")
    return slots


def _parse_entry(entry: str) -> HostSpec:
    """`host`, `host:N`, `user@host:N`, `[v6addr]` or `[v6addr]:N`."""
    name_part, sep, slots_text = ("", "", entry) if entry.endswith("]") else entry.rpartition(":")
    if not sep:
        name_part, slots = slots_text, 1
    elif not name_part:
        raise ValueError("host name is missing before ':'")
    elif not slots_text:
        raise ValueError("slots are missing after ':'")
    else:
        slots = _parse_slots(slots_text)
    name, user = _parse_name(name_part)
    return HostSpec(name, slots, user)


class _HostList:
    """The hosts of `-H` or a hostfile, checked as each one is added, so that the first bad entry is reported
    as soon as it is read (a hostfile is parsed while it is read: a duplicate on line 2 of a huge file is
    reported without reading the rest).

    A host is its name: one agent, one set of local ranks. The same name twice, even with two logins
    (`alice@h1`, `bob@h1`), is a usage error, never a silent merge. More hosts than a job may have ranks
    (plan/limits.py) is one too: a host beyond that could never get a rank, and the cap bounds the memory a
    long list takes."""

    def __init__(self) -> None:
        self.specs: list[HostSpec] = []
        self._seen: dict[str, tuple[HostSpec, str]] = {}
        self._cap = max_ranks()

    def add(self, spec: HostSpec, loc: str) -> None:
        """Append `spec`, found at `loc` (`file:line` or `-H entry '...'`); UsageError naming `loc` if it repeats
        a host or is one host too many."""
        if spec.name in self._seen:
            first, first_loc = self._seen[spec.name]
            if str(first) == str(spec):
                raise UsageError(f"{loc}: host '{spec}' is listed twice (first at {first_loc}); give it once with the total slots")
            raise UsageError(f"{loc}: host '{spec.name}' is listed twice, as '{first}' (at {first_loc}) and as '{spec}'; "
                             "a host runs one agent for all its ranks: give it once, with one login and the total slots")
        if len(self.specs) >= self._cap:
            raise UsageError(f"{loc}: more than {self._cap} hosts, the most ranks a job may have (TRAINRUN_MAX_RANKS); "
                             "list only the hosts the job may use")
        self._seen[spec.name] = (spec, loc)
        self.specs.append(spec)


def parse_hosts_arg(text: str) -> list[HostSpec]:
    """Parse the value of `-H`. Raises UsageError naming the bad entry."""
    hosts = _HostList()
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise UsageError(f"-H '{text}': empty host entry; write -H host1:2,host2:2")
        try:
            spec = _parse_entry(entry)
        except ValueError as err:
            raise UsageError(f"-H entry '{entry}': {err}; write host or host:slots, e.g. -H node1:4,node2:4") from None
        hosts.add(spec, f"-H entry '{entry}'")
    return hosts.specs


def format_hosts(specs: Iterable[HostSpec]) -> str:
    """The hosts as `-H` takes them (parse_hosts_arg(format_hosts(s)) == s)."""
    return ",".join(f"{spec.user + '@' if spec.user else ''}{f'[{spec.name}]' if ':' in spec.name else spec.name}:{spec.slots}"
                    for spec in specs)


def parse_hostfile_text(text: str, path: str) -> list[HostSpec]:
    """Parse hostfile contents; `path` is used in messages only."""
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark, as some Windows editors write
    return _parse_hostfile_lines(enumerate(text.splitlines(), start=1), path)


def _parse_hostfile_lines(lines: Iterable[tuple[int, str]], path: str) -> list[HostSpec]:
    """The hosts of (line number, line) pairs, each line parsed as it comes: UsageError for the first bad one."""
    hosts = _HostList()
    for lineno, raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        loc = f"{path}:{lineno}"
        try:
            spec = _parse_hostfile_line(line)
        except ValueError as err:
            raise UsageError(f"{loc}: {err} in '{raw.strip()}'; write 'host slots=N', 'host:N' or 'host'") from None
        hosts.add(spec, loc)
    if not hosts.specs:
        raise UsageError(f"{path}: no hosts in hostfile; add lines like 'node1 slots=4'")
    return hosts.specs


def _parse_hostfile_line(line: str) -> HostSpec:
    first, *rest = line.split()
    if not rest:
        return _parse_entry(first)
    if ":" in first and not first.startswith("["):
        raise ValueError("use either 'host:N' or 'host slots=N', not both")
    name, user = _parse_name(first)
    slots = 1
    for item in rest:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"'{item}' is not key=value")
        if key in ("slots", "max_slots", "max-slots"):
            if key == "slots":
                slots = _parse_slots(value)
            else:
                _parse_slots(value)  # Open MPI hostfiles carry it; validated, then ignored
        else:
            raise ValueError(f"unknown key '{key}' (only slots=N)")
    return HostSpec(name, slots, user)


MAX_HOSTFILE_BYTES = 4 * 1024 * 1024
"""The most bytes a hostfile may have. A host's line is tens of bytes, so 4 MiB holds far more hosts than a job
may have ranks (plan/limits.py) with room for comments; anything bigger is the wrong file (a log, a dataset,
/dev/zero), and reading stops here instead of filling memory."""

MAX_HOSTFILE_LINE = 4096
"""The most bytes of one hostfile line: a host name is at most 253 characters, so a longer line is not a
host's (a file without newlines, a binary file) and is refused without reading the rest of it."""


def _hostfile_lines(f: BinaryIO, path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the hostfile open as `f`, read one bounded line at a time (never more than
    MAX_HOSTFILE_LINE + 1 bytes at once, MAX_HOSTFILE_BYTES in all). UsageError naming `path:line` for a line
    too long, a file too big or a line that is not UTF-8."""
    total = 0
    for lineno in itertools.count(1):
        raw = f.readline(MAX_HOSTFILE_LINE + 1)
        if not raw:
            return
        total += len(raw)
        if total > MAX_HOSTFILE_BYTES:
            raise UsageError(f"--hostfile {path}: more than {MAX_HOSTFILE_BYTES // (1024 * 1024)} MiB (at line {lineno}); "
                             "a hostfile has one 'host slots=N' line per host: is this the right file?")
        if len(raw) > MAX_HOSTFILE_LINE and not raw.endswith(b"\n"):
            raise UsageError(f"{path}:{lineno}: line longer than {MAX_HOSTFILE_LINE} bytes; a hostfile has one "
                             "'host slots=N' line per host: is this the right file?")
        try:
            text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # -sig: a byte-order mark, as some editors write
        except UnicodeDecodeError:
            raise UsageError(f"{path}:{lineno}: not UTF-8 text; a hostfile is a text file of 'host slots=N' lines") from None
        yield lineno, text


def read_hostfile(path: str) -> list[HostSpec]:
    """Read and parse a hostfile, each line as it is read (bounded: MAX_HOSTFILE_BYTES, MAX_HOSTFILE_LINE).
    Raises UsageError for a missing/unreadable file, one too big, or the first bad line."""
    try:
        with open(path, "rb") as f:
            return _parse_hostfile_lines(_hostfile_lines(f, path), path)
    except FileNotFoundError:
        raise UsageError(f"--hostfile {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--hostfile {path}: is a directory, not a hostfile") from None
    except OSError as err:
        raise UsageError(f"--hostfile {path}: cannot read it ({err.strerror})") from None


@lru_cache(maxsize=None)
def _local_addresses() -> frozenset[str]:
    import psutil  # cheap, and only needed when a host is not obviously local

    return frozenset(a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs)


@lru_cache(maxsize=None)
def is_local_name(name: str) -> bool:
    """True for localhost, 127.x, ::1, this machine's hostname (short or full) and any of its addresses.

    No name is looked up in DNS (that would be slow and send queries off the machine): another alias
    of this machine counts as remote and is reached over SSH, which works too.
    """
    if name in _LOCAL_NAMES or name.startswith("127."):
        return True
    own = socket.gethostname()
    if name in (own, own.split(".")[0]):
        return True
    return name in _local_addresses()


@dataclass(frozen=True)
class Exclusion:
    """What `--exclude` takes out of a job: whole hosts, and single GPUs of a host (`host:gpu`)."""

    hosts: frozenset[str] = frozenset()
    gpus: tuple[tuple[str, int], ...] = ()   # (host, gpu id) pairs

    def gpus_of(self, host: str) -> frozenset[int]:
        return frozenset(g for h, g in self.gpus if h == host)

    def __bool__(self) -> bool:
        """Anything excluded."""
        return bool(self.hosts or self.gpus)

    def __str__(self) -> str:
        """As `--exclude` takes it (parse_exclude(str(e)) == e)."""
        return ",".join([*sorted(self.hosts), *(f"{h}:{g}" for h, g in self.gpus)])


def parse_exclude(text: str | None) -> Exclusion:
    """`--exclude h7`, `--exclude h7,h9`, `--exclude h3:1,h3:2` (GPUs 1 and 2 of h3). Raises UsageError."""
    if not text:
        return Exclusion()
    hosts: set[str] = set()
    gpus: list[tuple[str, int]] = []
    for entry in text.split(","):
        entry = entry.strip()
        name, sep, gpu = entry.partition(":")
        if not name or not _NAME.match(name) or "@" in name or (sep and not gpu.isdigit()):
            raise UsageError(f"--exclude entry '{entry}': expected HOST or HOST:GPU (e.g. --exclude h7 or --exclude h3:1)")
        if sep:
            gpus.append((name, int(gpu)))
        else:
            hosts.add(name)
    return Exclusion(frozenset(hosts), tuple(gpus))


def apply_exclude(specs: list[HostSpec], excl: Exclusion) -> list[HostSpec]:
    """The hosts less the excluded ones. Raises UsageError for a name not in the host list (a typo would
    otherwise leave the host in), or when nothing is left."""
    names = {h.name for h in specs}
    unknown = sorted((excl.hosts | {h for h, _ in excl.gpus}) - names)
    if unknown:
        raise UsageError(f"--exclude {','.join(unknown)}: not among the job's hosts ({', '.join(h.name for h in specs)})")
    left = [h for h in specs if h.name not in excl.hosts]
    if not left:
        raise UsageError("--exclude leaves no host; exclude fewer")
    return left
