"""In-flight diagnosis, the launcher's and agents' side: stacks of every rank (stacks.py, taken on each host;
stack_report.py, grouped on the launcher). The ranks' side, the hook a rank's runtime installs so that its stack can
be taken without ptrace and it can report progress and stalls, is trainrun/runtime/rankhook.py; the perf line
it sends is trainrun/wire/perf_line.py."""
