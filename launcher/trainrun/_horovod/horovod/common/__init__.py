"""horovod.common: trainrun's equivalents of Horovod's shared modules (exceptions, util, process_sets, elastic)."""
