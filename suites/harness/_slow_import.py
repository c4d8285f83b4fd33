"""A module that takes a second to import: a forkserver preload that is slow to load."""

import time

time.sleep(1.0)
