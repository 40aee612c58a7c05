"""The Slurm test cluster (scripts/slurm_testbed.py) and the Slurm behaviour the Slurm engine builds on,
checked against the real daemons on the simulated hosts (Debian slurm-wlm 22.05): one task per host, the
allocation's env, stdin of a step, scancel of a step, --kill-on-bad-exit, srun --mpi=pmi2 with the mpich wheel,
and that `down` leaves no daemon or task behind. Every command starts on h1, the login node."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainrun.slurm.allocation import Allocation

SLURM_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")


@pytest.fixture
def alloc(slurm):
    """alloc(n) -> job id of a fresh n-node allocation without a shell (`salloc --no-shell`); steps run in it
    with env={"SLURM_JOB_ID": id}. Every job is cancelled at teardown."""
    def make(n: int) -> str:
        p = slurm.run(1, ["salloc", "--no-shell", f"-N{n}"], timeout=30)
        m = re.search(r"Granted job allocation (\d+)", p.stderr)
        assert m, p.stderr
        return m.group(1)

    yield make
    assert slurm.cancel_all() == []
    slurm_testbed().reap()


def in_hosts(cluster, *argv: str) -> dict[int, str]:
    """pid -> host name of processes inside the simulated hosts running `argv` (argv[0] matched by its base
    name, so `sleep 303` finds the tasks /usr/bin/sleep 303 and not srun's command line); no argv: all."""
    found = {}
    for h in cluster.hosts:
        for pid in map(int, subprocess.run(["ip", "netns", "pids", h.ns], capture_output=True,
                                           text=True).stdout.split()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            words = [os.path.basename(cmd[0].decode())] + [c.decode() for c in cmd[1:]] if cmd else []
            if not argv or words == list(argv):
                found[pid] = h.name
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_for(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_nodes_have_the_hosts_cpus(slurm):
    assert slurm.nodes() == {"h1": "idle", "h2": "idle", "h3": "idle"}
    conf = slurm.conf.read_text()
    assert re.findall(r"NodeName=h(\d) NodeAddr=10\.241\.0\.\d+ CPUs=(\d+)", conf) == \
        [(str(i), str(os.cpu_count())) for i in (1, 2, 3)]


def test_srun_runs_one_task_on_each_host(slurm):
    p = slurm.run(1, ["srun", "-N3", "hostname"])
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == ["h1", "h2", "h3"]


def test_hosts_see_the_config_without_slurm_conf(cluster, slurm):
    """/etc/slurm in every host is the testbed's config dir: a shell on a host needs no SLURM_CONF."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    p = cluster.run(2, ["sinfo", "-h", "-N", "-o", "%N"], env=env)
    assert p.stdout.split() == ["h1", "h2", "h3"], p.stderr


def test_salloc_env_describes_the_allocation(slurm, tmp_path):
    p = slurm.run(1, ["salloc", "-N2", "env"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    env = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    assert env["SLURM_JOB_NODELIST"] == "h[1-2]"
    assert env["SLURM_TASKS_PER_NODE"] == "1(x2)" and env["SLURM_JOB_NUM_NODES"] == "2"
    assert env["SLURM_SUBMIT_DIR"] == str(tmp_path)
    a = Allocation.from_environ(env)
    assert a.job_id == env["SLURM_JOB_ID"] and [(h.name, h.slots) for h in a.hosts] == [("h1", 1), ("h2", 1)]


def test_salloc_with_tasks_per_node(slurm):
    p = slurm.run(1, ["salloc", "-N3", "--ntasks-per-node=2", "env"])
    env = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    assert env["SLURM_TASKS_PER_NODE"] == "2(x3)" and env["SLURM_NTASKS"] == "6", p.stderr
    assert Allocation.from_environ(env).slots == 6


def test_overlap_step_one_task_per_host_inside_salloc(slurm):
    p = slurm.run(1, ["salloc", "-N3", "srun", "--overlap", "--nodes=3", "--ntasks-per-node=1",
                      "--kill-on-bad-exit", "sh", "-c", "echo $(hostname) $SLURM_PROCID $SLURM_NODEID"])
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["h1 0 0", "h2 1 1", "h3 2 2"]


@pytest.mark.parametrize("input_opt, readers", [([], {"h1", "h2", "h3"}), (["--input=all"], {"h1", "h2", "h3"}),
                                                (["--input=0"], {"h1"})])
def test_step_stdin_goes_to_every_task_unless_told(slurm, alloc, input_opt, readers):
    """srun's default is --input=all (22.05): one step's stdin is a broadcast, not a channel per task."""
    job = alloc(3)
    p = slurm.run(1, ["srun", "--overlap", "-N3", "--ntasks-per-node=1", *input_opt, "sh", "-c",
                      'echo "$(hostname) $(cat | tr -d "\\n")"'], input="ping\n", env={"SLURM_JOB_ID": job})
    assert p.returncode == 0, p.stderr
    got = dict(line.split(" ", 1) if " " in line else (line, "") for line in p.stdout.splitlines())
    assert {h for h, text in got.items() if text == "ping"} == readers and len(got) == 3


def test_unbuffered_step_output_interleaves_tasks(slurm, alloc, tmp_path):
    """-u passes bytes on as they come; the tasks' bytes mix in srun's stdout, so one step's stdout cannot
    carry several agents' binary frames (one step per host can)."""
    job = alloc(3)
    writer = tmp_path / "w.py"
    writer.write_text(  # all three tasks start writing together: a late start cannot serialise them
        "import os, time\nme = os.environ['SLURM_PROCID']\nopen(f'ready.{me}', 'w').close()\n"
        "deadline = time.monotonic() + 30\n"
        "while not all(os.path.exists(f'ready.{i}') for i in range(3)) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "for _ in range(20):\n    os.write(1, str(int(me) + 1).encode() * 65536)\n")
    p = slurm.run(1, ["srun", "--overlap", "-N3", "--ntasks-per-node=1", "-u", "python3", writer],
                  env={"SLURM_JOB_ID": job}, text=False, cwd=tmp_path)
    assert p.returncode == 0 and len(p.stdout) == 3 * 20 * 65536
    runs = 1 + sum(1 for a, b in zip(p.stdout, p.stdout[1:]) if a != b)
    assert runs > 3   # not one block per task


def test_scancel_of_a_step_kills_its_tasks_and_keeps_the_allocation(slurm, alloc, cluster):
    job = alloc(3)
    srun = slurm.popen(1, ["srun", "--overlap", "-N3", "--ntasks-per-node=1", "sleep", "303"],
                       env={"SLURM_JOB_ID": job}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(in_hosts(cluster, "sleep", "303")) == 3)
        slurm.run(1, ["scancel", f"{job}.0"])
        assert srun.wait(timeout=10) == 128 + signal.SIGKILL   # tasks are SIGKILLed, srun says so
        assert wait_for(lambda: not in_hosts(cluster, "sleep", "303"), 5)
        p = slurm.run(1, ["srun", "--overlap", "-N3", "hostname"], env={"SLURM_JOB_ID": job})
        assert sorted(p.stdout.split()) == ["h1", "h2", "h3"], p.stderr
    finally:
        if srun.poll() is None:
            srun.kill()
        srun.communicate()


def test_kill_on_bad_exit_ends_the_other_tasks(slurm, alloc, tmp_path):
    """A task exiting non-zero ends the step: the others get SIGTERM; srun's code is the highest task code
    (143 here, not the failing task's 3), so srun's exit code does not name the failure."""
    job = alloc(3)
    # task 1 fails once the others have their TERM handler in place (ready.N files in the shared cwd)
    script = ('if [ "$SLURM_PROCID" = 1 ]; then for _ in $(seq 300); do [ -e ready.0 ] && [ -e ready.2 ] && break;'
              ' sleep 0.1; done; exit 3; fi; '
              'trap "echo $(hostname) TERM; exit 143" TERM; touch ready.$SLURM_PROCID; sleep 300 & wait')
    p = slurm.run(1, ["srun", "--overlap", "-N3", "--ntasks-per-node=1", "--kill-on-bad-exit", "bash", "-c", script],
                  env={"SLURM_JOB_ID": job}, timeout=60, cwd=tmp_path)
    assert sorted(p.stdout.split("\n")[:-1]) == ["h1 TERM", "h3 TERM"], p.stderr
    assert "h2: task 1: Exited with exit code 3" in p.stderr and p.returncode == 143


def test_sigkill_of_srun_and_its_helper_leaves_tasks_until_scancel(slurm, alloc, cluster):
    """Why teardown must scancel the step: srun forks a helper; SIGKILL to both leaves the tasks running."""
    job = alloc(3)
    srun = slurm.popen(1, ["srun", "--overlap", "-N3", "--ntasks-per-node=1", "sleep", "304"],
                       env={"SLURM_JOB_ID": job}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       start_new_session=True)
    try:
        assert wait_for(lambda: len(in_hosts(cluster, "sleep", "304")) == 3)
        os.killpg(srun.pid, signal.SIGKILL)   # nsenter, srun and srun's helper: one process group
        srun.wait()
        time.sleep(1)
        assert len(in_hosts(cluster, "sleep", "304")) == 3
        slurm.run(1, ["scancel", f"{job}.0"])
        assert wait_for(lambda: not in_hosts(cluster, "sleep", "304"), 5)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()


def test_srun_mpi_pmi2_gives_the_mpich_wheel_one_world(slurm, alloc, tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py not installed (bash scripts/setup.sh)")
    job = alloc(3)
    prog = tmp_path / "world.py"
    prog.write_text("import socket\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
                    "print(socket.gethostname(), c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank()))\n")
    # UCX_NET_DEVICES: each simulated host has its own IPC namespace, so UCX connects them over TCP, and with
    # every NIC allowed it tries the docker0 decoy (one address on every host) and fails, as on real hosts
    p = slurm.run(1, ["srun", "--overlap", "-N3", "--ntasks-per-node=1", "--mpi=pmi2", sys.executable, prog],
                  env={"SLURM_JOB_ID": job, "UCX_NET_DEVICES": "eth1"}, timeout=60)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["h1 0 3 3", "h2 1 3 3", "h3 2 3 3"]
    plugins = slurm.run(1, ["srun", "--mpi=list"]).stdout + slurm.run(1, ["srun", "--mpi=list"]).stderr
    assert "pmi2" in plugins


def test_down_leaves_nothing_then_up_again(slurm, cluster, alloc):
    """`down` with a step running: every daemon (by its pid file), slurmstepd and task is gone; `up` again
    gives idle nodes (the session's fixture goes on with the new daemons)."""
    job = alloc(3)
    srun = slurm.popen(1, ["srun", "--overlap", "-N3", "--ntasks-per-node=1", "sleep", "305"],
                       env={"SLURM_JOB_ID": job}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemons = slurm.daemons()
    try:
        assert wait_for(lambda: len(in_hosts(cluster, "sleep", "305")) == 3)
        assert sorted(daemons) == ["munged", "slurmctld", "slurmd-h1", "slurmd-h2", "slurmd-h3"]
        assert slurm_testbed().down(cluster.state_dir) == []
        assert not in_hosts(cluster, "sleep", "305")
        assert not [pid for pid in daemons.values() if slurm_testbed().testbed._alive(pid)]   # zombies: gone
        assert not [pid for pid in in_hosts(cluster) if comm(pid) in SLURM_DAEMONS]
        assert srun.wait(timeout=10) != 0
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
        again = slurm_testbed().up(cluster)
    assert again.nodes() == {"h1": "idle", "h2": "idle", "h3": "idle"}


def slurm_testbed():
    return sys.modules["trainrun_slurm_testbed"]
