"""horovod.common.process_sets: trainrun's process sets."""
from trainrun.runtime.process_sets import ProcessSet, global_process_set
from trainrun.runtime.lifecycle import add_process_set, remove_process_set

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
