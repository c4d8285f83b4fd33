"""Argument checks shared by the runtime modules: one wording for every bad number."""

from __future__ import annotations

import numbers

__all__ = ["integer"]


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
