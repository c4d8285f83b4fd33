"""A forkserver preload that installs an import finder whose ``invalidate_caches`` raises: the
zygote cannot apply any request itself, so each child must set itself up (and fails at it,
as it would have on its own)."""

import sys


class FailingFinder:
    """Finds nothing; refreshing its caches fails."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        return None

    @staticmethod
    def invalidate_caches():
        raise RuntimeError("this finder cannot refresh its caches")


sys.meta_path.append(FailingFinder)
