"""`python tests/elastic/pipe_trainrun.py ARGS`: trainrun whose remote hosts are local subprocesses
(fanout/pipe_engine.py): the elastic loop, agents outliving attempts and the control channels, without SSH
or the testbed. Host names other than this machine's (e.g. far1, far2) each get their own agent."""
import sys

from trainrun.fanout import select
from trainrun.fanout.pipe_engine import PipeEngine

select.engine_for = lambda reach, source=None: PipeEngine()

from trainrun.cli.command import main  # noqa: I001 (after the engine is replaced)

main(sys.argv[1:])
