"""Argument checks shared by the runtime packages: one wording for every bad number.

The bottom of ``runtime/``: every seed's package (``ring``, ``tensormap``, ``pipeline``,
``checkpoint``) and ``zero3`` import it, and it imports none of them.
"""

from __future__ import annotations

import numbers

__all__ = ["FLOAT32_BYTES", "check_int", "integer"]

FLOAT32_BYTES = 4
"""Bytes per element: every tensor of the ANE seed is float32."""


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an ``int`` >= ``minimum``, or a ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}={value}: expected an integer >= {minimum}")
    return int(value)


def integer(value: object, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an ``int``, checked.

    Raises:
        TypeError: ``value`` is not an integer (``bool`` and ``3.0`` included); the message
            names ``name``.
        ValueError: ``value`` < ``minimum``, or ``value`` > ``maximum`` (when given).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value
