"""``python -m runtime.ring``: the ring's command line (:func:`runtime.ring.main`)."""

import sys

from runtime.ring import main

sys.exit(main())
