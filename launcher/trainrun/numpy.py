"""`import trainrun.numpy as hvd`: the framework-free API on NumPy arrays (the same as trainrun.runtime)."""
from trainrun.runtime import *  # noqa: F401,F403
from trainrun.runtime import __all__  # noqa: F401
