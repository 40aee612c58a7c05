"""MPICH's process-manager side of PMI-1 ("simple PMI", wire version 1), without any I/O.

The launcher is the process manager of the MPI world: every rank talks PMI-1 over its own socket (an
inherited `PMI_FD`, see pmienv.socket_env), and the job's key-value space (KVS) lives here. This module only turns
bytes received from a rank into bytes to send back; who owns the sockets (the local loop, or a per-host
agent relaying lines over SSH) is the caller's business, so the same `PmiServer` serves every host.

Wire format (one command per `\\n`-terminated line): `cmd=NAME key=value key=value ...`, tokens separated
by spaces, keys of `[A-Za-z0-9_/-]`, a backslash in a value escapes the next character (MPICH's parser).
Replies are built the same way and escape `\\` and spaces in values.

Not supported, by design: `mcmd=spawn` (MPI_Comm_spawn), name publishing and singleton init; they are
reported as protocol errors. PMI-2 and PMIx do not work with the mpich wheel in this mode anyway.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024
# An unterminated line longer than this is an error, so a runaway rank cannot grow the launcher's memory.
LINE_MAX = 4096

# key=value, then spaces or the end; a backslash escapes the next character of a value.
_TOKEN = re.compile(r"([A-Za-z0-9_/-]+)=((?:\\.|[^ \\])+)(?: +|$)")
_UNESCAPE = re.compile(r"\\(.)")


# Services a process manager may decline: the rank gets rc=-1 and MPI returns an error to the program.
OPTIONAL_COMMANDS = ("publish_name", "unpublish_name", "lookup_name")


class PmiProtocolError(ValueError):
    """A line that is not PMI-1 wire format; the message says what is wrong with it."""


@dataclass(frozen=True)
class PmiJob:
    """What the server tells every rank: world size, KVS name, node layout (see `process_mapping`)."""

    size: int
    kvsname: str
    process_mapping: str
    appnum: int = 0

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"PMI job size must be >= 1, got {self.size}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,%d}" % KVSNAME_MAX, self.kvsname):
            raise ValueError(f"bad KVS name {self.kvsname!r}: 1-{KVSNAME_MAX} chars of [A-Za-z0-9_.-]")


@dataclass
class PmiStep:
    """The outcome of one `PmiServer.feed` call, for the event loop to act on.

    replies: `(rank, bytes)` in order; write each to that rank's socket.
    initialized: ranks that completed `init` (or `initack`) in this step: for --start-timeout.
    finalized: ranks that sent `finalize`: they may now exit with code 0 without failing the job.
    aborted: `(rank, exitcode, message)` when a rank called MPI_Abort. MPICH does not end its processes
        then: the loop must kill the whole job and exit with `exitcode`.
    unsupported: `(rank, message)` per optional service trainrun does not offer (name publishing): the
        rank got `rc=-1` and MPI reports the failure to the program, as with Hydra's "not found"; the job goes on.
    errors: `(rank, message)` per protocol violation (malformed line, unknown command, bad argument). The rank got an `rc=-1` reply where one was possible; the job cannot go on
        correctly, so the loop should fail it (Hydra does the same).
    """

    replies: list[tuple[int, bytes]] = field(default_factory=list)
    initialized: list[int] = field(default_factory=list)
    finalized: list[int] = field(default_factory=list)
    aborted: tuple[int, int, str] | None = None
    errors: list[tuple[int, str]] = field(default_factory=list)
    unsupported: list[tuple[int, str]] = field(default_factory=list)


def parse_line(line: bytes) -> tuple[str, dict[str, str]]:
    """`b"cmd=get kvsname=K key=A"` -> `("get", {"kvsname": "K", "key": "A"})`; raises PmiProtocolError."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise PmiProtocolError(f"not UTF-8: {line[:80]!r}") from None
    if not text.startswith("cmd="):
        raise PmiProtocolError(f"expected 'cmd=...', got {text[:80]!r}")
    args: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise PmiProtocolError(f"bad token at column {pos} of {text[:120]!r}")
        args[m[1]] = _UNESCAPE.sub(r"\1", m[2])
        pos = m.end()
    return args.pop("cmd"), args


