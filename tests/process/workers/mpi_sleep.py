"""A rank that joins the MPI world and sleeps: for the tests of what a job leaves on a host.

    mpi_sleep.py SECONDS [TOKEN] [kill RANK]

Initializes trainrun's runtime (the MPI world: MPICH's /dev/shm segment on its host; the diag hook: its
faulthandler stack file), runs one allreduce, prints `up JOB_ID STACK_FILE` (the file the hook registered,
found among this process's open files; `-` if none), then sleeps SECONDS. TOKEN only marks the command line
(tests find the job's processes by it). With `kill RANK`, that rank SIGKILLs itself after saying `up`.
"""
import os
import signal
import sys
import time

import numpy as np

import trainrun.numpy as hvd


def stack_file() -> str:
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "trainrun-stacks-" in os.path.basename(target):
            return target
    return "-"


hvd.init()
hvd.allreduce(np.ones(1), name="up")
print("up", os.environ["TRAINRUN_JOB_ID"], stack_file(), flush=True)
if sys.argv[3:5] == ["kill", str(hvd.rank())]:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(float(sys.argv[1]))
