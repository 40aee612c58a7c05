"""Horovod's Keras callbacks (horovod.keras.callbacks) for Keras 3 on its torch or tensorflow backend."""
import keras

from trainrun.keras_common.callbacks import make
from trainrun.keras.ops import binding

_classes = make(keras, binding)
BroadcastGlobalVariablesCallback = _classes.BroadcastGlobalVariablesCallback
MetricAverageCallback = _classes.MetricAverageCallback
LearningRateWarmupCallback = _classes.LearningRateWarmupCallback
LearningRateScheduleCallback = _classes.LearningRateScheduleCallback

__all__ = ["BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback", "MetricAverageCallback"]
