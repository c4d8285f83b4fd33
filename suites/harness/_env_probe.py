"""Reads the environment at import time; only ever imported in death-test children.

The self-tests name it as a "module:qualname" str and check that the parent never imported
it, so even a forked child imports it after the harness applied the env.
"""

from __future__ import annotations

import os

AT_IMPORT = {name: os.environ.get(name) for name in ("PROBE_SET", "PROBE_UNSET", "PROBE_CONFIG")}


def probe() -> dict:
    """The probe variables as seen at import time and now."""
    now = {name: os.environ.get(name) for name in AT_IMPORT}
    return {"at_import": AT_IMPORT, "now": now}
