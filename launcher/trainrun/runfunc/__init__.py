"""Run a Python function on N ranks and get its return values: `trainrun.run` (api.py: the launch and the
caller's side), `horovod.run` (horovod.py: Horovod's signature, through horovodrun's translator),
wire.py (how the call and the outcomes travel), task.py (the rank's side)."""
