"""The Ray fan-out engine (`trainrun --ray [ADDRESS]`): Ray places the ranks, trainrun runs them.

    place(np)          the launcher is the Ray driver (ray.init(ADDRESS)); one placement group with one bundle
                       per rank ({"CPU": --cpus-per-proc, "GPU": --gpus-per-proc}, --ray-strategy); once it is
                       ready, its bundle -> node map gives the job's hosts: one HostSpec per node (named by
                       the node's IP, slots = its bundles, `via="ray"`: never this machine, so every rank,
                       also on the launcher's own node, runs under a node's agent and inside its bundle)
    start_agent(host)  a NodeProcesses actor (ray_actor.py) in that node's first bundle, num_cpus=0, starts
                       `python -m trainrun.agent` (the same interpreter pick as SSH/srun: python_pick.py) and
                       relays its bytes through actor calls; here a RayLink is one end of a socketpair pumped by
                       a thread, so AgentRanks selects on a fileno as with SSH. No port is opened by trainrun.
    run_module, sweep  the same actor starts the NIC probe's modules and the reaper of a lost host
    close()            kill the actors, remove the placement group, leave Ray (also after a failure)

What is left when the launcher dies without close() (SIGKILL): Ray's owner rule (a non-detached actor and
placement group die with their driver) kills the actors; their children get SIGTERM (PR_SET_PDEATHSIG) and
stdin EOF, and an agent kills its ranks on either. A node whose raylet dies takes its actor with it: the
RayLink ends naming the node, and the job fails (static) or goes on without that node (elastic).

GPUs: with --gpus-per-proc every bundle holds an actor asking Ray for its GPUs; the node's agent runs with
CUDA_VISIBLE_DEVICES set to the ids Ray gave that node's bundles, which is the pool the agent reports and
the planner pins ranks from (facts/gpus.py). Without it the agent's pool is empty (Ray granted none).

Ray is imported here only, and only by `--ray` launches.
"""
from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any, NamedTuple, NoReturn

from trainrun.errors import HostError, UsageError
from trainrun.fanout.python_pick import EarlyStderr, python_module_argv
from trainrun.plan.hosts import HostSpec

STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict_spread": "STRICT_SPREAD"}
PLACE_TIMEOUT_S = 60.0  # for Ray to place every bundle (an autoscaler may add nodes meanwhile)
POLL_S = 1.0            # a read's long poll on the actor
CALL_TIMEOUT_S = 30.0
CLIENT_RETRY_S = 2.0    # before a ray:// client's second try   # for an actor call that answers at once (start, write)


class RayRequest(NamedTuple):
    """`--ray ADDRESS` and its placement: ADDRESS ("auto": RAY_ADDRESS, else the cluster on this machine),
    --ray-strategy, --cpus-per-proc, --gpus-per-proc (0: none), the ranks to place, seconds to connect."""

    address: str = "auto"
    strategy: str = "pack"
    cpus_per_proc: float = 1.0
    gpus_per_proc: int = 0
    np: int = 1
    timeout: float = 15.0


def bundles_for(req: RayRequest) -> list[dict[str, float]]:
    """One bundle per rank. Pure."""
    one: dict[str, float] = {"CPU": req.cpus_per_proc}
    if req.gpus_per_proc:
        one["GPU"] = float(req.gpus_per_proc)
    return [dict(one) for _ in range(req.np)]


def hosts_of(bundle_nodes: dict[int, str], node_ips: dict[str, str]) -> list[tuple[str, str, list[int]]]:
    """(host name, node id, bundle indices) per node, in the order of each node's first bundle (rank 0's node
    first); a host is named by its node's IP, or IP/node id when two nodes share an IP. Pure."""
    by_node: dict[str, list[int]] = {}
    for index in sorted(bundle_nodes):
        by_node.setdefault(bundle_nodes[index], []).append(index)
    ips = [node_ips.get(n, n) for n in by_node]
    return [(ip if ips.count(ip) == 1 else f"{ip}/{node[:8]}", node, idx)
            for ip, (node, idx) in zip(ips, by_node.items())]


def resolve_address(address: str, environ: dict[str, str] | Any) -> str:
    """--ray's ADDRESS: "auto" means RAY_ADDRESS when set (Ray's own rule), else the cluster on this machine."""
    return (environ.get("RAY_ADDRESS") or "auto") if address == "auto" else address


