"""One pipeline for every mode (issue 39), on 3 simulated hosts: `--check`, a static launch, an elastic launch
and a `--tf-cluster` launch of the same hosts name the same NICs and the same MASTER_ADDR (before: --check kept
NICs by a rule of its own, subnet matches included, and wrote them to the cache a launch reads)."""
import json
import subprocess
import sys

ENV_LINE = ("import os, json; e = os.environ; print(json.dumps({k: e.get(k) for k in ('RANK', 'MASTER_ADDR', "
            "'NCCL_SOCKET_IFNAME', 'TF_CONFIG')}), flush=True)")


def trainrun(cluster, *args, cwd, timeout=180):
    argv = [sys.executable, "-m", "trainrun", "--ssh-config", str(cluster.ssh_config), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def envs(run) -> dict[int, dict]:
    assert run.returncode == 0, run.stderr
    out = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            out[int(doc["RANK"])] = doc
    return out


def test_check_launch_elastic_and_tf_cluster_agree_on_nics_and_master_addr(cluster, tmp_path):
    hosts = ("-H", "h1:1,h2:1,h3:1", "--no-cache")
    check = trainrun(cluster, *hosts, "--check", "--json", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    nics = json.loads(check.stdout)["nics"]
    assert nics == ["eth0", "eth1"]  # the NICs of one name on every host, as a launch chooses them
    run = (sys.executable, "-c", ENV_LINE)
    static = envs(trainrun(cluster, *hosts, "--prefix", "none", *run, cwd=tmp_path))
    elastic = envs(trainrun(cluster, *hosts, "--max-restarts", 1, "--prefix", "none", *run, cwd=tmp_path))
    ps = envs(trainrun(cluster, *hosts, "--tf-cluster", "ps=1", "--prefix", "none", *run, cwd=tmp_path))
    master = static[0]["MASTER_ADDR"]
    for mode, got in (("static", static), ("elastic", elastic), ("tf-cluster", ps)):
        assert got, mode
        for rank, env in got.items():
            assert (env["MASTER_ADDR"], env["NCCL_SOCKET_IFNAME"]) == (master, ",".join(nics)), (mode, rank, env)
    chief = json.loads(ps[0]["TF_CONFIG"])["cluster"]
    assert chief["chief"][0].rsplit(":", 1)[0] == master  # rank 0's address in TF_CONFIG is MASTER_ADDR
