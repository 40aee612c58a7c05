"""trainrun: a launcher and Horovod-compatible allreduce runtime for distributed training.

Importing this package must stay cheap: the launcher's start-up path imports nothing heavy
(no paramiko, mpi4py, numpy or torch); docs/architecture.md has the map and the import rule.
"""

__version__ = "0.1.0"
