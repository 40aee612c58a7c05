"""A parameter-server cluster whose chief fails: workers and ps serve (real TensorFlow servers), the chief
waits until they listen and exits with code 5."""
import json
import os
import socket
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

cfg = json.loads(os.environ["TF_CONFIG"])
role, index = cfg["task"]["type"], cfg["task"]["index"]
if role != "chief":
    server = tf.distribute.Server(tf.train.ClusterSpec(cfg["cluster"]), job_name=role, task_index=index)
    server.join()
for address in cfg["cluster"]["ps"] + cfg["cluster"]["worker"]:
    host, port = address.rsplit(":", 1)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError:
            time.sleep(0.2)
print("chief: every server listens; failing", flush=True)
sys.exit(5)
