"""Paths the documentation gave before a module or a name moved: each still imports.

Two tables, one rule: what any version of the docs named keeps importing as it did, and
says where it lives now.

- :data:`MODULES`: a module path that is gone (``emulate.tiled``,
  ``emulate.pallas.mosaic_check`` ...) -> the modules that hold its names now, the first
  being where it went. ``import emulate.tiled`` (or ``from emulate.tiled import
  settings``) gives a stand-in module that warns once, with a :class:`DeprecationWarning`
  naming the new path, and hands out each name from the first new home that has it.
- :data:`NAMES`: a name that left a module which still exists
  (``emulate.conv.PaddingError``) -> its path now. The module's ``__getattr__``
  (:func:`module_getattr`) hands it out, with the same warning; so does a stand-in for a
  name renamed in its module's move (``emulate.pallas.route.route`` ->
  ``emulate.pallas.compute.in_kernel``).

The modules that moved whole into a package before these (``emulate.mx``,
``emulate.quant``, ``emulate.qarray``, ``emulate.reference_codes``,
``emulate.reference_rounding``) are the same module objects under both paths and warn
nothing (``emulate/__init__.py``): docs/api.md states those paths as current.

Nothing here is imported until an old path is used: the tables hold dotted strings, and
:func:`install` puts the stand-ins' finder on ``sys.meta_path`` when ``emulate`` loads.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = ["MODULES", "NAMES", "install", "module_getattr", "resolve"]

#: A module path the docs named that is gone -> the modules holding its names now (the
#: first is where it went; names split off from it follow).
MODULES: Final[dict[str, tuple[str, ...]]] = {
    "emulate.codecs": ("emulate.numerics.codecs",),
    "emulate.exact": ("emulate.engine.exact", "emulate.planning.slicing"),
    "emulate.tiled": ("emulate.engine.tiled",),
    "emulate.qparts": (
        "emulate.quantized.values",
        "emulate.quantized.checks",
        "emulate.numerics.scales",
    ),
    "emulate.pallas.mosaic_check": ("emulate.pallas.checking.mosaic_check",),
    "emulate.pallas.findings": ("emulate.pallas.checking.findings",),
    "emulate.pallas.op_rules": ("emulate.pallas.checking.op_rules",),
    "emulate.pallas.sites": ("emulate.pallas.checking.sites",),
    "emulate.pallas.qblocks": ("emulate.pallas.qsteps",),
    "emulate.route_setting": ("emulate.routing.setting",),
    "emulate.pallas.route": ("emulate.pallas.compute",),
}

#: ``module.name`` the docs named, the module still there but the name gone from it (or a
#: :data:`MODULES` path whose name was renamed in the move) -> the name's path now.
NAMES: Final[dict[str, str]] = {
    "emulate.compiler.verdict": "emulate.mosaic.verdict",
    "emulate.compiler.Verdict": "emulate.mosaic.Verdict",
    "emulate.compiler.Probe": "emulate.mosaic.Probe",
    "emulate.compiler.ProbeCase": "emulate.mosaic.ProbeCase",
    "emulate.compiler.ProbeRow": "emulate.mosaic.ProbeRow",
    "emulate.compiler.PROBE_PATH": "emulate.mosaic.PROBE_PATH",
    "emulate.compiler.natural_accumulator": "emulate.mosaic.natural_accumulator",
    "emulate.compiler.recorded": "emulate.mosaic.recorded",
    "emulate.conv.PaddingError": "emulate.engine.conv_args.PaddingError",
    "emulate.cpu.gemv.listing": "emulate.cpu.handler.listing",
    "emulate.cpu.route.choose": "emulate.cpu.route.kernel_form",  # a refusal: its reason
    "emulate.cpu.route.FEW_ROWS": "emulate.cpu.route.MAX_ROWS",  # every form takes 16
    "emulate.engine.args.PaddingError": "emulate.engine.conv_args.PaddingError",
    "emulate.engine.tiled.choose": "emulate.engine.tiled.tiling_for",
    "emulate.engine.qtiled.choose": "emulate.engine.qtiled.qtiling_for",
    "emulate.kernel_route.partitioned_over": "emulate.sharding.partitioned_over",
    "emulate.pallas.route.Route": "emulate.pallas.compute.Compute",
    "emulate.pallas.route.route": "emulate.pallas.compute.in_kernel",
    "emulate.scaled.dot_general": "emulate.dot_general",
    "emulate.targets.CapabilityRow": "emulate.capabilities.CapabilityRow",
    "emulate.targets.capability_matrix": "emulate.capabilities.capability_matrix",
    "emulate.targets.render_matrix": "emulate.capabilities.render_matrix",
    "emulate.scaled.scaled_dot_general": "emulate.scaled_dot_general",
}


def resolve(path: str) -> Any:
    """The object at the dotted ``path`` (``"emulate.mosaic.verdict"``): the longest module
    prefix imported, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(f"no module for {path!r}")


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path still works but will be removed",
        DeprecationWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this module, so that the warning points
    at the user's ``import`` or attribute access (``warnings`` skips the import machinery's
    frames itself)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename in (
        __file__,
        "<frozen importlib._bootstrap>",
    ):
        if frame.f_code.co_filename == __file__:
            level += 1
        frame = frame.f_back  # type: ignore[assignment]
    return level


class _Moved(types.ModuleType):
    """The stand-in for a module path in :data:`MODULES`."""

    def __init__(self, name: str, homes: Sequence[str]) -> None:
        super().__init__(name, f"Moved to {homes[0]}: this path still imports (emulate.moved).")
        self.__homes = tuple(homes)

    def __getattr__(self, name: str) -> Any:
        if name == "__all__":
            return sorted({n for home in self.__homes for n in _public(home)})
        if name.startswith("__"):
            raise AttributeError(name)
        renamed = NAMES.get(f"{self.__name__}.{name}")
        if renamed is not None:
            _warn(f"{self.__name__}.{name}", renamed)
            return resolve(renamed)
        for home in self.__homes:
            module = importlib.import_module(home)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(
            f"module {self.__name__!r} (moved to {self.__homes[0]}) has no attribute {name!r}"
        )

    def __dir__(self) -> list[str]:
        names: set[str] = set()
        for home in self.__homes:
            names |= set(dir(importlib.import_module(home)))
        return sorted(names)


def _public(home: str) -> list[str]:
    module = importlib.import_module(home)
    return list(getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MODULES` and loads their stand-ins."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Moved(spec.name, MODULES[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        importlib.import_module(MODULES[module.__name__][0])
        _warn(module.__name__, MODULES[module.__name__][0])


_FINDER = _Finder()


def install() -> None:
    """Put the finder of the old module paths first on ``sys.meta_path`` (once): an old
    path is the stand-in even where another finder still sees a file of that name (an
    editable install of an older checkout, a stale site-packages copy)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def module_getattr(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` that hands out its moved :data:`NAMES`, with
    the deprecation warning, and raises Python's AttributeError for any other name."""

    def __getattr__(name: str) -> Any:
        new = NAMES.get(f"{module}.{name}")
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        _warn(f"{module}.{name}", new)
        return resolve(new)

    return __getattr__
