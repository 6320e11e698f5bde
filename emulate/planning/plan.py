"""Plans: how one operand pair runs on one target while keeping the numerics contract.

A :class:`Plan` names the type each operand is decoded to, the accumulator, the K-chunk
that keeps every partial sum exact, and the final rounding. :func:`plan` picks, among the
candidates the target can run natively, the one with the highest matrix-unit rate that
keeps the contract, and :meth:`Plan.explain` says why in words.

The exact class (``Plan.exact``): both operands are integers, or values that become
integers after an exact power-of-two scaling (int4, uint4, int8, uint8, float4_e2m1fn,
float6_e2m3fn). Their products are integers in units of a common quantum
``2**-(lhs_scale + rhs_scale)``, so a sum is exact while every partial sum stays within
2**24 quanta in an f32 accumulator or 2**31 - 1 in an int32 one; longer contractions are
cut into chunks of that length and the chunk sums combined exactly in int32 limbs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from emulate import formats, targets
from emulate.formats import Format, FormatLike
from emulate.planning import slicing as exponent_slicing
from emulate.planning.exactness import (
    F32_EXACT,
    I32_EXACT,
    MAX_CHUNKS,
    MAX_TOTAL_QUANTA,
    exact_class,
    exact_scale,
    max_quanta,
)

__all__ = ["MODES", "Plan", "plan", "runs_as_is"]

MODES = targets.MODES


@dataclasses.dataclass(frozen=True)
class Plan:
    """How to run ``lhs x rhs`` on ``target``.

    Attributes:
      target: the target name.
      lhs, rhs: operand format names.
      out: the result format name (what ``lax.dot_general`` returns for the call).
      mode: "fast" or "exact".
      method: "native" (operands go to the matrix unit as they are), "int8" (decoded to
        integers, scaled by ``2**lhs_scale`` / ``2**rhs_scale``, int32 accumulation),
        "bf16" or "f32" (decoded exactly to that type, f32 accumulation).
      lhs_compute, rhs_compute: the dtypes the dot sees.
      accumulator: "int32" or "float32".
      lhs_scale, rhs_scale: the power-of-two exponents that make the decoded values
        integers (exact class only; 0 otherwise).
      k_chunk: the longest contraction whose partial sums are exact in the accumulator
        (None: no chunking needed, integers wrap in int32 as the contract says, or the
        plan is bounded rather than exact).
      k_limit: the longest contraction the exact combination of chunk sums covers
        (2**15 chunks, and ``|total| < 2**40`` quanta for a float result); longer ones raise
        ``ValueError``. None where there is no limit.
      exact: True when the result is the correctly rounded exact sum for every K.
      rate: the target's matrix-unit rate for the compute pair, in ops/s (0 if unknown).
      candidates: (method, rate, why-not) for every method considered.
      fallback: for a native plan whose pair the host CPU backend cannot compile (int4 x
        int4 on a TPU target), the plan the same program runs when it is lowered for any
        platform other than ``platform``: the result bits are the same (exact class) or
        within the same bound. None otherwise.
      platform: the JAX platform name of the target ("tpu", "cuda", "cpu").
      slicing: for mode "exact" outside the exact class (methods ``sliced-int8``,
        ``sliced-bf16``, ``sliced-f32``), the exponent slice widths of lhs and rhs (see
        :mod:`emulate.planning.slicing`); None otherwise.
      slice_digits: with ``slicing``, whether each side is cut into balanced digits
        rather than exponent windows.
    """

    target: str
    lhs: str
    rhs: str
    out: str
    mode: str
    method: str
    lhs_compute: str
    rhs_compute: str
    accumulator: str
    lhs_scale: int
    rhs_scale: int
    k_chunk: int | None
    k_limit: int | None
    exact: bool
    rate: float
    candidates: tuple[tuple[str, float, str], ...]
    fallback: Plan | None = None
    platform: str = "cpu"
    slicing: tuple[int, int] | None = None
    slice_digits: tuple[bool, bool] = (False, False)

    def slicings(self) -> tuple[exponent_slicing.Slicing, exponent_slicing.Slicing]:
        """The lhs and rhs :class:`~emulate.planning.slicing.Slicing` of a sliced plan."""
        if self.slicing is None:
            raise ValueError(f"plan: {self.lhs} x {self.rhs} ({self.method}) is not sliced")
        return (
            exponent_slicing.slicing(self.lhs, self.slicing[0], self.slice_digits[0]),
            exponent_slicing.slicing(self.rhs, self.slicing[1], self.slice_digits[1]),
        )

    def explain(self) -> str:
        """The plan and the reasons for it, in plain words: one section per
        :data:`_EXPLANATION` entry, in that order."""
        return "\n".join(line for section in _EXPLANATION for line in section(self))

    def __str__(self) -> str:
        return self.explain()


_METHOD_WORDS = {
    "sliced-int8": "exponent slices decoded to int8, int32 accumulation, exact combination",
    "sliced-bf16": "exponent slices decoded to bfloat16, f32 accumulation, exact combination",
    "sliced-f32": "exponent slices decoded to float32, f32 accumulation, exact combination",
    "native": "native: the operands go to the matrix unit as they are",
    "int8": "decode to int8 (exact power-of-two scaling), int32 accumulation",
    "bf16": "decode to bfloat16 (exact), f32 accumulation",
    "f32": "decode to float32 (exact), f32 accumulation",
}


def _fmt_rate(rate: float) -> str:
    return f"{rate:.3g}" if rate else "-"


def _heading(p: Plan) -> list[str]:
    """The pair, result, target and mode; the method; what the matrix unit sees."""
    return [
        f"{p.lhs} x {p.rhs} -> {p.out} on {p.target} (mode {p.mode!r})",
        f"  method: {_METHOD_WORDS[p.method]}",
        f"  matrix unit sees: {p.lhs_compute} x {p.rhs_compute}, accumulating in {p.accumulator}",
    ]


def _scaling(p: Plan) -> list[str]:
    """The power-of-two scaling of the int8 route, where there is one."""
    if p.method != "int8" or not (p.lhs_scale or p.rhs_scale):
        return []
    return [
        f"  scaling: lhs x 2^{p.lhs_scale}, rhs x 2^{p.rhs_scale} makes every value "
        f"an integer; the sum is scaled back by 2^-{p.lhs_scale + p.rhs_scale}"
    ]


def _slice_unit(s: exponent_slicing.Slicing) -> str:
    return f"{s.width}-bit digits" if s.digits else f"{s.width} exponents"


def _chunking(p: Plan) -> list[str]:
    """How the contraction is cut: exponent slices (and per-row or per-column slicing of
    a wide operand), or K-chunks; nothing for a plan that sums in one pass."""
    if p.slicing is None:
        if p.k_chunk is None:
            return []
        return [
            f"  K-chunk: {p.k_chunk}, the longest contraction whose partial sums stay\n"
            f"    exact in {p.accumulator}; chunk sums are combined exactly in int32\n"
            f"    limbs, for K up to {p.k_limit}"
        ]
    sa, sb = p.slicings()
    passes = sa.count * sb.count
    lines = [
        f"  exponent slicing: lhs {sa.count} slices of {_slice_unit(sa)}, rhs "
        f"{sb.count} of {_slice_unit(sb)}: {passes} passes, each chunk of\n"
        f"    {p.k_chunk} exact; all sums added exactly in 16-bit limbs"
    ]
    for side, s in (("lhs", sa), ("rhs", sb)):
        if s.dynamic:
            what = "row" if side == "lhs" else "column"
            lines.append(
                f"  {side} {s.format} is sliced per {what}: {s.count} slices of "
                f"{s.width} bits below each {what}'s largest\n"
                f"    exponent ({s.count * s.width} bits); where smaller elements "
                f"have bits below those, further blocks\n"
                f"    of {s.count} slices (each {passes} more passes) "
                "run until none remain"
            )
    return lines


def _numerics(p: Plan) -> list[str]:
    """The contract the result keeps: exact (wrapping for an integer result), XLA's own
    dot (types emulate does not plan for), or bounded."""
    if p.exact and formats.get(p.out).is_integer:
        return [f"  numerics: exact; the int32 sum wraps into {p.out} as XLA's integer dots do"]
    if p.exact:
        return ["  numerics: exact; the result is the exact sum rounded once"]
    if not _planned(p.lhs):
        return [
            f"  numerics: XLA's own {p.lhs} dot, as lax.dot_general runs it (the sum "
            "wraps in int32)"
        ]
    return [
        "  numerics: bounded; |r - exact| <= gamma_K * sum|a*b| + underflow term, "
        "gamma_K = K*2^-24/(1 - K*2^-24)"
    ]


def _rounding(p: Plan) -> list[str]:
    """The one final rounding into the result type, where the result is narrower."""
    if p.slicing is not None:
        return [f"  result: the exact sum (16-bit limbs) rounded once into {p.out}"]
    if formats.get(p.out).is_float and p.out != "float32":
        return [f"  result: rounded once from {p.accumulator} into {p.out}"]
    return []


def _fallback(p: Plan) -> list[str]:
    """The route the program takes when lowered off the target's platform."""
    if p.fallback is None:
        return []
    return [
        f"  off {p.platform}: the host cannot compile {p.lhs} x {p.rhs}, so the "
        f"program lowered elsewhere takes the {p.fallback.method} route"
    ]


