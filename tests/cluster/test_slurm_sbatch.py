"""trainrun.slurm against the real Slurm of the test cluster: host lists expanded as scontrol expands them, and
a batch script from sbatch.build_script submitted through real `sbatch --parsable [--wait]`."""
from __future__ import annotations

import sys

import pytest
from tests.unit.test_slurm_env import NODELISTS

from trainrun.slurm.nodelist import expand_nodelist
from trainrun.slurm.sbatch import build_script, job_id, sbatch_argv

SUFFIX_FORMS = {"n[1-2]-ib", "gpu-a100-[1-2].cluster.example"}   # 22.05: no text after a lone bracket group


@pytest.mark.parametrize("text", [t for t, _ in NODELISTS if t not in SUFFIX_FORMS])
def test_nodelist_expands_as_scontrol_does(slurm, text):
    p = slurm.run(1, ["scontrol", "show", "hostnames", text])
    assert p.returncode == 0, p.stderr
    assert expand_nodelist(text) == p.stdout.split()


@pytest.fixture
def jobs_cancelled(slurm):
    yield
    assert slurm.cancel_all() == []


def test_sbatch_script_runs_trainrun_in_the_allocation(slurm, tmp_path, jobs_cancelled):
    """The script runs `python -m trainrun` on the batch host with the submitter's python and environment;
    --parsable prints the job id first, --wait returns the job's exit code; the output file holds the
    rank-prefixed lines."""
    # rank 1 fails with 3, but only once rank 0 has printed (fail-fast would stop rank 0 otherwise)
    prog = ("import os, socket, sys, time; rank = os.environ['RANK']\n"
            "print(socket.gethostname(), rank, os.environ['SLURM_JOB_ID'], flush=True)\n"
            "if rank == '0': open('rank0.done', 'w').close()\n"
            "deadline = time.monotonic() + 60\n"
            "while rank == '1' and not os.path.exists('rank0.done') and time.monotonic() < deadline: time.sleep(0.05)\n"
            "sys.exit(3 if rank == '1' else 0)\n")
    script = build_script(["-N", "2", "--job-name=trainrun sbatch test", "--output=%x-%j.out"],
                          ["-np", "2", sys.executable, "-c", prog], sys.executable)
    p = slurm.run(1, sbatch_argv(wait=True), input=script, cwd=tmp_path, timeout=120)
    jid = job_id(p.stdout)
    assert p.returncode == 3, p.stderr   # the job's code: trainrun's, the failing rank's
    out = (tmp_path / f"trainrun sbatch test-{jid}.out").read_text()
    assert f"[0]<stdout>:h1 0 {jid}" in out.splitlines()
    assert f"[1]<stdout>:h2 1 {jid}" in out.splitlines()   # hosts and slots from the allocation: 1 task per node


def test_sbatch_without_wait_prints_the_job_id_at_once(slurm, tmp_path, jobs_cancelled):
    script = build_script(["-N", "1"], ["-np", "1", "sleep", "30"], sys.executable)
    p = slurm.run(1, sbatch_argv(), input=script, cwd=tmp_path, timeout=30)
    assert p.returncode == 0, p.stderr
    assert job_id(p.stdout) in slurm.jobs()
