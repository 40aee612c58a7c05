"""trainrun.tensorflow.failures: trainrun's errors as the TensorFlow error types Horovod raises (pure mapping;
the ranks' behaviour is tests/tensorflow/test_horovod_tf.py). Run in a fresh interpreter: under pytest,
tests/ is on sys.path and its `tensorflow` package would shadow TensorFlow."""
import importlib.util
import subprocess
import sys

import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed: pip install 'trainrun[tensorflow]'", allow_module_level=True)

CODE = '''
import tensorflow as tf
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError
from trainrun.tensorflow import failures

def throw(e):
    raise e

for raised, tf_type, own, code in ((StallError("rank 1 did not submit 'x'"), tf.errors.FailedPreconditionError,
                                    StallError, 9),
                                   (TensorMismatchError("Mismatched shape"), tf.errors.FailedPreconditionError,
                                    HorovodInternalError, 9),
                                   (ValueError("bad splits"), tf.errors.InvalidArgumentError, ValueError, 3)):
    err = failures.as_tf_error(raised)
    assert isinstance(err, tf_type) and isinstance(err, own) and str(raised) == err.message, err
    assert failures.code_of(raised) == (code, str(raised).encode())
    try:
        failures.raising(throw)(raised)
    except tf_type as e:
        assert isinstance(e, own) and e.message == str(raised)
    else:
        raise AssertionError("raising() did not raise")
print("ok")
'''


def test_stall_and_mismatch_errors_become_horovods_tf_types():
    """A StallError (a tensor some rank never submitted; the launcher may also end such a job: README
    "stall") or a TensorMismatchError reaching a TF op becomes tf.errors.FailedPreconditionError, a
    ValueError InvalidArgumentError, keeping the message and trainrun's own type; the graph path's
    (code, message) pair carries the same."""
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, cwd="/",
                          env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
