"""The MPI world: trainrun as MPICH's PMI-1 process manager (pmi.py: the protocol; world.py: the job's
KVS and start deadline; shm.py: the job's /dev/shm segments; pmienv.py: a rank's PMI socket), and a rank's
start under Open MPI's mpirun (ompi_rank.py; mpirun itself runs as a rank group: supervisor/mpirun.py)."""
