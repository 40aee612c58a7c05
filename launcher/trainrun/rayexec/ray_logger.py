"""`horovod.ray.ray_logger` (the shim module re-exports this one): `log(info_dict)` in rank code hands the
record to the callbacks of the caller's RayExecutor.run(..., callbacks=[...]) (through the executor's mailbox
actor). Outside a RayExecutor's rank it warns once, as Horovod's does when logging is not configured."""
from __future__ import annotations

import warnings

__all__ = ["configure", "log"]
warning_raised = False


def configure(queue=None) -> None:
    """Horovod's hook for its queue actor: nothing to configure here (the rank finds its mailbox itself)."""


def log(info_dict) -> None:
    """Send `info_dict` (picklable) to the caller's callbacks."""
    global warning_raised
    from trainrun.rayexec.worker import _Logger

    if not _Logger.send(info_dict) and not warning_raised:
        warnings.warn("`ray_logger.log` called but logging is not configured.", stacklevel=2)
        warning_raised = True
