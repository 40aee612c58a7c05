"""`python -m trainrun.agent`: what the launcher runs on every remote host (see service.py)."""
import sys

from trainrun.agent.service import Agent

sys.exit(Agent().run())
