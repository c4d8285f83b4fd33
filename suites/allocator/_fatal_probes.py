"""Death-test targets for ``allocator.device.base.fatal``."""

from __future__ import annotations

from allocator.device.base import fatal


def fatal_with_a_lone_surrogate() -> None:
    """A line with a character UTF-8 cannot encode: written with a replacement, then abort."""
    fatal("devmem: fatal: bad byte \udcff")
