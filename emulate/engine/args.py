"""Each front end's arguments, checked once into a frozen record.

``dot_general``, ``matmul``, ``einsum``, ``scaled_matmul`` and the QArray routes build a
:class:`DotArgs` with :func:`dot_args`; ``conv_general_dilated`` builds a :class:`ConvArgs`
with :func:`conv_args`. As JAX's ``_dot_general_shape_rule`` and
``_conv_general_dilated_shape_rule`` do, each validator refuses a malformed call before
anything is traced and returns the call normalized: operands as
:class:`~emulate.engine.operands.Operand` or :class:`~emulate.QArray`, dimension numbers
as tuples of ints, K, the result type, the precision (hashable), the target and the mode.
The rest of the call reads the record and checks nothing again.

Exception types: where ``jax.lax.dot_general`` refuses the same shapes, its type with
emulate's message (naming the operands and the target); convolution parameters with
``lax.conv_general_dilated``'s types; emulate's own refusals as each function lists.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.engine import sites
from emulate.engine.layout import DimensionNumbers, normalize_dimension_numbers
from emulate.engine.operands import (
    Operand,
    OperandLike,
    Precision,
    describe,
    operand,
)
from emulate.engine.passthrough import unplanned_integer_result
from emulate.formats import FormatLike
from emulate.quantized.array import QArray

__all__ = [
    "ConvArgs",
    "DotArgs",
    "PaddingError",
    "check_conv_params",
    "conv_args",
    "dot_args",
    "dot_dimension_numbers",
    "matmul_operands",
    "precision_arg",
    "preferred",
    "shape_of",
    "with_format",
]


class PaddingError(ValueError, RuntimeError):
    """An unknown padding string: a ValueError, and the RuntimeError ``lax`` raises for it."""


@dataclasses.dataclass(frozen=True)
class DotArgs:
    """One validated ``dot_general`` call.

    Attributes:
      lhs, rhs: the operands (an :class:`emulate.QArray` as it is).
      dimension_numbers: ``((lc, rc), (lb, rb))``, tuples of ints checked against the shapes.
      precision: as given, a list made a tuple.
      result: the name of the type the contraction returns: ``lax.dot_general``'s rule
        (:func:`emulate.formats.result_format` for plain operands), ``int32`` where the
        call's result is :attr:`wrap_to`.
      wrap_to: int16, uint16 or uint32 asked of integer operands: the int32 sum wrapped
        into it (as XLA's integer dot wraps); None otherwise.
      target, mode: resolved (the current ones where the call gave none).
      out_sharding: as given to the front end.
    """

    lhs: Operand | QArray
    rhs: Operand | QArray
    dimension_numbers: DimensionNumbers
    precision: Precision
    result: str
    wrap_to: str | None
    target: targets.Target
    mode: str
    out_sharding: Any = None

    @property
    def has_qarray(self) -> bool:
        return isinstance(self.lhs, QArray) or isinstance(self.rhs, QArray)

    @property
    def k(self) -> int:
        """The contraction length: the product of lhs's contracting dimensions."""
        return math.prod(self.lhs.shape[d] for d in self.dimension_numbers[0][0])

    def tag(self) -> sites.SiteTag:
        """The site record of this call (:mod:`emulate.engine.sites`)."""
        a, b = self.lhs, self.rhs
        return sites.SiteTag(
            "dot_general",
            sites.operand_text(a.format_name, a.shape, a if isinstance(a, QArray) else None),
            sites.operand_text(b.format_name, b.shape, b if isinstance(b, QArray) else None),
            self.result,
            self.target.name,
            self.mode,
            sites.dot_flops(a.shape, b.shape, self.dimension_numbers),
        )


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


def preferred(preferred_element_type: FormatLike | None) -> str | None:
    """A front end's ``preferred_element_type`` as a type name: a format's, or one of JAX's
    own types emulate has no format for (int16, complex64, float64), which the front ends
    hand to JAX or wrap into; None for None.

    Raises:
      TypeError: it names no type at all (``"junk"``, ``5``), as ``lax.dot_general``.
    """
    if preferred_element_type is None:
        return None
    try:
        return formats.preferred_format(preferred_element_type).name
    except ValueError:  # a dtype emulate has no format for
        return np.dtype(preferred_element_type).name


def precision_arg(precision: Any) -> Precision:
    """A front end's ``precision`` as the front ends pass it on: a list of two (which
    ``lax.dot_general`` documents and whose hash JAX's caches need) made a tuple; anything
    else as given, for ``lax`` to read and refuse as it does."""
    if isinstance(precision, list) and len(precision) == 2:
        return cast(Precision, tuple(precision))
    return cast(Precision, precision)


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of an array, Operand, QArray or Python scalar."""
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(x))


def with_format(x: OperandLike | QArray, fmt: FormatLike | None, arg: str) -> Operand | QArray:
    """A QArray as it is (its codes carry their format), anything else as an Operand.

    Raises:
      ValueError: a format given for a QArray (``{arg}_format``).
      TypeError, ValueError: as :func:`emulate.engine.operands.operand`.
    """
    if not isinstance(x, QArray):
        return operand(x, fmt, arg=arg)
    if fmt is not None:
        raise ValueError(
            f"{arg}_format: a QArray carries its format ({x.format_name}); pass "
            f"{arg}_format only with uint8 codes, got {arg}_format={fmt!r}"
        )
    return x


def _default_dimension_numbers(lhs: tuple[int, ...], rhs: tuple[int, ...]) -> DimensionNumbers:
    """``lax.dot``'s reading of ``dimension_numbers=None``: a plain matrix or vector
    product (ValueError otherwise, as lax)."""
    if 1 <= len(lhs) <= 2 and 1 <= len(rhs) <= 2 and lhs[-1] == rhs[0]:
        return ((len(lhs) - 1,), (0,)), ((), ())
    raise ValueError(
        "dimension_numbers: None stands for a plain matrix-matrix, matrix-vector or "
        f"vector-vector product (as in lax.dot); pass them for shapes {lhs} and {rhs}"
    )


def _raise_as_jax(err: Exception, jax_fn: Callable[..., Any], *shapes: Sequence[int]) -> None:
    """Raise ``err``'s message with the exception type JAX raises for the same shapes
    (float32 stand-ins); return if JAX accepts them or raises the same type."""
    try:
        jax.eval_shape(jax_fn, *(jax.ShapeDtypeStruct(tuple(s), jnp.float32) for s in shapes))
    except (TypeError, ValueError) as jax_err:
        if type(jax_err) is not type(err):
            kind = TypeError if isinstance(jax_err, TypeError) else ValueError
            raise kind(str(err)) from None


def dot_dimension_numbers(
    dimension_numbers: lax.DotDimensionNumbers | None,
    lhs_shape: Sequence[int],
    rhs_shape: Sequence[int],
    where: str,
) -> DimensionNumbers:
    """``dimension_numbers`` (None: ``lax.dot``'s product) as tuples of ints, checked
    against the shapes; ``where`` ends the messages.

    Raises:
      TypeError, ValueError: as :func:`emulate.engine.layout.normalize_dimension_numbers`
        words them, with the type ``lax.dot_general`` raises for the same shapes.
    """
    ls, rs = tuple(lhs_shape), tuple(rhs_shape)
    if dimension_numbers is None:
        return _default_dimension_numbers(ls, rs)
    try:
        return normalize_dimension_numbers(dimension_numbers, ls, rs, where)
    except (TypeError, ValueError) as e:
        _raise_as_jax(e, lambda x, y: lax.dot_general(x, y, dimension_numbers), ls, rs)
        raise


def _dot_result(
    a: Operand | QArray, b: Operand | QArray, pet: str | None
) -> tuple[str, str | None]:
    """(result, wrap_to) of a dot of these operands; the refusals of :func:`dot_args`."""
    if isinstance(a, QArray) or isinstance(b, QArray):
        la, lb = (x.dtype.name if isinstance(x, QArray) else x.format_name for x in (a, b))
        out = formats.dot_result(la, lb, pet)
        if not out.xla_storable or out.is_low_precision:
            raise ValueError(
                f"preferred_element_type: the result of a QArray matmul must be float32, "
                f"bfloat16, float16 or int32, got {out.name}"
            )
        return out.name, None
    wrap = unplanned_integer_result(pet, a, b)
    out = formats.result_format(a.format, b.format, "int32" if wrap is not None else pet)
    if not out.xla_storable:
        raise ValueError(
            f"preferred_element_type: the result type would be {out.name}, which XLA cannot "
            f"hold; pass {'a wider ' if pet else ''}preferred_element_type (e.g. jnp.float32 "
            "or jnp.bfloat16)"
        )
    return out.name, None if wrap is None else wrap.name


def dot_args(
    lhs: OperandLike | QArray,
    rhs: OperandLike | QArray,
    dimension_numbers: lax.DotDimensionNumbers | None,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    *,
    target: targets.TargetLike = None,
    mode: str | None = None,
    lhs_format: FormatLike | None = None,
    rhs_format: FormatLike | None = None,
    out_sharding: Any = None,
) -> DotArgs:
    """The one validator of an emulated ``dot_general`` call (arguments as
    :func:`emulate.dot_general`'s).

    Raises:
      TypeError: an operand that is no array (:func:`~emulate.engine.operands.operand`),
        a ``preferred_element_type`` that names no type, operand types ``lax`` rejects
        together, an integer result of a float operand (plain operands; a QArray matmul
        converts toward zero as ``lax`` does), dimension numbers as ``lax`` refuses them.
      ValueError: an unknown target or mode, a format given for a QArray, a result XLA
        cannot hold (float6), a QArray matmul result other than float32, bfloat16,
        float16 or int32, dimension numbers as ``lax`` refuses them.
    """
    pet = preferred(preferred_element_type)
    t = targets.current_target(target)
    m = targets.current_mode(mode)
    a, b = with_format(lhs, lhs_format, "lhs"), with_format(rhs, rhs_format, "rhs")
    dn = dot_dimension_numbers(dimension_numbers, a.shape, b.shape, describe(a, b, t))
    result, wrap_to = _dot_result(a, b, pet)
    return DotArgs(a, b, dn, precision_arg(precision), result, wrap_to, t, m, out_sharding)


def matmul_operands(
    a: OperandLike | QArray,
    b: OperandLike | QArray,
    a_format: FormatLike | None,
    b_format: FormatLike | None,
) -> tuple[Operand | QArray, Operand | QArray]:
    """``matmul``'s operands (Operands, QArrays as they are), their shapes checked as
    ``jnp.matmul`` checks them: a 1-D operand is a row (``a``) or a column (``b``), ``a``'s
    last dimension is contracted with ``b``'s second to last, the batch dimensions
    broadcast. A QArray operand is not broadcast: equal batch dimensions, or a 1-D or 2-D
    operand.

    Raises:
      ValueError, TypeError: emulate's message with the type ``jnp.matmul`` raises for the
        same shapes (an operand of no dimensions, sizes that do not match, batch
        dimensions that do not broadcast); ValueError: a QArray beside batch dimensions
        that differ, a format given for a QArray.
    """
    x, y = with_format(a, a_format, "a"), with_format(b, b_format, "b")
    xs, ys = tuple(x.shape), tuple(y.shape)
    err = _matmul_shape_error(x, y)
    if err is not None:
        _raise_as_jax(err, jnp.matmul, xs, ys)
        raise err
    return x, y


def _matmul_shape_error(x: Operand | QArray, y: Operand | QArray) -> ValueError | None:
    xs, ys = tuple(x.shape), tuple(y.shape)
    if len(xs) == 0 or len(ys) == 0:
        return ValueError(
            f"a, b: matmul needs operands of at least one dimension, got shapes {xs} and {ys}"
        )
    xm = (1, *xs) if len(xs) == 1 else xs
    ym = (*ys, 1) if len(ys) == 1 else ys
    if xm[-1] != ym[-2]:
        return ValueError(
            f"a, b: matmul contracts a's last dimension ({xm[-1]}) with b's second to "
            f"last ({ym[-2]}); a {x.format_name}{list(xs)}, b {y.format_name}{list(ys)}"
        )
    qarray = isinstance(x, QArray) or isinstance(y, QArray)
    if qarray and len(xs) > 2 and len(ys) > 2 and xs[:-2] != ys[:-2]:
        return ValueError(
            f"a, b: matmul of a QArray needs equal batch dimensions or a 1-D/2-D operand, "
            f"got shapes {xs} and {ys}"
        )
    try:
        np.broadcast_shapes(xm[:-2], ym[:-2])
    except ValueError:
        return ValueError(f"a, b: batch dimensions {xm[:-2]} and {ym[:-2]} do not broadcast")
    return None


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
        return _dot_result(a, b, pet)
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
