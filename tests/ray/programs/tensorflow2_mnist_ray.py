"""Horovod 0.28.1's examples/ray/tensorflow2_mnist_ray.py in shape, run unchanged: a tf.keras MNIST-shaped
CNN fit with horovod.tensorflow.keras's DistributedOptimizer and callbacks, driven through RayExecutor
(create_settings, start, run(train, kwargs=...), shutdown). Synthetic 28x28 images instead of the download, a
tiny model and a few steps; train() returns what the test checks (the weights must agree on every rank).
(Keras 3's compile() has no experimental_run_tf_function, which Horovod's example passes.)"""
import argparse
import json

import tensorflow as tf

import horovod.tensorflow.keras as hvd
import ray
from horovod.ray import RayExecutor

parser = argparse.ArgumentParser(description='Tensorflow Ray example',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--address', type=str, help="Ray cluster address")
parser.add_argument('--num-workers', type=int, default=2)


def train(num_epochs):
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    # MNIST's shapes, made up on each rank (a different shard per rank)
    tf.random.set_seed(1234 + hvd.rank())
    images = tf.random.uniform([256, 28, 28], maxval=255, dtype=tf.float32)
    labels = tf.random.uniform([256], maxval=10, dtype=tf.int64)
    dataset = tf.data.Dataset.from_tensor_slices((tf.cast(images[..., tf.newaxis] / 255.0, tf.float32), labels))
    dataset = dataset.repeat().shuffle(256).batch(32)

    tf.random.set_seed(hvd.rank())  # different initial weights: the broadcast callback must make them one
    mnist_model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(4, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(4, 4)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation='relu'),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(opt)

    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=['accuracy'])

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: warm the learning rate up over the first epochs.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=0),
    ]

    # Horovod: write logs on worker 0.
    verbose = 2 if hvd.rank() == 0 else 0

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    history = mnist_model.fit(dataset, steps_per_epoch=8 // hvd.size(), callbacks=callbacks, epochs=num_epochs,
                              verbose=verbose)
    checksum = float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in mnist_model.trainable_variables))
    return {"rank": hvd.rank(), "size": hvd.size(), "loss": history.history["loss"], "checksum": checksum}


if __name__ == '__main__':
    args = parser.parse_args()
    ray.init(address=args.address)
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=args.num_workers, use_gpu=False, cpus_per_worker=1)
    executor.start()
    results = executor.run(train, kwargs=dict(num_epochs=2))
    executor.shutdown()
    print("RESULTS", json.dumps(results))
