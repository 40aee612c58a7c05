"""What trainrun.keras (Keras 3, torch or TensorFlow backend) and trainrun.tensorflow.keras (tf.keras:
Keras 3 or tf-keras) share, as horovod/_keras does for Horovod: the DistributedOptimizer factory
(optimizer.py), the callbacks' behaviour (callbacks.py), and per-backend collectives on Keras values
(torch_ops.py, tf_ops.py). Importing this package imports no framework.
"""
