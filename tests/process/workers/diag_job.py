"""A rank for the diagnosis tests (stacks, first cause, orphans). Modes (after `DIR`):

  hang            every rank does one allreduce, prints "ready", then rank 1 sleeps in slow_step() while
                  the others wait in the next allreduce (a hung job)
  kill R          rank R SIGKILLs itself after the first allreduce (a child of it holds its output open,
                  so its exit is reported 0.5 s late); the others notice (they watch its pid, as a
                  peer's socket would be reset) and exit 1 with "connection reset by rank R" 0.2 s later
                  (more than the error of the hosts' clock offsets, less than the late report), ignoring
                  the SIGTERM of the teardown the first of them starts
  raise R         rank R raises RuntimeError after the first allreduce and lingers 0.5 s after trainrun
                  has stopped it (an atexit handler registered before trainrun's import runs after
                  trainrun's); the others, failed by the runtime with "trainrun: rank R stopped: ...",
                  print it and exit at once: they end before rank R does
  setsid [R]      every rank starts a grandchild in its own session (it leaves the rank's process group)
                  that sleeps forever, records its pid, prints "ready" and sleeps; rank R (if given)
                  exits 3 once every rank has recorded its grandchild

Writes DIR/pid.RANK (JSON: pid, grandchild) like workers/job.py.
"""
import json
import os
import signal
import subprocess
import sys
import time
import traceback

directory, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])


def record(grandchild=None):
    tmp = os.path.join(directory, f".tmp.{rank}")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "grandchild": grandchild}, f)
    os.rename(tmp, os.path.join(directory, f"pid.{rank}"))


def slow_step():
    time.sleep(600)  # rank 1 hangs here (the tests look for this line)


def hang():
    import numpy as np

    import trainrun.numpy as hvd

    hvd.init()
    hvd.allreduce(np.ones(4), name="warm-up")
    record()
    print("ready", flush=True)
    if hvd.rank() == 1:
        slow_step()
    hvd.allreduce(np.ones(4), name="step")  # the others wait here


def alive(pid):
    """True while `pid` runs: not a zombie, not yet reaped (it can vanish between any two reads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def kill(victim):
    import numpy as np

    import trainrun.numpy as hvd

    hvd.init()
    hvd.allreduce(np.ones(4), name="warm-up")
    record()
    if rank == victim:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # holds our stdout/stderr
        while len([n for n in os.listdir(directory) if n.startswith("pid.")]) < hvd.size():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    # the first of us to exit starts the launcher's teardown (SIGTERM, then SIGKILL after the grace): the
    # rest must still end on their own, with their line, however late this loaded machine runs them
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path = os.path.join(directory, f"pid.{victim}")
    while not os.path.exists(path):
        time.sleep(0.01)
    with open(path) as f:
        pid = json.load(f)["pid"]
    while alive(pid):
        time.sleep(0.005)
    time.sleep(0.2)
    print(f"rank {rank}: connection reset by rank {victim}", file=sys.stderr, flush=True)
    os._exit(1)  # not sys.exit: the runtime's collective shutdown would wait for the dead rank


def raise_on(culprit):
    import atexit
    if rank == culprit:  # registered before trainrun is imported, so it runs after trainrun's handler (LIFO)
        atexit.register(time.sleep, 0.5)

    import numpy as np

    import trainrun.numpy as hvd

    hvd.init()
    hvd.allreduce(np.ones(4), name="warm-up")
    if rank == culprit:
        raise RuntimeError(f"bad batch on rank {rank}")
    try:
        for step in range(1000):
            hvd.allreduce(np.ones(4), name=f"step.{step}")
    except hvd.HorovodInternalError:  # exit at once (no collective exit), so these ranks end before rank R
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def setsid(failing):
    gc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(60)"],
                          start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record(gc.pid)
    print("ready", flush=True)
    if rank == failing:
        while len([n for n in os.listdir(directory) if n.startswith("pid.")]) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.02)
        sys.exit(3)
    while True:
        time.sleep(60)


if mode == "hang":
    hang()
elif mode == "kill":
    kill(int(sys.argv[3]))
elif mode == "raise":
    raise_on(int(sys.argv[3]))
elif mode == "setsid":
    setsid(int(sys.argv[3]) if len(sys.argv) > 3 else None)
