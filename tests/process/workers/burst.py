"""Write N numbered lines as fast as possible, in small chunks (no flush per line): rank, index, payload."""
import os
import sys

n = int(sys.argv[1])
rank = os.environ["RANK"]
payload = "x" * 97
out = sys.stdout
for i in range(n):
    out.write(f"rank={rank} i={i} {payload} end\n")
out.flush()
