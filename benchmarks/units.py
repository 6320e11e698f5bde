"""The units the benchmarks print figures in, and their shapes' text.

:func:`ms`, :func:`us` and :func:`mb` print three significant digits (whole numbers from
100 up), or a fixed number of decimals where ``places`` is given; a missing figure (None)
prints as ``"?"``. Standard library only (``python -m benchmarks.report`` uses them).
"""

from __future__ import annotations

from collections.abc import Sequence

MISSING = "?"


def _digits(v: float, places: int | None) -> str:
    if places is not None:
        return f"{v:.{places}f}"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def ms(seconds: float | None, places: int | None = None) -> str:
    """``seconds`` in milliseconds, without the unit: ``ms(0.0123) == "12.3"``,
    ``ms(0.1234) == "123"``, ``ms(0.0123, places=3) == "12.300"``, ``ms(None) == "?"``."""
    return MISSING if seconds is None else _digits(seconds * 1e3, places)


def us(seconds: float | None, places: int | None = None) -> str:
    """``seconds`` in microseconds, without the unit, as :func:`ms` writes milliseconds."""
    return MISSING if seconds is None else _digits(seconds * 1e6, places)


def mb(nbytes: float | None, places: int | None = None) -> str:
    """``nbytes`` in megabytes (10**6 bytes), without the unit: ``mb(8_388_608) == "8.39"``,
    ``mb(134_217_728) == "134"``, ``mb(None) == "?"``."""
    return MISSING if nbytes is None else _digits(nbytes / 1e6, places)


def ratio(value: float | None, places: int = 2) -> str:
    """A ratio with ``places`` decimals and no unit: ``ratio(1.234) == "1.23"``,
    ``ratio(None) == "?"``."""
    return MISSING if value is None else f"{value:.{places}f}"


def quotient(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None where either figure is missing or ``b`` is 0 (a compiler that
    gave no estimate, a contender that did not run)."""
    return None if a is None or not b else a / b


def shape_text(shape: Sequence[int]) -> str:
    """A shape as the flags write it: ``shape_text((64, 4096, 1024)) == "64x4096x1024"``."""
    return "x".join(str(d) for d in shape)
