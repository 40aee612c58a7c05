"""horovod.common.elastic: trainrun.elastic.state (State, ObjectState, run)."""
from .._trainrun import reexport

reexport(__name__, "trainrun.elastic.state")
