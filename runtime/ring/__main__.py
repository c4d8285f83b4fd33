"""``python -m runtime.ring``: the ring's command line (:func:`runtime.ring.main`).

The project's own errors (a bad ``DEVMEM_*`` value, a device out of memory) are one line on
stderr and exit status 1 (:func:`allocator._cli.run_command`)."""

import sys

from allocator._cli import run_command
from runtime.ring import main

sys.exit(run_command(main, "python -m runtime.ring"))
