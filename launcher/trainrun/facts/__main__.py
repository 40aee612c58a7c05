"""`python -m trainrun.facts [serve HOST NONCE]`: what `--check` runs on every host (see collect.py)."""
import sys

from trainrun.facts.collect import main

sys.exit(main(sys.argv[1:]))
