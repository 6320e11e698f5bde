"""A dot's arguments, checked once into a frozen record.

``dot_general``, ``matmul``, ``einsum``, ``scaled_matmul``, ``ragged_dot`` and the QArray
routes build a :class:`DotArgs` with :func:`dot_args` (``conv_general_dilated`` builds its
own record: :mod:`emulate.engine.conv_args`). As JAX's ``_dot_general_shape_rule`` does,
the validator refuses a malformed call before anything is traced and returns the call
normalized: operands as :class:`~emulate.engine.operands.Operand` or
:class:`~emulate.QArray`, dimension numbers as tuples of ints, K, the result type, the
precision (hashable), the target and the mode. A prepared weight
(:class:`emulate.engine.prepared.Prepared`) stays in the record as it was given, beside
its abstract view, which the checks read. The rest of the call reads the record and checks
nothing again.

Exception types: where ``jax.lax.dot_general`` refuses the same shapes, its type with
emulate's message (naming the operands and the target); emulate's own refusals as each
function lists.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, moved, targets
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
from emulate.engine.prepared import is_prepared, unprepared, view
from emulate.formats import FormatLike
from emulate.quantized.array import QArray

__all__ = [
    "DotArgs",
    "dot_args",
    "dot_dimension_numbers",
    "is_quantized",
    "matmul_operands",
    "precision_arg",
    "preferred",
    "result_types",
    "shape_of",
    "with_format",
]


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
      prepared: for each operand, the prepared weight it was given as
        (:class:`emulate.engine.prepared.Prepared`), or None; ``lhs`` / ``rhs`` are then
        its abstract view (shapes and dtypes of what it reads back as).
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
    prepared: tuple[Any, Any] = (None, None)

    @property
    def has_qarray(self) -> bool:
        return isinstance(self.lhs, QArray) or isinstance(self.rhs, QArray)

    @property
    def operands(self) -> tuple[Any, Any]:
        """``(lhs, rhs)`` as a kernel reads them: a prepared weight as it was given."""
        return tuple(  # type: ignore[return-value]
            v if p is None else p for v, p in zip((self.lhs, self.rhs), self.prepared)
        )

    def read_back(self) -> DotArgs:
        """The call as the XLA route takes it: each prepared weight read back
        (:func:`emulate.engine.prepared.unprepared`); the call itself if it has none."""
        if self.prepared == (None, None):
            return self
        lhs, rhs = (unprepared(v) for v in self.operands)
        return dataclasses.replace(self, lhs=lhs, rhs=rhs, prepared=(None, None))

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


def is_quantized(x: Any) -> bool:
    """Whether ``x`` is a QArray or a prepared weight (which reads back as a QArray or a
    weight's codes): an operand the front ends hand on as it is."""
    return isinstance(x, QArray) or is_prepared(x)


def with_format(x: OperandLike | QArray, fmt: FormatLike | None, arg: str) -> Operand | QArray:
    """A QArray as it is (its codes carry their format), a prepared weight as its abstract
    view (:func:`emulate.engine.prepared.view`), anything else as an Operand.

    Raises:
      ValueError: a format given for a QArray or a prepared weight (``{arg}_format``).
      TypeError, ValueError: as :func:`emulate.engine.operands.operand`.
    """
    if not isinstance(x, QArray) and not is_prepared(x):
        return operand(x, fmt, arg=arg)
    if fmt is not None:
        what = "QArray" if isinstance(x, QArray) else "prepared weight"
        raise ValueError(
            f"{arg}_format: a {what} carries its format ({x.format_name}); pass "
            f"{arg}_format only with uint8 codes, got {arg}_format={fmt!r}"
        )
    return view(x)


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


def result_types(
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
    :func:`emulate.dot_general`'s). An operand may be a prepared weight
    (:class:`emulate.engine.prepared.Prepared`): the record keeps it
    (:attr:`DotArgs.prepared`) and checks its view.

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
    result, wrap_to = result_types(a, b, pet)
    prepared = (lhs if is_prepared(lhs) else None, rhs if is_prepared(rhs) else None)
    return DotArgs(
        a, b, dn, precision_arg(precision), result, wrap_to, t, m, out_sharding, prepared
    )


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


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
