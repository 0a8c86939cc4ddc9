"""``python -m harness.refbox serve --port N ...`` boots the reference runtime."""

import os
import sys

from harness.refbox.server import serve_main

code = serve_main(sys.argv[1:])
# By now the server has written all it keeps (counters file, ring and route trace closed), so
# the interpreter's teardown of numba, numpy and the model is skipped: it took 0.4-0.7 s of
# every stop here (5 ms without it), time a campaign waits before its next boot.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
