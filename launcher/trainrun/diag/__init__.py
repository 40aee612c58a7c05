"""In-flight diagnosis: stacks of every rank (stacks.py, taken on each host; report.py, grouped on the
launcher) and the hook a rank's runtime installs so that its stack can be taken without ptrace and it
can ask for a dump itself (rankhook.py)."""
