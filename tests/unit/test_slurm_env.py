"""trainrun.slurm: Slurm's compressed lists, the allocation read from an environment, the batch script.
Pure tests; the same forms are checked against real Slurm in tests/cluster/test_slurm_sbatch.py."""
import shlex
import subprocess
import sys

import pytest

from trainrun.errors import UsageError
from trainrun.slurm.allocation import Allocation, SlurmEnvError, SlurmHost
from trainrun.slurm.nodelist import expand_counts, expand_nodelist
from trainrun.slurm.sbatch import (
    SbatchOptionError,
    build_script,
    directive_lines,
    job_id,
    sbatch_argv,
)

# Real-world forms: the expected lists are what `scontrol show hostnames` (22.05) prints for them.
NODELISTS = [
    ("h1", ["h1"]),
    ("h[1-2]", ["h1", "h2"]),
    ("h[1-3,7],gpu-[01-04]", ["h1", "h2", "h3", "h7", "gpu-01", "gpu-02", "gpu-03", "gpu-04"]),
    ("node[001-003]", ["node001", "node002", "node003"]),
    ("h[8-10]", ["h8", "h9", "h10"]),
    ("h[08-10]", ["h08", "h09", "h10"]),
    ("h[9-011]", ["h9", "h10", "h11"]),            # the width is the low bound's
    ("h[01-2]", ["h01", "h02"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
    ("h[1-2][3-4]", ["h13", "h14", "h23", "h24"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("h1-[1-2]", ["h1-1", "h1-2"]),
    ("nid[00010-00012,00100]", ["nid00010", "nid00011", "nid00012", "nid00100"]),
    ("cn[5],login1", ["cn5", "login1"]),
    ("[1-2]", ["1", "2"]),
    ("h[1-2],,h3", ["h1", "h2", "h3"]),
    ("h[1,1]", ["h1", "h1"]),
    (" h1 ", ["h1"]),
    # text after a lone bracket group: newer Slurm; 22.05's scontrol refuses it (prints nothing)
    ("gpu-a100-[1-2].cluster.example", ["gpu-a100-1.cluster.example", "gpu-a100-2.cluster.example"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
]


@pytest.mark.parametrize("text, names", NODELISTS)
def test_expand_nodelist(text, names):
    assert expand_nodelist(text) == names


@pytest.mark.parametrize("text, fragment", [
    ("h[1-2", "'[' without ']'"),
    ("h1]", "']' without '['"),
    ("h[1-[2]]", "nested '['"),
    ("h[]", "bad range ''"),
    ("h[a-b]", "bad range 'a-b'"),
    ("h[3-1]", "goes down"),
    ("h[1-2-3]", "bad range '1-2-3'"),
    ("", "no host"),
    (",", "no host"),
    ("h 1", "blank inside"),
    ("h[1-100000000]", "more than"),
    ("a[1-1000]b[1-1000]c[1-1000]", "more than"),
])
def test_expand_nodelist_errors(text, fragment):
    with pytest.raises(ValueError) as e:
        expand_nodelist(text)
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, counts", [
    ("1", [1]),
    ("2(x3)", [2, 2, 2]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("72(x2),36", [72, 72, 36]),
    ("1,2,3", [1, 2, 3]),
    ("4(x1)", [4]),
])
def test_expand_counts(text, counts):
    assert expand_counts(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(3)", "(x2)", "2(x0)", "-1", "2(x3)1", "2,,1"])
def test_expand_counts_errors(text):
    with pytest.raises(ValueError, match="bad count|repeat"):
        expand_counts(text)


SALLOC_N2 = {  # `salloc -N2 env` on the test cluster, trimmed
    "SLURM_JOB_ID": "3", "SLURM_JOBID": "3", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_NODELIST": "h[1-2]",
    "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_CPUS_PER_NODE": "1(x2)", "SLURM_JOB_NUM_NODES": "2",
}


def env(**kw):
    return {**SALLOC_N2, **kw}


def test_outside_an_allocation():
    assert Allocation.from_environ({"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf"}) is None


@pytest.mark.parametrize("environ, hosts, ntasks, slots_from", [
    (SALLOC_N2, [("h1", 1, 1), ("h2", 1, 1)], None, "SLURM_TASKS_PER_NODE"),
    (env(SLURM_JOB_NODELIST="h[1-3]", SLURM_TASKS_PER_NODE="2(x3)", SLURM_JOB_CPUS_PER_NODE="2(x3)",
         SLURM_NTASKS="6"), [("h1", 2, 2), ("h2", 2, 2), ("h3", 2, 2)], 6, "SLURM_TASKS_PER_NODE"),
    (env(SLURM_JOB_NODELIST="gpu-[01-02],cpu7", SLURM_TASKS_PER_NODE="4(x2),1",
         SLURM_JOB_CPUS_PER_NODE="64(x2),8", SLURM_NTASKS="9"),
     [("gpu-01", 4, 64), ("gpu-02", 4, 64), ("cpu7", 1, 8)], 9, "SLURM_TASKS_PER_NODE"),
    ({"SLURM_JOBID": "77", "SLURM_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "8,4"},   # old names, no tasks
     [("n1", 8, 8), ("n2", 4, 4)], None, "SLURM_JOB_CPUS_PER_NODE"),
    ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "a,b"}, [("a", 1, None), ("b", 1, None)], None, ""),
    (env(SLURM_NPROCS="3"), [("h1", 1, 1), ("h2", 1, 1)], 3, "SLURM_TASKS_PER_NODE"),   # old name of NTASKS
])
def test_allocation_from_environ(environ, hosts, ntasks, slots_from):
    a = Allocation.from_environ(environ)
    assert [(h.name, h.slots, h.cpus) for h in a.hosts] == hosts
    assert a.ntasks == ntasks and a.slots_from == slots_from
    assert a.default_np == (ntasks if ntasks is not None else sum(h[1] for h in hosts))


def test_allocation_values():
    a = Allocation.from_environ(env(SLURM_JOB_NODELIST="h[1-3]", SLURM_TASKS_PER_NODE="2(x2),1",
                                    SLURM_JOB_CPUS_PER_NODE="2(x3)"))
    assert a.job_id == "3" and a.names == ["h1", "h2", "h3"] and a.slots == 5 and a.default_np == 5
    assert a.hosts[2] == SlurmHost("h3", 1, 2, None)
    assert a.describe() == "Slurm job 3: 3 hosts h1, h2, h3, 5 slots (SLURM_TASKS_PER_NODE)"
    big = Allocation.from_environ(env(SLURM_JOB_NODELIST="n[1-64]", SLURM_TASKS_PER_NODE="8(x64)",
                                      SLURM_JOB_CPUS_PER_NODE="8(x64)"))
    assert big.describe() == "Slurm job 3: 64 hosts n1..n64, 512 slots (SLURM_TASKS_PER_NODE)"


@pytest.mark.parametrize("extra, gpus", [
    ({}, None),
    ({"SLURM_GPUS_PER_NODE": "4"}, 4),
    ({"SLURM_GPUS_PER_NODE": "a100:8"}, 8),
    ({"SLURM_GPUS_PER_NODE": "gpu:a100:2,gpu:v100:1"}, 3),
    ({"SLURM_GPUS_ON_NODE": "2"}, None),                       # two hosts: only this one's count is known
    ({"SLURM_JOB_GPUS": "0,1"}, None),
])
def test_gpus_of_a_two_host_allocation(extra, gpus):
    assert {h.gpus for h in Allocation.from_environ(env(**extra)).hosts} == {gpus}


@pytest.mark.parametrize("extra, gpus", [
    ({"SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1,2"}, 2),   # the count wins over the index list
    ({"SLURM_JOB_GPUS": "0,1,2"}, 3),
    ({"SLURM_JOB_GPUS": "0-3"}, 4),
    ({"SLURM_JOB_GPUS": ""}, 0),
    ({"SLURM_GPUS_PER_NODE": "1", "SLURM_GPUS_ON_NODE": "2"}, 1),
])
def test_gpus_of_a_one_host_allocation(extra, gpus):
    one = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "g1", "SLURM_TASKS_PER_NODE": "4"}
    assert Allocation.from_environ({**one, **extra}).hosts[0].gpus == gpus


@pytest.mark.parametrize("extra, fragment", [
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc': not a job id"),
    ({"SLURM_JOB_NODELIST": "h[1-2"}, "SLURM_JOB_NODELIST='h[1-2': '[' without ']'"),
    ({"SLURM_TASKS_PER_NODE": "1(x3)"}, "SLURM_TASKS_PER_NODE='1(x3)': 3 counts for 2 hosts"),
    ({"SLURM_TASKS_PER_NODE": "two"}, "SLURM_TASKS_PER_NODE='two': bad count 'two'"),
    ({"SLURM_TASKS_PER_NODE": "0,1"}, "a host with no task"),
    ({"SLURM_JOB_CPUS_PER_NODE": "1"}, "SLURM_JOB_CPUS_PER_NODE='1': 1 counts for 2 hosts"),
    ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS='0': not a positive task count"),
    ({"SLURM_GPUS_PER_NODE": "a100"}, "SLURM_GPUS_PER_NODE='a100': bad GPU count"),
])
def test_malformed_variable_is_named(extra, fragment):
    with pytest.raises(SlurmEnvError) as e:
        Allocation.from_environ(env(**extra))
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg and "unset SLURM_JOB_ID" in msg
    assert isinstance(e.value, ValueError) and isinstance(e.value, UsageError) and e.value.exit_code == 2


def test_job_id_without_nodelist():
    with pytest.raises(SlurmEnvError, match="SLURM_JOB_NODELIST is not"):
        Allocation.from_environ({"SLURM_JOB_ID": "4"})


@pytest.mark.parametrize("var, value, fragment", [
    ("SLURM_GPUS_ON_NODE", "x", "not a GPU count"),
    ("SLURM_JOB_GPUS", "0,a", "bad GPU index 'a'"),
    ("SLURM_JOB_GPUS", "3-1", "bad GPU index '3-1'"),
])
def test_malformed_gpu_variables(var, value, fragment):
    environ = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "g1", var: value}
    with pytest.raises(SlurmEnvError, match=fragment):
        Allocation.from_environ(environ)


@pytest.mark.parametrize("options, lines", [
    (["-N", "3"], ["#SBATCH -N 3"]),
    (["-N3", "--time=10", "-p", "debug"], ["#SBATCH -N3", "#SBATCH --time=10", "#SBATCH -p debug"]),
    (["--job-name=a b"], ["#SBATCH '--job-name=a b'"]),
    (["--output", "%x-%j.out", "--exclusive"], ["#SBATCH --output %x-%j.out", "#SBATCH --exclusive"]),
    (["--gpus-per-node=a100:4"], ["#SBATCH --gpus-per-node=a100:4"]),
    ([], []),
])
def test_directive_lines(options, lines):
    assert directive_lines(options) == lines


@pytest.mark.parametrize("options, fragment", [
    (["--wrap=hostname"], "--wrap cannot be used"),
    (["3", "-N"], "expected an sbatch option before '3'"),
    (["--comment=a\nb"], "line break"),
    (["-h"], "-h cannot be used"),
])
def test_directive_line_errors(options, fragment):
    with pytest.raises(SbatchOptionError, match=fragment):
        directive_lines(options)


def test_build_script_runs_trainrun_with_the_same_python():
    script = build_script(["-N", "3", "--job-name=my job"], ["-np", "6", "train.py", "--msg", "it's $HOME"],
                          "/opt/venv bin/python")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh" and lines[1:3] == ["#SBATCH -N 3", "#SBATCH '--job-name=my job'"]
    assert script.endswith("\n") and lines[-1].startswith("exec ")
    assert shlex.split(lines[-1]) == ["exec", "/opt/venv bin/python", "-m", "trainrun", "-np", "6", "train.py",
                                      "--msg", "it's $HOME"]
    # every #SBATCH line comes before the first command (sbatch stops reading directives there)
    assert max(i for i, x in enumerate(lines) if x.startswith("#SBATCH")) < lines.index(lines[-1])
    with pytest.raises(SbatchOptionError, match="nothing to run"):
        build_script(["-N", "1"], [], "python")


def test_sbatch_argv_and_job_id():
    assert sbatch_argv() == ["sbatch", "--parsable"]
    assert sbatch_argv(wait=True) == ["sbatch", "--parsable", "--wait"]
    assert job_id("35\n") == "35" and job_id("812;trainrun\n") == "812"
    for bad in ("", "sbatch: error: Batch job submission failed\n", "abc;x"):
        with pytest.raises(ValueError, match="no job id"):
            job_id(bad)


def test_importing_trainrun_slurm_stays_light():
    code = ("import sys, trainrun.slurm.allocation, trainrun.slurm.sbatch, trainrun.slurm.nodelist\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'click', 'paramiko', 'numpy', 'yaml', "
            "'psutil', 'torch', 'mpi4py'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