def gcs_endpoint(address: str, current_cluster: str = "/tmp/ray/ray_current_cluster") -> tuple[str, int] | None:
    """(host, port) that `address` names (for "auto": the file the cluster on this machine wrote), or None when
    there is none to check (ray.init then says so at once: "local", no cluster here). Pure but for that file."""
    if address == "auto":
        try:
            with open(current_cluster) as f:
                address = f.read().strip()
        except OSError:
            return None
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def check_reachable(address: str, timeout: float) -> None:
    """HostError (one line) unless `address`'s port answers within `timeout` s: ray.init retries an address
    that does not answer for minutes, logging as it goes."""
    endpoint = gcs_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=timeout).close()
    except OSError as err:
        raise HostError("ray", "connect", f"{address}: {endpoint[0]}:{endpoint[1]} does not answer "
                        f"({err.strerror or err})", hint="is Ray up there (ray status)? pass --ray HOST:6379 or set "
                        "RAY_ADDRESS") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class RayEngine:
    """FanoutEngine over a Ray cluster; `place` must run first (launchspec.resolve runs it once)."""

    name = "ray"
    reaches_local = True

    def __init__(self, req: RayRequest, environ: dict[str, str] | Any):
        self.req = req
        self.address = resolve_address(req.address, environ)
        self.python, self.strict_python = "python3", False  # engine_for sets --python's rule
        self._ray: Any = None
        self._pg: Any = None
        self._actors: dict[str, Any] = {}     # host -> its agent's actor
        self._actor_node: dict[str, str] = {}  # host -> the node id its actor was started on
        self._placed: dict[str, tuple[str, list[int]]] = {}  # host -> (node id, bundle indices) as last read
        self._lock = threading.Lock()
        self._holders: list[Any] = []         # the GPU bundles' actors
        self._gpus: dict[str, list[str]] = {}  # host -> GPU ids Ray gave its bundles
        self._ips: dict[str, str] = {}
        self._keys = 0
        self._links: list[RayLink] = []

    # -- placement (once, from launchspec.resolve through fanout/select.host_source) --

    def place(self) -> list[HostSpec]:
        """Connect, place one bundle per rank and start one actor per node; the hosts. Raises HostError (one
        line, exit 3) when Ray cannot be reached or cannot place the bundles; leaves nothing behind then."""
        try:
            return self._place()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> Any:
        import logging

        try:
            import ray
        except ImportError as err:
            raise UsageError(f"--ray: Ray is not installed here ({err}); pip install \"ray[default]==2.60.0\" "
                             "(the version of the cluster)") from None
        check_reachable(self.address, self.req.timeout)

        # A ray:// client's first connection makes the head start a server for it; on a loaded head that start
        # can fail once ("Initialization failure from server") and succeed at once after: one more try then.
        tries = 2 if self.address.startswith("ray://") else 1
        for attempt in range(tries):
            try:
                ray.init(address=self.address, namespace="trainrun", logging_level=logging.ERROR,
                         log_to_driver=False, configure_logging=False)
                break
            except Exception as err:  # noqa: BLE001 - whatever Ray says of the address, as one line
                if attempt + 1 < tries and "Initialization failure" in str(err):
                    ray.shutdown()
                    time.sleep(CLIENT_RETRY_S)
                    continue
                self._connect_failed(err)
        self._ray = ray
        return ray

    def _connect_failed(self, err: BaseException) -> NoReturn:
        """Raise the one line for an address Ray would not connect to."""
        hint = ("start one with `ray start --head`, or pass --ray HOST:6379 / set RAY_ADDRESS"
                if self.address == "auto" else "check the address (HOST:6379, or ray://HOST:10001)")
        raise HostError("ray", "connect", f"{self.address}: {_first_line(err)}", hint=hint) from None

    def _place(self) -> list[HostSpec]:
        ray = self._connect()
        from ray.util import placement_group

        req = self.req
        bundles = bundles_for(req)
        self._pg = placement_group(bundles, strategy=STRATEGIES[req.strategy])
        if not self._wait_placed(ray, f"{req.np} bundle(s) of {bundles[0]} ({req.strategy})"):
            free = ray.available_resources()
            raise HostError("ray", "place", f"{req.np} bundle(s) of {bundles[0]} ({req.strategy}) not placed in "
                            f"{PLACE_TIMEOUT_S:g} s; free now: CPU {free.get('CPU', 0):g}, GPU {free.get('GPU', 0):g} "
                            f"on {len([n for n in ray.nodes() if n['Alive']])} node(s)",
                            hint="lower -np, --cpus-per-proc or --gpus-per-proc, or use --ray-strategy pack")
        placed = self._read_placement()
        hosts = []
        for name, node, indices in placed:
            self._actors[name], self._actor_node[name] = self._actor(indices[0], gpus=req.gpus_per_proc), node
            hosts.append(HostSpec(name, len(indices), via="ray"))
            if req.gpus_per_proc:
                self._holders += [self._actor(i, gpus=req.gpus_per_proc) for i in indices[1:]]
        if req.gpus_per_proc:
            self._gather_gpus(placed)
        self._started(list(self._actors.values()))
        return hosts

    def _started(self, actors: list[Any]) -> None:
        """Wait until `actors` run (a worker process each: seconds on a loaded node), so that the agents' start
        is timed by --ssh-timeout as over SSH, not by Ray's worker start-up. HostError when they do not."""
        ray = self._ray
        try:
            ray.get([a.node.remote() for a in actors], timeout=PLACE_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - timed out, or a node died meanwhile
            raise HostError("ray", "start", f"the job's actors did not start in {PLACE_TIMEOUT_S:g} s: "
                            f"{_first_line(err)}", hint="see `ray status` and the nodes' raylet logs") from None

    def _wait_placed(self, ray: Any, what: str) -> bool:
        """Whether Ray placed the group within PLACE_TIMEOUT_S; says once (stderr) when Ray finds it infeasible
        on the nodes there are, and waits on (an autoscaler may add a node that fits)."""
        import sys

        from ray.util import placement_group_table

        ready, deadline, said = self._pg.ready(), time.monotonic() + PLACE_TIMEOUT_S, False
        while time.monotonic() < deadline:
            if ray.wait([ready], timeout=1.0)[0]:
                return True
            state = placement_group_table(self._pg).get("stats", {}).get("scheduling_state")
            if state == "INFEASIBLE" and not said:
                print(f"trainrun: Ray cannot place {what} on the nodes there are (infeasible); waiting up to "
                      f"{PLACE_TIMEOUT_S:g} s for nodes to join", file=sys.stderr, flush=True)
                said = True
        return False

    def _read_placement(self) -> list[tuple[str, str, list[int]]]:
        """The group's bundles on the nodes alive now, per host (hosts_of), remembered for reach()."""
        from ray.util import placement_group_table

        ray = self._ray
        alive = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        table = placement_group_table(self._pg)
        placed = hosts_of({int(i): n for i, n in table["bundles_to_node_id"].items() if n in alive}, alive)
        with self._lock:
            self._placed = {name: (node, indices) for name, node, indices in placed}
            self._ips.update({name: alive[node] for name, node, _ in placed})
        return placed

    def current_hosts(self) -> list[HostSpec]:
        """The hosts the placement group has now (an elastic job's discovery, polled from a thread): a dead
        node's bundles are gone from it, and come back where Ray places them again (a node that joined)."""
        try:
            placed = self._read_placement()
        except Exception as err:  # noqa: BLE001 - Ray busy or gone: the last answer stands (LiveHosts)
            raise UsageError(f"--ray: cannot read the placement group: {_first_line(err)}") from None
        return [HostSpec(name, len(indices), via="ray") for name, _node, indices in placed]

    def _actor(self, bundle: int, gpus: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trainrun.fanout.ray_actor import NodeProcesses

        cls = ray.remote(NodeProcesses)
        strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=bundle,
                                                    placement_group_capture_child_tasks=False)
        return cls.options(num_cpus=0, num_gpus=gpus, max_concurrency=64, scheduling_strategy=strategy,
                           max_restarts=0).remote()

    def _gather_gpus(self, placed: list[tuple[str, str, list[int]]]) -> None:
        ray = self._ray
        holders = iter(self._holders)
        for name, _node, indices in placed:
            actors = [self._actors[name]] + [next(holders) for _ in indices[1:]]
            ids = ray.get([a.gpu_ids.remote() for a in actors], timeout=CALL_TIMEOUT_S)
            self._gpus[name] = [str(g) for one in ids for g in one]

    # -- FanoutEngine --

    def reach(self, hosts: list[HostSpec]) -> dict[str, HostError]:
        """A host whose node has no live actor of ours (a node Ray placed bundles on after the start, or a new
        node at a lost one's IP) gets one, in its first bundle there."""
        failed = {}
        for h in hosts:
            with self._lock:
                node, indices = self._placed.get(h.name, ("", []))
            if not node:
                failed[h.name] = HostError(h.name, "ray", "no bundle of this job's placement group there now",
                                           hint="with --ray the hosts come from Ray; drop -H/--hostfile")
            elif self._actor_node.get(h.name) != node:
                self._actors[h.name], self._actor_node[h.name] = self._actor(indices[0], gpus=self.req.gpus_per_proc), node
        return failed

    def _key(self, what: str) -> str:
        self._keys += 1
        return f"{what}-{self._keys}"

    def _env(self, host: str) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self._gpus.get(host, []))}

    def start_agent(self, host: str) -> RayLink:
        argv = python_module_argv(self.python, "trainrun.agent", strict=self.strict_python)
        link = RayLink(host, self._actors[host], self._key("agent"), argv, self._env(host), self._ips[host])
        self._links.append(link)
        return link

    def run_module(self, host: str, module: str, *args: str, python: str | None = None,
                   timeout: float = 30.0) -> RayModuleChannel:
        argv = python_module_argv(python or self.python, module, *args, strict=self.strict_python and not python)
        return RayModuleChannel(self._actors[host], self._key("module"), argv, self._env(host), timeout)

    def sweep(self, host: str, job_id: str, mark_host: str, agent: str | None, timeout: float = 15.0) -> str | None:
        """Through the node's actor (a new child of it), kill the tree of agent `agent` and the job's processes
        there (supervisor/reaper.py). None when nothing is left, else why not: a node whose actor is gone (its
        raylet died) took the agent's parent with it, and the agent ends its ranks on the EOF and SIGTERM."""
        actor = self._actors.get(host)
        if actor is None:
            return "not a node of this job"
        argv = python_module_argv(self.python, "trainrun.supervisor.reaper", job_id, mark_host, *([agent] if agent else []),
                                  strict=self.strict_python)
        try:
            channel = RayModuleChannel(actor, self._key("reaper"), argv, {}, timeout)
            said = channel.read().decode(errors="replace").strip()
            rc = channel.exit_status()
        except Exception as err:  # noqa: BLE001 - the node's actor is gone or does not answer
            return (f"its Ray actor is gone ({_first_line(err)}); the agent there ends its ranks when its Ray "
                    "worker exits")
        if rc == 0:
            return None
        return f"processes left after the cleanup: {said or f'exit {rc}'}"

    def close(self) -> None:
        """Kill every actor (their children get SIGTERM and EOF), remove the placement group, leave Ray.
        Safe to call more than once and after a failed place()."""
        ray = self._ray
        if ray is None:
            return
        for link in self._links:
            link.stop()
        for actor in [*self._actors.values(), *self._holders]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        if self._pg is not None:
            from ray.util import remove_placement_group

            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - already removed, or Ray gone
                pass
        self._actors.clear()
        self._holders.clear()
        self._pg = self._ray = None
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass


