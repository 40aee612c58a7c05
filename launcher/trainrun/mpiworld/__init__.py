"""The MPI world: trainrun as MPICH's PMI-1 process manager (pmi.py: the protocol; world.py: the job's
KVS and start deadline; shm.py: the job's /dev/shm segments), and the Open MPI path (openmpi.py: mpirun
as one rank group)."""
