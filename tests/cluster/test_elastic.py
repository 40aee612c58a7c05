"""Elastic training on 3 simulated hosts (issue 14's acceptance): a host dies (ranks SIGKILLed, or its
network cut), the job goes on from its last commit on the hosts left, grows back when the host returns,
and ends with identical weights and the asked-for steps. Nothing is left running, no /dev/shm segment (the
launcher's machine's and each host's own: committed state and MPICH's)."""
import subprocess
import uuid

import psutil

from tests.elastic.harness import WORKER, LiveRun, by_rank, discovery, leftover_segments, procs_with, steps_seen, wait_gone

STEPS, EVERY = 45, 5


def agent_python(tmp_path) -> str:
    """--python for the remote hosts: this worktree's trainrun for the agent (the venv's points at main)."""
    from tests.elastic.harness import REPO

    wrapper = tmp_path / "py.sh"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={REPO / 'launcher'} exec {__import__('sys').executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def start(cluster, tmp_path, token, *extra, steps=STEPS):
    script, listing = discovery(tmp_path, ["h1:2", "h2:2", "h3:2"])
    args = ["--ssh-config", str(cluster.ssh_config), "--python", agent_python(tmp_path),
            "--host-discovery-script", str(script), "--min-np", "4", "--max-np", "6",
            "--blacklist-cooldown-range", "3", "6", "-x", f"STEPS={steps}", "-x", f"COMMIT_EVERY={EVERY}",
            "-x", "STEP_PAUSE=0.15", "-x", "TRAINRUN_STALL_TIMEOUT=30", "-v", *extra, WORKER, token]
    return LiveRun(args, cwd=tmp_path), listing


def host_pids(cluster, i: int, token: str) -> list[int]:
    inside = set(map(int, subprocess.run(["ip", "netns", "pids", cluster.host(i).ns], capture_output=True,
                                         text=True).stdout.split()))
    return [p.pid for p in procs_with(token) if p.pid in inside and _is_rank(p)]


def _is_rank(p) -> bool:
    """A rank (not the agent, nor a spare waiting to become one: --warm-ranks) by its environment."""
    try:
        return "TRAINRUN_RANK" in p.environ()
    except psutil.Error:
        return False


def check_end(run: LiveRun, token: str, cluster) -> None:
    code = run.finish()
    assert code == 0, run.stderr[-4000:]
    steps = steps_seen(run.lines)
    sizes = [n for _, n, _ in steps]
    assert 6 in sizes and 4 in sizes and sizes[-1] == 6, sizes
    # after the failure the step counter goes on from the last commit (a multiple of EVERY), not from 0
    first4 = next(i for i, (_, n, _) in enumerate(steps) if n == 4)
    assert steps[first4][0] % EVERY == 1 and steps[first4][0] > 1, steps[first4 - 3:first4 + 2]
    assert steps[first4][0] - 1 <= steps[first4 - 1][0]
    finals = {r: [t for t in texts if t.startswith("final")] for r, texts in by_rank(run.lines).items()}
    finals = {r: f[0] for r, f in finals.items() if f}
    assert sorted(finals) == list(range(6)), finals
    assert len(set(finals.values())) == 1, finals  # same step, identical weights, same commit count
    assert next(iter(finals.values())).startswith(f"final step {STEPS} ")
    assert "reset size 4 lr 0.04" in run.lines[-1] or any("reset size 4 lr 0.04" in line for line in run.lines)
    assert any("reset size 6 lr 0.06" in line for line in run.lines)
    assert wait_gone(token) == []
    assert leftover_segments(run.stderr) == []
    assert hosts_segments(cluster, run.stderr) == {}


def hosts_segments(cluster, stderr: str, seconds: float = 15.0) -> dict[int, list[str]]:
    """The job's /dev/shm files left inside each simulated host (each has a /dev/shm of its own): committed-state
    segments (trainrun_state_<pid>_<job id>_<n>) and MPICH's, waiting up to `seconds` for the agents' cleanup."""
    import re
    import time

    from trainrun.mpiworld.shm import kvsname_for, shm_segment_pattern

    jobs = set(re.findall(r"attempt \d+: job ([0-9a-f]+)", stderr))
    patterns = [re.compile(r"trainrun_state_\d+_%s_\d+" % j) for j in jobs]
    patterns += [shm_segment_pattern(kvsname_for(j)) for j in jobs]
    deadline = time.monotonic() + seconds
    while True:
        left = {}
        for i in (1, 2, 3):
            names = subprocess.run([*cluster.enter(i), "ls", "/dev/shm"], capture_output=True, text=True).stdout.split()
            mine = [n for n in names if any(p.fullmatch(n) for p in patterns)]
            if mine:
                left[i] = mine
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_killed_host_job_goes_on_and_grows_back(cluster, tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run, listing = start(cluster, tmp_path, token)
    run.wait_for("step 12 size 6")
    during = hosts_segments(cluster, run.stderr, 0)  # every host's local rank 0 has committed into its own segment
    assert sorted(during) == [1, 2, 3] and all(any(n.startswith("trainrun_state_") for n in v) for v in during.values()), during
    listing.write_text("h1:2\nh2:2\n")  # the host leaves the discovery list ...
    pids = host_pids(cluster, 3, token)
    assert len(pids) == 2, pids
    for pid in pids:  # ... and its ranks die
        __import__("os").kill(pid, 9)
    run.wait_for("size 4")
    listing.write_text("h1:2\nh2:2\nh3:2\n")  # it is back; after its cool-down the job grows onto it
    run.wait_for("size 6 restart 2", timeout=150)
    check_end(run, token, cluster)
    assert "h3 sits out 3s" in run.stderr and "hosts changed (h1, h2 -> h1, h2, h3)" in run.stderr


def test_cut_off_host_job_goes_on_and_grows_back(cluster, tmp_path):
    token = f"tok{uuid.uuid4().hex[:8]}"
    run, listing = start(cluster, tmp_path, token, "--heartbeat-timeout", "3")
    links = [f"{cluster.host(3).name}-m", f"{cluster.host(3).name}-d"]
    run.wait_for("step 12 size 6")
    try:
        for link in links:  # h3's management and data networks go dark; nothing dies
            subprocess.run(["ip", "-n", "trt-sw", "link", "set", link, "down"], check=True)
        run.wait_for("size 4")
    finally:
        for link in links:
            subprocess.run(["ip", "-n", "trt-sw", "link", "set", link, "up"], check=True)
    run.wait_for("size 6 restart 2", timeout=150)
    check_end(run, token, cluster)
    # the heartbeat (3 s) or, as often first, the kernel ending the SSH connection (2 s without an answer)
    assert "no word from the agent on h3" in run.stderr or "lost the agent on h3 (the SSH connection" in run.stderr