def route_to(ip: str) -> str:
    """This machine's address on the route to `ip` (a UDP connect() picks it without sending)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class RayLink:
    """An agent under a node's actor. Its stdout arrives on `fileno()` (a socketpair end a thread fills from
    the actor's long-poll reads), its stderr in `read()`'s second item; writes go out in order through one
    writer thread (an actor call each, batched)."""

    def __init__(self, host: str, actor: Any, key: str, argv: list[str], env: dict[str, str], ip: str):
        self.host = host
        self.peer_address, self.local_address = ip, route_to(ip)
        self._actor, self._key = actor, key
        self._mine, theirs = socket.socketpair()
        self._mine.setblocking(False)
        self._err = bytearray()
        self._lock = threading.Lock()
        self._why: str | None = None
        self._stopping = False
        self._first_err = EarlyStderr(host)  # a no-python line there ends the start at once
        self._writes: queue.SimpleQueue = queue.SimpleQueue()
        self._spawned = actor.spawn.remote(key, argv, env)
        self._pump = threading.Thread(target=self._read_loop, args=(theirs,), daemon=True, name=f"ray-read-{host}")
        self._writer = threading.Thread(target=self._write_loop, daemon=True, name=f"ray-write-{host}")
        self._pump.start()
        self._writer.start()

    def _read_loop(self, theirs: socket.socket) -> None:
        import ray

        try:
            ray.get(self._spawned, timeout=CALL_TIMEOUT_S)
            while True:
                out, err, ended = ray.get(self._actor.read.remote(self._key, POLL_S))
                if err:
                    with self._lock:
                        self._err += err
                if out:
                    theirs.sendall(out)
                if ended:
                    return
        except Exception as err:  # noqa: BLE001 - the actor died (its node lost) or Ray is gone
            if not self._stopping:
                self._why = f"its Ray actor died: {_first_line(err)}"
        finally:
            theirs.close()  # EOF on fileno(): AgentRanks reads the end

    def _write_loop(self) -> None:
        import ray

        while True:
            item = self._writes.get()
            if item is None:
                try:
                    ray.get(self._actor.close_stdin.remote(self._key), timeout=CALL_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - gone already: so is its stdin
                    pass
                return
            data = bytearray(item)
            while not self._writes.empty():  # batch what queued meanwhile (never past the EOF marker)
                nxt = self._writes.get()
                if nxt is None:
                    self._writes.put(None)
                    break
                data += nxt
            try:
                if not ray.get(self._actor.write.remote(self._key, bytes(data)), timeout=CALL_TIMEOUT_S):
                    return
            except Exception:  # noqa: BLE001 - the read loop names the end
                return

    def fileno(self) -> int:
        return self._mine.fileno()

    def read(self) -> tuple[bytes, bytes, bool]:
        try:
            out = self._mine.recv(1 << 16)
        except BlockingIOError:
            out = None
        except OSError:
            out = b""
        with self._lock:
            err = bytes(self._err)
            self._err.clear()
        self._first_err.feed(err)
        return out or b"", err, out == b""

    def write(self, data: bytes) -> None:
        self._writes.put(bytes(data))

    def shutdown(self) -> None:
        self._writes.put(None)

    def wait(self, timeout: float) -> None:
        self._pump.join(timeout)
        if self._pump.is_alive():
            try:
                self._actor.kill.remote(self._key)
            except Exception:  # noqa: BLE001
                pass
            self._pump.join(5.0)

    def close(self, wait: float) -> None:
        self.shutdown()
        self.wait(wait)

    def disconnect(self) -> None:
        pass

    def stop(self) -> None:
        """The engine is closing: an end from here on is ours, not a lost node."""
        self._stopping = True
        self._writes.put(None)

    def why_ended(self) -> str | None:
        return self._why


class RayModuleChannel:
    """`python -m MODULE ARGS` under a node's actor (ModuleChannel): synchronous reads over actor calls."""

    def __init__(self, actor: Any, key: str, argv: list[str], env: dict[str, str], timeout: float):
        import ray

        self._ray, self._actor, self._key, self._timeout = ray, actor, key, timeout
        self._buf = bytearray()
        self._err = bytearray()
        self._ended = False
        self._call(actor.spawn, argv, env)
        self._heard = time.monotonic()

    def _more(self) -> None:
        """One long poll; TimeoutError (an OSError, as a socket's) after `timeout` s with no byte and no end."""
        out, err, ended = self._call(self._actor.read, POLL_S, timeout=POLL_S + self._timeout)
        self._buf += out
        self._err += err
        self._ended = self._ended or ended
        if out or err or ended:
            self._heard = time.monotonic()
        elif time.monotonic() - self._heard > self._timeout:
            raise TimeoutError(f"no answer in {self._timeout:g} s")

    def readline(self) -> bytes:
        while b"\n" not in self._buf and not self._ended:
            self._more()
        cut = self._buf.find(b"\n") + 1 or len(self._buf)
        line = bytes(self._buf[:cut])
        del self._buf[:cut]
        return line

    def read(self) -> bytes:
        while not self._ended:
            self._more()
        out = bytes(self._buf)
        self._buf.clear()
        return out

    def _call(self, method: Any, *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        """An actor call on this child; OSError (what callers of a channel catch, as of a socket) when the actor
        is gone or does not answer in `timeout` s."""
        try:
            return self._ray.get(method.remote(self._key, *args), timeout=timeout)
        except Exception as err:  # noqa: BLE001 - RayActorError, GetTimeoutError: the channel is gone
            raise OSError(f"the node's Ray actor: {_first_line(err)}") from None

    def send(self, data: bytes) -> None:
        self._call(self._actor.write, data)

    def close_stdin(self) -> None:
        self._call(self._actor.close_stdin)

    def exit_status(self) -> int:
        rc = self._call(self._actor.wait, self._timeout, timeout=self._timeout + CALL_TIMEOUT_S)
        return 124 if rc is None else int(rc)

    def stderr_text(self) -> str:
        return self._err.decode(errors="replace")

    def close(self) -> None:
        try:
            self._ray.get(self._actor.kill.remote(self._key), timeout=CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - gone already
            pass

