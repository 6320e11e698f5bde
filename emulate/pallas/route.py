"""Deprecated: the in-kernel compute of an operand pair moved to
:mod:`emulate.pallas.compute` (``Route`` is ``Compute``, ``route`` is ``in_kernel``; the
other names are the same). Every name resolves there, with a DeprecationWarning naming it.
"""

from __future__ import annotations

import warnings
from typing import Any

from emulate.pallas import compute

_RENAMED = {"Route": "Compute", "route": "in_kernel"}


def __getattr__(name: str) -> Any:
    new = _RENAMED.get(name, name)
    if new in compute.__all__:
        warnings.warn(
            f"emulate.pallas.route.{name} is deprecated: use emulate.pallas.compute.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(compute, new)
    raise AttributeError(f"module 'emulate.pallas.route' has no attribute {name!r}")
