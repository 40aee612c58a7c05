"""The `horovod` shim's directory: ./horovod/ is the package a rank imports as `horovod` (`import horovod.torch
as hvd` gives trainrun.torch) when this directory is first on its PYTHONPATH. The rule that puts it there, and
TRAINRUN_HOROVOD's choice, are in plan/horovod_shim.py."""
