"""`trainrun.tensorflow.keras.elastic`: the same as trainrun.tensorflow.elastic (Horovod's
horovod.tensorflow.keras.elastic names: KerasState is TensorFlowKerasState)."""
from trainrun.tensorflow.elastic import *  # noqa: F401,F403
from trainrun.tensorflow.elastic import TensorFlowKerasState as KerasState  # noqa: F401
