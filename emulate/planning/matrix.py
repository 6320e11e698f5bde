"""The plan of many operand pairs on many targets at once: which route each one takes.

:func:`method_matrix` plans ``lhs x fmt`` (or ``fmt x fmt``) for every target and format
and returns one :class:`MethodCell` each: the plan's method, whether the target runs the
pair natively, and the route a native plan takes off its own platform. ``emulate
targets`` draws two of these matrices (``fmt x fmt`` and ``bfloat16 x fmt``) under the
native-pair matrix of :func:`emulate.capabilities.render_matrix`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from emulate import formats as _formats
from emulate import targets as _targets
from emulate.formats import FormatLike
from emulate.planning.plan import plan

__all__ = ["NO_ROUTE", "MethodCell", "method_matrix"]

#: The method of a cell where :func:`emulate.plan` finds no route.
NO_ROUTE = "none"


class MethodCell(NamedTuple):
    """The plan of one operand pair on one target (see :func:`method_matrix`).

    ``target``, ``lhs`` and ``rhs`` are names. ``method`` is the plan's method
    (``"native"``, ``"int8"``, ``"bf16"``, ``"f32"``), or ``"none"`` where
    :func:`emulate.plan` finds no route (it raises ValueError, or NotImplementedError for
    a pair mode "exact" does not build). ``native`` says whether the target's matrix unit
    takes ``lhs x rhs`` as it is (:meth:`emulate.targets.Target.supports`); the plan may
    still take another route (:attr:`passed_over`). ``fallback`` is, for a native plan
    whose pair the host CPU backend cannot compile, the method of the route taken when the
    program is lowered for another platform (:attr:`emulate.Plan.fallback`), else None.
    ``platform`` is the JAX platform of the plan (``"tpu"``, ``"cuda"``, ``"cpu"``), None
    where there is no route.
    """

    target: str
    lhs: str
    rhs: str
    method: str
    native: bool
    fallback: str | None
    platform: str | None

    @property
    def passed_over(self) -> bool:
        """Native on the target, yet planned another way: the plan found a route that is
        faster by the target's rates."""
        return self.native and self.method not in ("native", NO_ROUTE)


def method_matrix(
    targets: Iterable[str | _targets.Target] | None = None,
    formats: Iterable[FormatLike] | None = None,
    *,
    lhs: FormatLike | None = None,
    preferred_element_type: FormatLike | None = "float32",
    mode: str = "fast",
) -> list[MethodCell]:
    """The plan of ``lhs x fmt`` (``fmt x fmt`` where ``lhs`` is None) per target and format.

    Args:
      targets: names or Targets; default :func:`emulate.targets.all_targets`.
      formats: the right operands (names, dtypes or Formats); default
        ``formats.LOW_PRECISION_OPERANDS``.
      lhs: the left operand of every pair; None pairs each format with itself.
      preferred_element_type, mode: as for :func:`emulate.plan`; the default result type
        is float32, whatever ``lax.dot_general`` would give.

    Returns:
      Cells target-major, in the order given (repeats kept).

    Raises:
      ValueError: an unknown target, format or mode.
    """
    ts = _targets.all_targets() if targets is None else [_targets.get(t) for t in targets]
    names = _formats.LOW_PRECISION_OPERANDS if formats is None else formats
    fs = [_formats.get(f).name for f in names]
    left = None if lhs is None else _formats.get(lhs).name
    # Refuse a bad result type or mode here, before every cell reads "none".
    if preferred_element_type is not None:
        _formats.get(preferred_element_type)
    _targets.current_mode(mode)
    cells = []
    for t in ts:
        for f in fs:
            a = f if left is None else left
            native = t.supports(a, f)
            try:
                p = plan(a, f, target=t, preferred_element_type=preferred_element_type, mode=mode)
            except (ValueError, NotImplementedError):
                cells.append(MethodCell(t.name, a, f, NO_ROUTE, native, None, None))
                continue
            fallback = None if p.fallback is None else p.fallback.method
            cells.append(MethodCell(t.name, a, f, p.method, native, fallback, p.platform))
    return cells
