"""horovod.common.exceptions: the errors Horovod code catches, as trainrun raises them."""
from trainrun.elastic.state import HostsUpdatedInterrupt
from trainrun.runtime.exceptions import HorovodInternalError, StallError, TensorMismatchError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "HorovodVersionMismatchError", "StallError",
           "TensorMismatchError", "get_version_mismatch_message"]


def get_version_mismatch_message(name, version, installed_version):
    return (f"Framework {name} installed with version {installed_version} but found version {version}. "
            "With trainrun there is no build to redo: the framework is used as installed.")


class HorovodVersionMismatchError(ImportError):
    """Horovod raises it when a framework changed since Horovod was built; trainrun never does (nothing is built)."""

    def __init__(self, name, version, installed_version):
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name, self.version, self.installed_version = name, version, installed_version
