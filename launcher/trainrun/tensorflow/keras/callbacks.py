"""Horovod's tf.keras callbacks (horovod.tensorflow.keras.callbacks), on tf.keras's own Callback class
(Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1)."""
import tensorflow as tf

from trainrun.keras_common.collectives import for_backend
from trainrun.keras_common.callbacks import make

keras = tf.keras
_classes = make(keras, for_backend("tensorflow"))
BroadcastGlobalVariablesCallback = _classes.BroadcastGlobalVariablesCallback
MetricAverageCallback = _classes.MetricAverageCallback
LearningRateWarmupCallback = _classes.LearningRateWarmupCallback
LearningRateScheduleCallback = _classes.LearningRateScheduleCallback

__all__ = ["BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback", "MetricAverageCallback"]