def _candidates(p: Plan) -> list[str]:
    """Every method considered, its rate and why not; the chosen one marked ``*``."""
    lines = ["  candidates (rate in ops/s):"]
    for method, rate, why in p.candidates:
        mark = "*" if method == p.method else " "
        shown = _fmt_rate(rate) if why == "ok" else "-"
        lines.append(f"   {mark} {method:<6} {shown:>10}  {why}")
    return lines


#: The sections of :meth:`Plan.explain`, in order; each returns its lines (maybe none).
_EXPLANATION = (_heading, _scaling, _chunking, _numerics, _rounding, _fallback, _candidates)


def plan(
    lhs: FormatLike,
    rhs: FormatLike,
    *,
    target: targets.TargetLike = None,
    preferred_element_type: FormatLike | None = None,
    mode: str | None = None,
) -> Plan:
    """Choose how to run a dot of ``lhs``-format by ``rhs``-format operands on ``target``.

    Args:
      lhs, rhs: format names, dtypes or Formats (low-precision or bfloat16/float16/float32).
      target: a target name or :class:`emulate.targets.Target`; default the current one
        (``emulate.current_target()``).
      preferred_element_type: as in ``lax.dot_general``; sets the result format.
      mode: "fast" (bounded for the float formats outside the exact class) or "exact";
        default the current mode (``emulate.current_mode()``: "fast" outside a
        ``with emulate.use_mode(...)`` block or a polyfilled function).

    Raises:
      ValueError: an unknown mode, or a format that cannot be a matmul operand
        (float8_e8m0fnu is a scale type).
      TypeError: operand types ``lax.dot_general`` itself rejects.
      NotImplementedError: ``mode="exact"`` for a pair it does not cover (int32 operands;
        float pairs are all covered).

    int32 x int32 gets a "native" plan on every target (XLA's own integer dot, the sum
    wrapped in int32; not exact for a float ``preferred_element_type``): the front ends
    hand such pairs to JAX as they are (:func:`runs_as_is`).
    """
    mode = targets.current_mode(mode)
    t = targets.current_target(target)
    a, b = formats.get(lhs), formats.get(rhs)
    for arg, f in (("lhs", a), ("rhs", b)):
        if f.name == "float8_e8m0fnu":
            raise ValueError(
                f"{arg}: float8_e8m0fnu is a scale type, not a matmul operand; "
                "pass it as the scales of a scaled operand"
            )
    out = formats.result_format(a, b, preferred_element_type)
    ka, kb = exact_scale(a), exact_scale(b)
    exact = exact_class(a, b)
    if mode == "exact" and not exact:
        if not (_sliceable(a) and _sliceable(b)):
            raise NotImplementedError(
                f"mode='exact' for {a.name} x {b.name} is not built: it covers the "
                "low-precision formats (integers, float8, float6, float4), bfloat16, float16 "
                "and float32 with each other; use mode='fast'"
            )
        return _sliced(t, a, b, out, mode)
    ints = a.is_integer and b.is_integer
    # An integer result wraps in int32 as XLA's integer dots do; a float result of integer
    # operands is the exact sum rounded once, so its int32 partial sums must not wrap.
    wraps = ints and out.is_integer
    # Largest |product| in units of the common quantum 2**-(ka + kb).
    # exact_class(a, b) is ``ka is not None and kb is not None``, spelt out for the checker.
    prod = max_quanta(a, ka) * max_quanta(b, kb) if ka is not None and kb is not None else 0
    # Integers outside the exact class (int32) have no exact chunk: XLA's own integer dot.
    int_chunk = None if wraps or not prod else I32_EXACT // prod
    cands = [
        _native(t, a, b, exact, ints, int_chunk if ints else None),
        *([_int8(t, a, b, ka, kb, int_chunk)] if ka is not None and kb is not None else []),
        _widen(t, a, b, "bf16", "bfloat16", ka, kb, prod, exact),
        _widen(t, a, b, "f32", "float32", ka, kb, prod, exact),
    ]
    usable = [c for c in cands if c.why == "ok"]
    if not usable:
        raise ValueError(
            f"lhs/rhs: no way to run {a.name} x {b.name} on target {t.name}: "
            + "; ".join(f"{c.method}: {c.why}" for c in cands)
        )
    best = max(usable, key=lambda c: c.rate)  # ties keep the order above
    fallback = None
    if (
        best.method == "native"
        and t.kind != "cpu"
        and not targets.get("cpu").supports(a.name, b.name)
    ):
        rest = [c for c in usable if c.method != "native"]
        if rest:
            fallback = _make(
                t, a, b, out, mode, exact, prod, max(rest, key=lambda c: c.rate), cands
            )
    return _make(t, a, b, out, mode, exact, prod, best, cands, fallback)


