"""A Spark driver for the cluster tests (run in the root namespace by tests/cluster/spark): a Horovod-shaped
program run by `horovod.spark.run` on the testbed's standalone cluster.

    python spark_driver.py MASTER_URL CONF_JSON MODE

MODE train: 4 ranks train a small torch model a few steps; prints RESULTS <json> (rank, size, host, the
            parameters' sum after training). raise: rank 3 raises; prints RAISED <type> <message>.
elastic:    run_elastic (min 2, max 4): rank 3 exits in the first attempt; prints RESULTS of the next.
hang:       every rank prints READY and sleeps (the tests kill a worker or this driver).
"""
import json
import sys
import time


def train():
    import socket

    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for _ in range(5):
        x = torch.randn(32, 8)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    total = float(sum(p.detach().double().sum() for p in model.parameters()))
    return {"rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(), "sum": total}


def fail():
    import socket

    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 3:
        raise ValueError(f"rank three fails on {socket.gethostname()}")
    time.sleep(60)
    return hvd.rank()


def elastic_once():
    """Rank 3 ends with exit code 9 in the first attempt; the next attempt runs on the hosts left."""
    import os
    import socket

    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 3 and os.environ.get("TRAINRUN_RESTART_COUNT", "0") == "0":
        print("FAILED_ON", socket.gethostname(), flush=True)
        os._exit(9)
    import torch

    hvd.allreduce(torch.tensor([1.0]), name="after")  # no rank ends the first attempt before rank 3 fails
    return {"rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(),
            "attempt": os.environ.get("TRAINRUN_RESTART_COUNT")}


def hang():
    import horovod.torch as hvd

    hvd.init()
    print("READY", hvd.rank(), flush=True)
    time.sleep(600)


def main():
    master, conf, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(f"trainrun-test-{mode}")
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    import horovod.spark

    t0 = time.time()
    try:
        if mode == "elastic":
            results = horovod.spark.run_elastic(elastic_once, num_proc=4, min_num_proc=2, max_num_proc=4, reset_limit=1)
        else:
            results = horovod.spark.run({"train": train, "raise": fail, "hang": hang}[mode], num_proc=4)
    except Exception as err:
        print("RAISED", type(err).__name__, str(err).replace("\n", " | "), flush=True)
        spark.stop()
        sys.exit(3)
    print("RESULTS", json.dumps(results), f"{time.time() - t0:.1f}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
