"""Helpers around one problem: its program and a script that reproduces it.

:func:`reproducer` writes a problem as a ready-to-run Python script;
:func:`representative_targets` picks one target per distinct plan (:func:`plan_key`), so
that a suite checks each program once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import numpy as np

from emulate import formats as _formats
from emulate import targets as _targets
from emulate.formats import Format, FormatLike
from emulate.planning.plan import Plan
from emulate.planning.plan import plan as _make_plan
from emulate.testing.comparison import check_mode
from emulate.testing.strategies import DotProblem

__all__ = ["array_source", "plan_key", "representative_targets", "reproducer"]


def plan_key(p: Plan) -> tuple:
    """What decides the program a plan runs: two plans with equal keys (on different
    targets) run the same computation, with the same result bits."""
    fallback = p.fallback.method if p.fallback is not None else None
    return (p.method, p.lhs_compute, p.rhs_compute, p.accumulator, p.k_chunk, fallback)


def representative_targets(
    lhs: FormatLike,
    rhs: FormatLike,
    targets: Iterable[str | _targets.Target] | None = None,
    *,
    mode: str = "fast",
    preferred_element_type: FormatLike | None = "float32",
) -> list[str]:
    """One target name per distinct :func:`plan_key` among ``targets`` (default: all).

    Targets whose plans for ``lhs x rhs`` share a key run the same program, so a suite
    that checks one of them has checked them all. The first target of each group is
    returned, in the order given.

    Raises:
      What :func:`emulate.plan` raises for the pair (``NotImplementedError`` where
      ``mode="exact"`` is not built for it).
    """
    names = [t.name for t in _targets.all_targets()] if targets is None else targets
    seen: dict[tuple, str] = {}
    for t in names:
        p = _make_plan(lhs, rhs, target=t, preferred_element_type=preferred_element_type, mode=mode)
        seen.setdefault(plan_key(p), p.target)
    return list(seen.values())


def _dtype_expr(f: Format) -> str:
    module = "np" if f.dtype.name in ("int8", "uint8", "float16", "float32") else "ml_dtypes"
    return f"{module}.{f.name}"


def array_source(name: str, x: np.ndarray) -> str:
    """Python source that rebuilds ``x`` bit for bit as the variable ``name``.

    ``name = np.array(<hex codes>, dtype=np.uintN).view(<dtype>)`` (no ``.view`` for the
    unsigned integer types), then a comment with the values, cut after 200 characters.
    The source needs ``numpy as np`` and ``ml_dtypes`` imported.
    """
    x = np.asarray(x)
    f = _formats.get(x.dtype)
    uint = np.dtype(f"u{x.dtype.itemsize}")
    raw = x.view(uint) & np.asarray(f.code_mask, uint)
    digits = max(2, 2 * x.dtype.itemsize)
    prefix = f"{name} = np.array("
    body = np.array2string(
        raw,
        separator=", ",
        threshold=sys.maxsize,
        max_line_width=96,
        prefix=prefix,
        formatter={"int": lambda c: f"0x{int(c):0{digits}x}"},
    )
    view = "" if f.dtype == uint else f".view({_dtype_expr(f)})"
    with np.errstate(invalid="ignore"):
        values = str((x.astype(np.float64) if f.is_float else x.astype(np.int64)).tolist())
    if len(values) > 200:
        values = values[:200] + " ..."
    return f"{prefix}{body}, dtype=np.{uint.name}){view}\n# {name} values: {values}"


def reproducer(problem: DotProblem, *, target: str | _targets.Target, mode: str) -> str:
    """``problem`` as a ready-to-run Python script.

    The operands are written as ``np.array`` literals of their codes, viewed as their
    dtypes; the script calls :func:`emulate.dot_general` and
    :func:`emulate.reference.dot_general` and ends with :func:`assert_matches_reference`,
    which raises where the contract is broken.
    """
    check_mode(mode)
    t = _targets.get(target).name
    lhs, rhs, dn, pet = problem
    pet_s = repr(None if pet is None else _formats.get(pet).name)
    return "\n".join(
        [
            "import ml_dtypes",
            "import numpy as np",
            "",
            "import emulate",
            "from emulate import reference, testing",
            "",
            array_source("lhs", lhs),
            array_source("rhs", rhs),
            f"dimension_numbers = {dn!r}",
            "got = emulate.dot_general(",
            f"    lhs, rhs, dimension_numbers, preferred_element_type={pet_s}, "
            f"target={t!r}, mode={mode!r}",
            ")",
            f"want = reference.dot_general(lhs, rhs, dimension_numbers, "
            f"preferred_element_type={pet_s})",
            'print("got: ", repr(np.asarray(got)))',
            'print("want:", repr(want))',
            "testing.assert_matches_reference(",
            f"    got, lhs, rhs, dimension_numbers, mode={mode!r}, preferred_element_type={pet_s}",
            ")",
        ]
    )
