"""`horovod.ray`'s engine: a RayExecutor's ranks are the ranks of one trainrun launch (env contract, MPI world,
fail-fast, teardown), each running a worker loop (worker.py) that takes the executor's commands from a Ray actor
in the caller's cluster (mailbox.py) and leaves its outcomes there; executor.py is the caller's side. The
`horovod.ray` shim module (trainrun/_horovod/horovod/ray/) gives it Horovod 0.28.1's names."""
