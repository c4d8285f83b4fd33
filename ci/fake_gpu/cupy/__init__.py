"""The fake-GPU lane's ``cupy``: the suites' fake CuPy (``suites/allocator/_fake_cupy.py``),
installed in place of this package at import.

``ci/check.sh --fake-cuda`` puts ``ci/fake_gpu`` first on ``PYTHONPATH`` (so every process of
the run, death-test children and the zygote included, imports this) and ``ci/fake_gpu/bin``
first on ``PATH`` (a stand-in ``nvidia-smi`` that lists one GPU). Importing it initializes
nothing, as with CuPy: the first runtime call does. The fake is loaded by file path, so the
repository root need not be importable.

The fake device has 16 GiB (host memory is used only for what is allocated).
"""

import importlib.util
import os
import sys

_FAKE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir, "suites",
    "allocator", "_fake_cupy.py",
)  # fmt: skip


def _install() -> None:
    spec = importlib.util.spec_from_file_location("_devmem_fake_cupy", os.path.normpath(_FAKE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install(total_bytes=16 << 30)  # replaces sys.modules["cupy"]: the import gets it


_install()
assert sys.modules[__name__]._fake is not None