def format_line(cmd: str, **args: object) -> bytes:
    """`format_line("put_result", rc=0)` -> `b"cmd=put_result rc=0\\n"` (values escaped)."""
    parts = [f"cmd={cmd}"] + [f"{k}={_escape(str(v))}" for k, v in args.items()]
    return (" ".join(parts) + "\n").encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


class PmiServer:
    """The job's PMI-1 state: KVS, barrier, per-rank line buffers, who initialized/finalized.

    Feed it every byte read from rank r's PMI socket with `feed(r, data)`; it never blocks or does I/O.
    Barrier: `barrier_out` goes to all ranks once all `size` ranks sent `barrier_in`; barriers repeat.
    The KVS starts with `PMI_process_mapping`; puts are visible at once; an absent key gets `rc=-1`.
    EOF on a socket is the loop's to judge (a rank that did not finalize died).
    PMI_PORT/PMI_ID style (TCP): a new connection's first line is `cmd=initack pmiid=N`; read N with
    `parse_line` to learn the rank, then feed it all, that line included.
    """

    def __init__(self, job: PmiJob):
        self.job = job
        self._kvs = {"PMI_process_mapping": job.process_mapping}
        self._partial: dict[int, bytes] = {}
        self._in_barrier: set[int] = set()

    def feed(self, rank: int, data: bytes) -> PmiStep:
        """Handle every complete line in `data` (after what was buffered for `rank`); keep the rest."""
        if not 0 <= rank < self.job.size:
            raise ValueError(f"rank {rank} outside the job (size {self.job.size})")
        *lines, rest = (self._partial.pop(rank, b"") + data).split(b"\n")
        step = PmiStep()
        for line in lines:
            self._handle(rank, line, step)
        if len(rest) > LINE_MAX:
            step.errors.append((rank, f"PMI line longer than {LINE_MAX} bytes without newline"))
        elif rest:
            self._partial[rank] = rest
        return step

    def _handle(self, rank: int, line: bytes, step: PmiStep) -> None:
        try:
            cmd, args = parse_line(line)
        except PmiProtocolError as err:
            why = "MPI_Comm_spawn (PMI mcmd) is not supported by trainrun" if line.startswith(b"mcmd=") else str(err)
            step.errors.append((rank, why))
            return
        try:
            handler = getattr(self, f"_cmd_{cmd}", None)
            if handler is None and cmd in OPTIONAL_COMMANDS:
                message = f"cmd={cmd}: not offered by trainrun (MPI name publishing)"
                step.unsupported.append((rank, message))
                step.replies.append((rank, format_line(_REPLY_NAME.get(cmd, f"{cmd}_result"), rc=-1, msg=message)))
                return
            if handler is None:
                raise PmiProtocolError("unknown or unsupported command")
            handler(rank, args, step)
        except PmiProtocolError as err:
            message = f"cmd={cmd}: {err}"
            step.errors.append((rank, message))
            step.replies.append((rank, format_line(_REPLY_NAME.get(cmd, f"{cmd}_result"), rc=-1, msg=message)))

    def _cmd_initack(self, rank, args, step):
        if _int_arg(args, "pmiid") != rank:
            raise PmiProtocolError(f"pmiid={args['pmiid']} on the connection of rank {rank}")
        reply = format_line("initack", rc=0) + format_line("set", size=self.job.size)
        step.replies.append((rank, reply + format_line("set", rank=rank) + format_line("set", debug=0)))
        step.initialized.append(rank)

    def _cmd_init(self, rank, args, step):
        version = (_int_arg(args, "pmi_version"), _int_arg(args, "pmi_subversion"))
        if version[0] != 1:
            raise PmiProtocolError(f"PMI version {version[0]}.{version[1]} requested, only 1.1 is served")
        step.replies.append((rank, format_line("response_to_init", pmi_version=1, pmi_subversion=1, rc=0)))
        step.initialized.append(rank)

    def _cmd_get_maxes(self, rank, args, step):
        reply = format_line("maxes", kvsname_max=KVSNAME_MAX, keylen_max=KEYLEN_MAX, vallen_max=VALLEN_MAX, rc=0)
        step.replies.append((rank, reply))

    def _cmd_get_appnum(self, rank, args, step):
        step.replies.append((rank, format_line("appnum", appnum=self.job.appnum, rc=0)))

    def _cmd_get_my_kvsname(self, rank, args, step):
        step.replies.append((rank, format_line("my_kvsname", kvsname=self.job.kvsname, rc=0)))

    def _cmd_get_universe_size(self, rank, args, step):
        step.replies.append((rank, format_line("universe_size", size=self.job.size, rc=0)))

    def _cmd_put(self, rank, args, step):
        self._check_kvsname(args)
        key, value = _str_arg(args, "key"), _str_arg(args, "value")
        if len(key) > KEYLEN_MAX or len(value) > VALLEN_MAX:
            raise PmiProtocolError(f"key {key[:80]!r} or its value exceeds {KEYLEN_MAX}/{VALLEN_MAX} chars")
        self._kvs[key] = value
        step.replies.append((rank, format_line("put_result", rc=0)))

    def _cmd_get(self, rank, args, step):
        self._check_kvsname(args)
        key = _str_arg(args, "key")
        if key in self._kvs:
            step.replies.append((rank, format_line("get_result", rc=0, value=self._kvs[key])))
        else:  # not an error: MPICH asks for optional keys (PMI_hwloc_xmlfile, ...)
            step.replies.append((rank, format_line("get_result", rc=-1, msg=f"key_{key}_not_found")))

    def _cmd_barrier_in(self, rank, args, step):
        if rank in self._in_barrier:
            raise PmiProtocolError("barrier_in twice in one barrier")
        self._in_barrier.add(rank)
        if len(self._in_barrier) == self.job.size:
            step.replies.extend((r, format_line("barrier_out", rc=0)) for r in sorted(self._in_barrier))
            self._in_barrier.clear()

    def _cmd_finalize(self, rank, args, step):
        step.replies.append((rank, format_line("finalize_ack", rc=0)))
        step.finalized.append(rank)

    def _cmd_abort(self, rank, args, step):
        exitcode = _int_arg(args, "exitcode") if "exitcode" in args else 1
        if step.aborted is None:
            step.aborted = (rank, exitcode, args.get("message", ""))

    def _check_kvsname(self, args):
        if args.get("kvsname", self.job.kvsname) != self.job.kvsname:
            raise PmiProtocolError(f"unknown KVS {args['kvsname']!r} (this job's is {self.job.kvsname!r})")


