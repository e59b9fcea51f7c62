"""Writes one line to stdout and one to stderr, each naming the stream and the worker's RANK."""

import os
import sys

rank = os.environ["RANK"]
print(f"stdout of {rank}", flush=True)
print(f"stderr of {rank}", file=sys.stderr, flush=True)