_PLATFORMS = {"tpu": "tpu", "gpu": "cuda", "cpu": "cpu"}

#: The operand types emulate plans for: the low-precision formats and the wide floats
#: (and the registered formats without a dtype: :func:`_planned`).
_PLANNED = formats.LOW_PRECISION + formats.WIDE_FLOATS


def _planned(name: str) -> bool:
    """Whether emulate plans for operands of this type: ``_PLANNED``, or a format registered
    from parameters (P3109, yours)."""
    if name in _PLANNED:
        return True
    try:
        return not formats.get(name).has_dtype
    except (TypeError, ValueError):
        return False


def _type_name(x: FormatLike | Any) -> str:
    try:
        return formats.get(x).name
    except (TypeError, ValueError):
        return np.dtype(x).name


def runs_as_is(
    lhs: FormatLike | Any, rhs: FormatLike | Any, *, target: targets.TargetLike = None
) -> bool:
    """Whether a dot or convolution of ``lhs``-typed by ``rhs``-typed operands is left to
    JAX as it is on ``target``: the question :func:`emulate.polyfill` asks of every site,
    and the first one the front ends ask.

    True when neither operand is a low-precision format (JAX's own types: int32, int16,
    bool, complex64, float64, bfloat16 x float16, ...), when one is low-precision and the
    other is a type emulate does not plan for (int32, float64, complex64, ...: JAX converts
    the low-precision operand exactly to it), and when the target runs the pair natively.
    False otherwise: a pair of the low-precision formats and the wide floats that the
    target lacks.

    Args:
      lhs, rhs: dtypes (any numpy / ml_dtypes / jnp dtype), format names or Formats.
      target: a target name or Target; default the current one.
    """
    a, b = _type_name(lhs), _type_name(rhs)
    low = [n for n in (a, b) if n in formats.LOW_PRECISION or _planned(n) and n not in _PLANNED]
    if not low:
        return True
    if not (_planned(a) and _planned(b)):
        return True
    return targets.current_target(target).supports(a, b)


