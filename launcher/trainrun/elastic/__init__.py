"""Elastic training without a disk checkpoint: Horovod's elastic API, framework-free core.

Ranks of an elastic trainrun job (`--max-restarts`, `--min-np`, `--host-discovery-script`) commit their
state to the agent of their host (protocol.py, client.py); after a failure or a change of hosts the
launcher starts a new set of ranks and `state.sync()` loads the newest copy any host holds. state.py has
the API (`run`, `State`, `ObjectState`, `HostsUpdatedInterrupt`); `trainrun.torch.elastic` adds
`TorchState`. Importing this package is cheap (the launcher imports protocol.py): numpy and the runtime
are imported when a state is first used.
"""
from trainrun.elastic.state import HostsUpdatedInterrupt, ObjectState, State, restart_count, run
