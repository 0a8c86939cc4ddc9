"""``python -m harness.refbox serve --port N ...`` boots the reference runtime."""

import sys

from harness.refbox.server import serve_main

sys.exit(serve_main(sys.argv[1:]))
