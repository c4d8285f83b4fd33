"""``python -m runtime.pipeline``: the pipeline's command line (:func:`runtime.pipeline.main`)."""

import os
import sys

from runtime.pipeline import main

try:
    status = main()
    sys.stdout.flush()
except BrokenPipeError:  # stdout closed early (`| head`): exit quietly, as cat does
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 1
sys.exit(status)
