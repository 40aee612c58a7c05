"""What trainrun.keras (Keras 3, torch or TensorFlow backend) and trainrun.tensorflow.keras (tf.keras:
Keras 3 or tf-keras) share, as horovod/_keras does for Horovod: the DistributedOptimizer factory
(optimizer.py), the callbacks' behaviour (callbacks.py), and per-backend collectives on Keras values
(collectives.py: Horovod's Keras collectives, one set for every backend). Importing this package imports no framework.
"""
