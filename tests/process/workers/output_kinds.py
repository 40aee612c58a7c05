"""Output edge cases: a line written in two pieces, binary bytes, stderr, and a last line without newline."""
import sys
import time

out = sys.stdout.buffer
out.write(b"first half ")
out.flush()
time.sleep(0.2)
out.write(b"second half\n")
out.write(b"bin:\x00\xff\xfe\x80 done\n")
out.flush()
sys.stderr.write("to stderr\n")
sys.stderr.flush()
out.write(b"no newline at the end")
out.flush()
