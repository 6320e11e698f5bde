"""Helpers around one problem: its program and a script that reproduces it.

:func:`reproducer` writes a problem as a ready-to-run Python script;
:func:`representative_targets` picks one target per distinct plan (:func:`plan_key`), so
that a suite checks each program once.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from emulate import formats as _formats
from emulate import targets as _targets
from emulate.formats import Format, FormatLike
from emulate.numerics.storage import Packed, unpack_codes
from emulate.planning.plan import Plan
from emulate.planning.plan import plan as _make_plan
from emulate.quantized.array import QArray
from emulate.quantized.layout import layout_of
from emulate.testing.comparison import check_mode
from emulate.testing.strategies import DotProblem

__all__ = [
    "array_source",
    "function_reproducer",
    "literal_source",
    "operand_source",
    "plan_key",
    "representative_targets",
    "reproducer",
]


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
    sources, values = [], []
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if isinstance(x, Packed):  # a format without a dtype: its codes, packed
            sources += [register_source(x.format), packed_source(name, x)]
            sources.append(
                f"{name}_values = reference.decode({name}_codes, {x.format_name!r}, "
                "to=np.float32)  # exact"
            )
            values.append(f"{name}_values")
        else:
            sources.append(array_source(name, x))
            values.append(name)
    want = f"reference.dot_general({values[0]}, {values[1]}, "
    if pet is None and values != ["lhs", "rhs"]:  # lax's result type of the true formats
        fl, fr = (x.format if isinstance(x, Packed) else _formats.get(x.dtype) for x in (lhs, rhs))
        want_pet = repr(_formats.dot_result(fl, fr).name)
    else:
        want_pet = pet_s
    return "\n".join(
        [
            "import ml_dtypes",
            "import numpy as np",
            "",
            "import emulate",
            "from emulate import reference, testing",
            "",
            *[src for src in sources if src],
            f"dimension_numbers = {dn!r}",
            "got = emulate.dot_general(",
            f"    lhs, rhs, dimension_numbers, preferred_element_type={pet_s}, "
            f"target={t!r}, mode={mode!r}",
            ")",
            f"want = {want}dimension_numbers, preferred_element_type={want_pet})",
            'print("got: ", repr(np.asarray(got)))',
            'print("want:", repr(want))',
            "testing.assert_matches_reference(",
            f"    got, lhs, rhs, dimension_numbers, mode={mode!r}, preferred_element_type={pet_s}",
            ")",
        ]
    )


def register_source(f: Format) -> str:
    """Python source that registers ``f`` (a format built with
    :func:`emulate.formats.float_format`) as the script's process needs it; empty for the
    formats emulate has built in (the ml_dtypes ones, the P3109 family)."""
    if f.has_dtype or f.name.startswith("p3109_"):
        return ""
    negative_zero = f.signed_zero or not f.signed
    return (
        f"emulate.formats.register(emulate.formats.float_format({f.name!r}, bits={f.bits}, "
        f"precision={f.mantissa_bits + 1}, bias={f.bias}, signed={f.signed}, "
        f"infinities={f.has_inf}, high_nans={f.high_nans}, negative_zero={negative_zero}))"
    )


def packed_source(name: str, x: Packed) -> str:
    """Python source that rebuilds the Packed array ``x`` from its uint8 codes."""
    codes = np.asarray(unpack_codes(x))
    return "\n".join(
        [
            array_source(f"{name}_codes", codes),
            f"{name} = emulate.pack({name}_codes, {x.format_name!r}, axis={x.axis})",
        ]
    )


def _value_literal(v: float | int) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "np.nan"
    if math.isinf(v):
        return "np.inf" if v > 0 else "-np.inf"
    return repr(v)


def literal_source(name: str, x: np.ndarray) -> str:
    """Python source that rebuilds ``x`` as the variable ``name``, written as values.

    Integers appear as their values (int4 code 8 as ``-8``), floats as exact decimal
    literals (``np.nan``, ``np.inf``). Nothing is elided: an array that is mostly one
    value is written as ``np.full`` followed by an assignment per other element, so the
    odd element is always visible; others as a full nested list. Falls back to
    :func:`array_source` (codes) where values cannot rebuild the bits (a NaN's sign).
    Needs ``numpy as np`` and ``ml_dtypes`` imported.
    """
    x = np.asarray(x)
    f = _formats.get(x.dtype)
    dt = _dtype_expr(f)
    with np.errstate(invalid="ignore"):
        vals = x.astype(np.float64) if f.is_float else x.astype(np.int64)
    py = [_value_of(v, f) for v in vals.reshape(-1).tolist()]
    with np.errstate(invalid="ignore", over="ignore"):
        rebuilt = np.array(vals, np.float64 if f.is_float else np.int64).astype(x.dtype)
    if rebuilt.tobytes() != x.tobytes():
        return array_source(name, x)
    if x.size > 16:
        values, counts = np.unique(np.array([repr(v) for v in py]), return_counts=True)
        common = values[int(np.argmax(counts))]
        if counts.max() * 2 > x.size:
            bg = py[[repr(v) for v in py].index(common)]
            lines = [f"{name} = np.full({x.shape!r}, {_value_literal(bg)}, dtype={dt})"]
            for flat, v in enumerate(py):
                if repr(v) != common:
                    idx = tuple(int(i) for i in np.unravel_index(flat, x.shape))
                    lines.append(f"{name}[{idx!r}] = {_value_literal(v)}")
            return "\n".join(lines)
    nested = np.array(py, dtype=object).reshape(x.shape).tolist() if x.shape else py[0]
    body = _nested(nested)
    return f"{name} = np.array({body}, dtype={dt})"


def _value_of(v: float | int, f: Format) -> float | int:
    return float(v) if f.is_float else int(v)


def _nested(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_nested(e) for e in v) + "]"
    return _value_literal(v)


def operand_source(name: str, x: Any) -> str:
    """Python source that rebuilds an operand (array, :class:`emulate.Packed` or
    :class:`emulate.QArray`) as the variable ``name``, values written out
    (:func:`literal_source`). Needs ``numpy as np``, ``ml_dtypes`` and ``emulate``."""
    if isinstance(x, Packed):
        codes = np.asarray(unpack_codes(x)).view(x.format.dtype)
        return "\n".join(
            [
                literal_source(f"{name}_codes", codes),
                f"{name} = emulate.pack({name}_codes, axis={x.axis})",
            ]
        )
    if isinstance(x, QArray):
        codes = np.asarray(x.unpacked_codes())
        if codes.dtype == np.uint8 and x.format.dtype != np.uint8:
            codes = codes.view(x.format.dtype)
        lines = [
            literal_source(f"{name}_codes", codes),
            literal_source(f"{name}_scales", np.asarray(x.scales)),
        ]
        lay = layout_of(x)
        c = f"{name}_codes"
        if lay.codes.packed_axis is not None:
            c = f"emulate.pack({name}_codes, axis={lay.codes.array.axis})"
        elif not x.format.xla_storable:
            c = f"{name}_codes.view(np.uint8), fmt={x.format_name!r}"
        ts = None if lay.tensor is None else float(np.asarray(lay.tensor.array))
        lines.append(
            f"{name} = emulate.QArray.from_parts(\n    {c}, {name}_scales, "
            f"block_shape={tuple(x.block_shape)!r}, tensor_scale={ts!r},\n    "
            f"dtype={'ml_dtypes' if x.dtype.name == 'bfloat16' else 'np'}.{x.dtype.name}, "
            f"element_exponent={lay.exponent}\n)"
        )
        return "\n".join(lines)
    return literal_source(name, np.asarray(x))


def _dn_tuple(dn: Any) -> tuple:
    return tuple(tuple(tuple(int(d) for d in axes) for axes in pair) for pair in dn)


def _import_line(fn: Callable) -> tuple[str, str]:
    """``(import statement, expression)`` that names ``fn`` in a fresh process, or a
    comment and a placeholder where ``fn`` cannot be imported (a lambda, a local)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        try:
            obj: Any = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            obj = None
        if obj is fn:
            top, _, rest = qualname.partition(".")
            expr = top + (f".{rest}" if rest else "")
            return f"from {module} import {top}", expr
    return (
        f"# {module}:{qualname} cannot be imported by name: define it here as fn",
        "fn",
    )


def function_reproducer(
    fn: Callable,
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any,
    *,
    contract: str = "exact",
    out: str | None = None,
    target: str | None = None,
    extra_roundings: int = 0,
    tpu_numerics: bool = False,
) -> str:
    """A script that calls ``fn`` (imported by ``module:qualname``) on ``lhs`` and ``rhs``,
    written as literal values (:func:`operand_source`), and checks the result with
    :func:`emulate.testing.assert_matches_reference`, which raises where the contract
    breaks. A ``contract`` other than "exact" and "fast" (your own bound) is checked as
    "fast"; edit the last line to pass your ``bound=``. With ``tpu_numerics`` the script
    calls ``testing.tpu_numerics(fn, target=target)`` instead of ``fn``."""
    imp, expr = _import_line(fn)
    mode = contract if contract in ("exact", "fast") else "fast"
    if tpu_numerics:
        expr = f"testing.tpu_numerics({expr}, target={target!r})"
    call = f"{expr}(lhs, rhs)"
    if target is not None:
        call_lines = [f"with emulate.use_target({target!r}):", f"    got = np.asarray({call})"]
    else:
        call_lines = [f"got = np.asarray({call})"]
    out_s = repr(out) if out is not None else "got.dtype"
    extra = f", extra_roundings={extra_roundings}" if extra_roundings else ""
    return "\n".join(
        [
            "import ml_dtypes",
            "import numpy as np",
            "",
            "import emulate",
            "from emulate import testing",
            imp,
            "",
            operand_source("lhs", lhs),
            operand_source("rhs", rhs),
            *call_lines,
            f"dimension_numbers = {_dn_tuple(dimension_numbers)!r}",
            "testing.assert_matches_reference(",
            f"    got, lhs, rhs, dimension_numbers, mode={mode!r}, "
            f"preferred_element_type={out_s}{extra}",
            ")",
        ]
    )