# Reply command names, so an error in a known command still answers the name the client waits for.
_REPLY_NAME = {"initack": "initack", "init": "response_to_init", "barrier_in": "barrier_out",
               "finalize": "finalize_ack", "publish_name": "publish_result", "unpublish_name": "unpublish_result",
               "lookup_name": "lookup_result"}


def _str_arg(args: dict[str, str], key: str) -> str:
    if key not in args:
        raise PmiProtocolError(f"missing {key}=")
    return args[key]


def _int_arg(args: dict[str, str], key: str) -> int:
    value = _str_arg(args, key)
    try:
        return int(value)
    except ValueError:
        raise PmiProtocolError(f"{key}={value!r} is not an integer") from None


def process_mapping(ranks_per_node: list[int]) -> str:
    """`PMI_process_mapping` for block placement: node i holds the next `ranks_per_node[i]` ranks.

    Runs of nodes with the same count are compressed: `[2, 2, 1]` -> `(vector,(0,2,2),(2,1,1))`
    (triples are `(first node, node count, ranks per node)`, as Hydra serves them; Hydra 5.0.2 writes a
    one-node, one-rank block `(n,1,1)` as plain `n`, MPICH reads both). Raises ValueError
    for an empty list or a node without ranks.
    """
    if not ranks_per_node or min(ranks_per_node) < 1:
        raise ValueError(f"every node needs at least one rank, got {ranks_per_node}")
    blocks: list[list[int]] = []
    for node, ppn in enumerate(ranks_per_node):
        if blocks and blocks[-1][2] == ppn:
            blocks[-1][1] += 1
        else:
            blocks.append([node, 1, ppn])
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"

