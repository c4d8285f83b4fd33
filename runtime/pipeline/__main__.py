"""``python -m runtime.pipeline``: the pipeline's command line (:func:`runtime.pipeline.main`).

The project's own errors are one line on stderr and exit status 1, and a closed stdout
(``| head``) ends it quietly (:func:`allocator._cli.run_command`)."""

import sys

from allocator._cli import run_command
from runtime.pipeline import main

sys.exit(run_command(main, "python -m runtime.pipeline"))
