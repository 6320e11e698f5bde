"""A ``conv_general_dilated`` call, checked once into a frozen record.

:func:`conv_args` is the one validator of :func:`emulate.conv_general_dilated`, as
:func:`emulate.engine.args.dot_args` is of ``dot_general``: it refuses a malformed call
before anything is traced, with ``lax.conv_general_dilated``'s exception types and a
message naming the argument, and returns the call normalized (:class:`ConvArgs`). The
result type follows :func:`emulate.engine.args.dot_args`' rule, with ``K`` the input
features per group times the window.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.engine import sites
from emulate.engine.args import precision_arg, preferred, result_types, with_format
from emulate.engine.operands import Operand, OperandLike, Precision, describe, operand
from emulate.engine.prepared import unprepared
from emulate.formats import FormatLike
from emulate.quantized.array import QArray

__all__ = ["ConvArgs", "PaddingError", "check_conv_params", "conv_args"]


class PaddingError(ValueError, RuntimeError):
    """An unknown padding string: a ValueError, and the RuntimeError ``lax`` raises for it."""


@dataclasses.dataclass(frozen=True)
class ConvArgs:
    """One validated ``conv_general_dilated`` call: the parameters as ``lax`` takes them
    (strides and dilations as tuples of ints, padding a string or (low, high) pairs),
    ``dimension_numbers`` as ``lax.ConvDimensionNumbers``, and ``result`` / ``wrap_to`` /
    ``target`` / ``mode`` as in :class:`DotArgs`. ``out_shape`` is the result's shape."""

    lhs: Operand
    rhs: Operand | QArray
    window_strides: tuple[int, ...]
    padding: str | tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...] | None
    rhs_dilation: tuple[int, ...] | None
    dimension_numbers: lax.ConvDimensionNumbers
    feature_group_count: int
    batch_group_count: int
    precision: Precision
    result: str
    wrap_to: str | None
    target: targets.Target
    mode: str
    out_shape: tuple[int, ...]
    out_sharding: Any = None

    @property
    def window(self) -> int:
        """Taps of the kernel window (1 without spatial dimensions)."""
        return math.prod(self.rhs.shape[d] for d in self.dimension_numbers.rhs_spec[2:])

    @property
    def k(self) -> int:
        """``in_features_per_group * window``: the length of each output's sum."""
        return self.rhs.shape[self.dimension_numbers.rhs_spec[1]] * self.window

    def lax_params(self) -> dict[str, Any]:
        """The keyword arguments of ``lax.conv_general_dilated`` (no operands, no types)."""
        return dict(
            window_strides=self.window_strides,
            padding=self.padding,
            lhs_dilation=self.lhs_dilation,
            rhs_dilation=self.rhs_dilation,
            dimension_numbers=self.dimension_numbers,
            feature_group_count=self.feature_group_count,
            batch_group_count=self.batch_group_count,
        )

    def tag(self) -> sites.SiteTag:
        a, b = self.lhs, self.rhs
        return sites.SiteTag(
            "conv_general_dilated",
            sites.operand_text(a.format_name, a.shape),
            sites.operand_text(b.format_name, b.shape, b if isinstance(b, QArray) else None),
            self.result,
            self.target.name,
            self.mode,
            2 * math.prod(self.out_shape) * self.k,
        )


def _ints(name: str, value: Any, n: int, *, low: int | None, where: str = "") -> tuple[int, ...]:
    """``value`` as a sequence of ``n`` ints, each at least ``low`` (None: any)."""
    if isinstance(value, str) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(
            f"{name}: expected a sequence of {n} ints (one per spatial dimension), got "
            f"{type(value).__name__} {value!r}"
        )
    try:
        out = tuple(operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f"{name}: expected ints, got {tuple(value)!r}") from None
    if len(out) != n:
        raise ValueError(
            f"{name}: expected {n} values (one per spatial dimension: the operands' rank - 2), "
            f"got {out}" + (f"; {where}" if where else "")
        )
    if low is not None and any(v < low for v in out):
        raise ValueError(f"{name}: expected ints >= {low}, got {out}")
    return out