def _sliceable(f: Format) -> bool:
    if f.name in ("bfloat16", "float16", "float32"):  # sliced per row, at run-time scales
        return True
    return f.is_low_precision and f.has_zero  # not float8_e8m0fnu, a scale type


def _sliced(t, a: Format, b: Format, out: Format, mode: str) -> Plan:
    """Mode "exact" outside the exact class: exponent slicing (:mod:`emulate.planning.slicing`)."""
    cands: list[_Candidate] = []
    options: list[tuple[float, int, _Candidate, tuple[tuple[int, int], tuple[bool, bool]]]] = []
    for compute, rate_name, acc in (
        ("int8", "int8", "int32"),
        ("bfloat16", "bfloat16", "float32"),
        ("float32", "float32", "float32"),
    ):
        chosen = exponent_slicing.fewest_passes(a, b, compute)
        rate = t.rate(rate_name)
        ok = chosen is not None and t.supports(compute, compute)
        if chosen is None:
            why = f"{compute} cannot hold the slices"
            sa = sb = None
            chunk = None
        else:
            sa, sb, chunk = chosen
            why = "ok" if ok else f"{t.name} has no {compute} x {compute} unit"
        method = "sliced-" + {"int8": "int8", "bfloat16": "bf16", "float32": "f32"}[compute]
        cands.append(_Candidate(method, rate, why, (compute, compute), acc, chunk))
        if ok:
            assert sa is not None and sb is not None and chunk is not None  # ok: chosen
            # Unknown rates count alike.
            cost = exponent_slicing.cost(sa, sb, chunk) / (rate or 1.0)
            options.append(
                (cost, len(options), cands[-1], ((sa.width, sb.width), (sa.digits, sb.digits)))
            )
    if not options:
        raise ValueError(f"lhs/rhs: no exact route for {a.name} x {b.name} on target {t.name}")
    _, _, best, (widths, digits) = min(options)
    plan_ = _make(t, a, b, out, mode, True, 0, dataclasses.replace(best, k_chunk=None), cands)
    return dataclasses.replace(plan_, slicing=widths, slice_digits=digits, k_chunk=best.k_chunk)


