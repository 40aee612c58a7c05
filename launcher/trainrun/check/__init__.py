"""`trainrun --check`: collect every host's facts and the NIC probe (pipeline.py), judge and render the
report (report.py)."""
