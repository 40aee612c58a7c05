"""Create the file named by argv[1] (a dry run must never get here)."""
import sys

open(sys.argv[1], "w").close()