def _make(t, a, b, out, mode, exact, prod, c, cands, fallback=None) -> Plan:
    k_limit = None
    if c.k_chunk is not None:
        k_limit = MAX_CHUNKS * c.k_chunk
        if out.is_float:
            k_limit = min(k_limit, MAX_TOTAL_QUANTA // prod)
    return Plan(
        target=t.name,
        lhs=a.name,
        rhs=b.name,
        out=out.name,
        mode=mode,
        method=c.method,
        lhs_compute=c.compute[0],
        rhs_compute=c.compute[1],
        accumulator=c.accumulator,
        lhs_scale=c.scales[0],
        rhs_scale=c.scales[1],
        k_chunk=c.k_chunk,
        k_limit=k_limit,
        exact=exact,
        rate=c.rate,
        candidates=tuple((x.method, x.rate, x.why) for x in cands),
        fallback=fallback,
        platform=_PLATFORMS.get(t.kind, t.kind),
    )


@dataclasses.dataclass(frozen=True)
class _Candidate:
    method: str
    rate: float
    why: str  # "ok", or why the target cannot take it
    compute: tuple[str, str]
    accumulator: str
    k_chunk: int | None = None
    scales: tuple[int, int] = (0, 0)


def _native(t, a: Format, b: Format, exact: bool, ints: bool, chunk: int | None) -> _Candidate:
    # Only same-type pairs (design.md, "Traps": a TPU inference project reported wrong
    # results from an unquantized lhs fed with a quantized rhs straight into the MXU, and
    # Mosaic refuses mixed element types without its compatibility mode). Exact-class
    # floats (e2m1, e2m3) keep the integer route.
    if a != b:
        why = "mixed pair; decoded to one type instead"
    elif exact and not ints:
        why = f"{a.name} takes the exact integer route"
    elif not _planned(a.name):
        why = "ok"  # int32 with itself: XLA's own integer dot, on every target
    elif not t.supports(a.name, b.name):
        why = f"{t.name} has no {a.name} x {b.name} unit"
    else:
        why = "ok"
    acc = formats.dot_accumulator(a, b)
    return _Candidate("native", t.native_rate(a, b), why, (a.name, b.name), acc, chunk)


def _fits_int8(f: Format, k: int) -> bool:
    return f.min * 2**k >= -128 and f.max * 2**k <= 127


def _int8(t, a: Format, b: Format, ka: int, kb: int, chunk: int | None) -> _Candidate:
    if not (_fits_int8(a, ka) and _fits_int8(b, kb)):
        why = "values do not fit int8"
    elif not t.supports("int8", "int8"):
        why = f"{t.name} has no int8 x int8 unit"
    else:
        why = "ok"
    return _Candidate("int8", t.rate("int8"), why, ("int8", "int8"), "int32", chunk, (ka, kb))


def _widen(t, a: Format, b: Format, method: str, compute: str, ka, kb, prod, exact) -> _Candidate:
    lossy = [f.name for f in (a, b) if f.name != compute and compute not in f.exact_in]
    if lossy:
        why = f"{compute} does not hold every {lossy[0]} value"
    elif not t.supports(compute, compute):
        why = f"{t.name} has no {compute} x {compute} unit"
    else:
        why = "ok"
    chunk = F32_EXACT // prod if exact else None
    scales = (ka, kb) if exact else (0, 0)
    return _Candidate(method, t.rate(compute), why, (compute, compute), "float32", chunk, scales)
