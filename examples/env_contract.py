"""Print the environment contract this rank got from trainrun.

    trainrun -np 2 examples/env_contract.py
    trainrun -H localhost:2,127.0.0.1:2 examples/env_contract.py     # two "hosts": NODE_RANK 0 and 1

Each rank prints one line per variable; the launcher prefixes them with [rank]<stdout>:.
Run alone (python examples/env_contract.py) it says it was not started by trainrun.
"""
import os
import sys

CONTRACT = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT",
    "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES",
    "PMI_FD", "PMI_RANK", "PMI_SIZE",
)


def main() -> int:
    if "TRAINRUN_RANK" not in os.environ:
        print("not started by trainrun; try: trainrun -np 2 examples/env_contract.py", file=sys.stderr)
        return 1
    names = [n for n in CONTRACT if n in os.environ]
    names += sorted(n for n in os.environ if n.startswith("TRAINRUN_"))
    width = max(map(len, names))
    for name in names:
        print(f"{name.ljust(width)} = {os.environ[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
