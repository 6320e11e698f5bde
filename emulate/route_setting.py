"""Deprecated: the route setting moved to :mod:`emulate.routing.setting` (every name of
this module resolves there, with a DeprecationWarning naming it)."""

from __future__ import annotations

import warnings
from typing import Any

from emulate.routing import setting


def __getattr__(name: str) -> Any:
    if name in setting.__all__:
        warnings.warn(
            f"emulate.route_setting.{name} is deprecated: use emulate.routing.setting.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(setting, name)
    raise AttributeError(f"module 'emulate.route_setting' has no attribute {name!r}")
