"""The command line: the only place raw argv and YAML are seen (command.py: the click command and
`main`, which turns every TrainrunError into one line and its exit code; config.py: LaunchConfig, the
typed and validated value every later layer receives)."""
from trainrun.cli.command import main

__all__ = ["main"]