def check_conv_params(
    nsp: int,
    window_strides: Any,
    padding: Any,
    lhs_dilation: Any,
    rhs_dilation: Any,
    feature_group_count: Any,
    batch_group_count: Any,
    *,
    where: str = "",
) -> tuple[
    tuple[int, ...],
    str | tuple[tuple[int, int], ...],
    tuple[int, ...] | None,
    tuple[int, ...] | None,
]:
    """Refuse what ``lax.conv_general_dilated`` refuses for ``nsp`` spatial dimensions,
    before anything is traced; return strides, padding and dilations as ``lax`` takes
    them (tuples of ints; a padding string as given). ``where`` (the operands) ends the
    message of a count that does not match the operands' rank.

    Raises:
      TypeError: strides or a dilation that is not a sequence of ints (as lax).
      ValueError: the wrong count, values below 1, a padding of other than ``nsp``
        (low, high) pairs of ints, a group count that is no positive int.
      PaddingError: an unknown padding string (a ValueError, and the RuntimeError lax
        raises).
    """
    strides = _ints("window_strides", window_strides, nsp, low=1, where=where)
    ld, rd = (
        None if dil is None else _ints(name, dil, nsp, low=1, where=where)
        for name, dil in (("lhs_dilation", lhs_dilation), ("rhs_dilation", rhs_dilation))
    )
    pads: str | tuple[tuple[int, int], ...]
    if isinstance(padding, str):
        if padding.upper() not in ("VALID", "SAME", "SAME_LOWER"):
            raise PaddingError(
                f"padding: expected 'VALID', 'SAME', 'SAME_LOWER' or {nsp} (low, high) "
                f"pairs, got {padding!r}"
            )
        pads = padding
    else:
        try:
            pads = tuple((operator.index(lo), operator.index(hi)) for lo, hi in padding)
        except (TypeError, ValueError):
            raise ValueError(
                f"padding: expected 'VALID', 'SAME', 'SAME_LOWER' or {nsp} (low, high) pairs "
                f"of ints, got {padding!r}"
            ) from None
        if len(pads) != nsp:
            raise ValueError(f"padding: expected {nsp} (low, high) pairs, got {len(pads)}")
    for name, v in (
        ("feature_group_count", feature_group_count),
        ("batch_group_count", batch_group_count),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return strides, pads, ld, rd


def _conv_result(a: Operand, b: Operand | QArray, pet: str | None) -> tuple[str, str | None]:
    """(result, wrap_to) of a convolution of these operands."""
    if not isinstance(b, QArray):
        return result_types(a, b, pet)
    if pet is None:  # lax takes one kernel dtype: both promoted to it (as flax's Conv does)
        pet = formats.promoted(a.format_name, b.dtype.name)
    out = formats.dot_result(a.format_name, b.dtype.name, pet)
    if not out.xla_storable or out.is_low_precision or out.is_integer:
        raise ValueError(
            f"preferred_element_type: the result of a convolution with a QArray kernel must "
            f"be float32, bfloat16 or float16, got {out.name}"
        )
    return out.name, None


def conv_args(
    lhs: OperandLike,
    rhs: OperandLike | QArray,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: lax.ConvGeneralDilatedDimensionNumbers = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    *,
    target: targets.TargetLike = None,
    mode: str | None = None,
    lhs_format: FormatLike | None = None,
    rhs_format: FormatLike | None = None,
    out_sharding: Any = None,
) -> ConvArgs:
    """The one validator of an emulated ``conv_general_dilated`` call (arguments as
    :func:`emulate.conv_general_dilated`'s).

    Raises:
      TypeError: a QArray ``lhs`` (not built), an operand that is no array, a
        ``preferred_element_type`` that names no type, an integer result of a float
        operand, operands of different ranks (as lax); parameters as
        :func:`check_conv_params`.
      ValueError: operands of rank below 2 (3 with a QArray kernel),
        input features that do not match the kernel's times ``feature_group_count``, a
        format given for a QArray, a result XLA cannot hold, a QArray kernel's result
        other than float32, bfloat16 or float16; parameters as :func:`check_conv_params`;
        shapes ``lax.conv_general_dilated`` refuses otherwise (its error).
    """
    lhs, rhs = unprepared(lhs), unprepared(rhs)  # a prepared weight: the XLA route's read
    if isinstance(lhs, QArray):
        raise TypeError(
            "lhs: a QArray input is not built for convolutions (only QArray kernels, rhs); "
            "pass lhs.dequantize() or an array of a low-precision format"
        )
    pet = preferred(preferred_element_type)
    t = targets.current_target(target)
    m = targets.current_mode(mode)
    a = operand(lhs, lhs_format, arg="lhs")
    b = with_format(rhs, rhs_format, "rhs")
    where = describe(a, b, t)
    least = 3 if isinstance(b, QArray) else 2
    if len(a.shape) != len(b.shape):  # lax's exception type for it
        raise TypeError(
            f"lhs, rhs: convolution operands need the same rank, got {len(a.shape)} and "
            f"{len(b.shape)}; {where}"
        )
    if len(a.shape) < least:
        raise ValueError(
            f"lhs, rhs: convolution operands need the same rank, at least {least}; {where}"
        )
    dn = lax.conv_dimension_numbers(a.shape, b.shape, dimension_numbers)
    strides, pads, ld, rd = check_conv_params(
        len(a.shape) - 2,
        window_strides,
        padding,
        lhs_dilation,
        rhs_dilation,
        feature_group_count,
        batch_group_count,
        where=where,
    )
    in_l, in_r = a.shape[dn.lhs_spec[1]], b.shape[dn.rhs_spec[1]]
    if in_l != in_r * feature_group_count:
        raise ValueError(
            f"lhs, rhs: lhs has {in_l} input features, rhs expects {in_r} x "
            f"feature_group_count {feature_group_count}; {where}"
        )
    result, wrap_to = _conv_result(a, b, pet)
    params: dict[str, Any] = dict(
        window_strides=strides,
        padding=pads,
        lhs_dilation=ld,
        rhs_dilation=rd,
        dimension_numbers=dn,
        feature_group_count=int(feature_group_count),
        batch_group_count=int(batch_group_count),
    )
    out_shape = jax.eval_shape(  # lax's own shape rule, on float32 stand-ins
        lambda x, w: lax.conv_general_dilated(x, w, **params),
        *(jax.ShapeDtypeStruct(s, jnp.float32) for s in (a.shape, b.shape)),
    ).shape
    return ConvArgs(
        a,
        b,
        strides,
        pads,
        ld,
        rd,
        dn,
        int(feature_group_count),
        int(batch_group_count),
        precision_arg(precision),
        result,
        wrap_to,
        t,
        m,
        tuple(out_shape),
        out_sharding,
    )
