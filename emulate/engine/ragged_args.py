"""A ``ragged_dot_general`` call, checked once into a frozen record.

:func:`ragged_args` is the one validator of :func:`emulate.ragged_dot` and
:func:`emulate.ragged_dot_general`, as :func:`emulate.engine.args.dot_args` is of
``dot_general``: it refuses a malformed call before anything is traced, with the exception
type ``jax.lax.ragged_dot_general`` raises for the same shapes (its shape rule runs on
float32 stand-ins) and a message naming the argument, and returns the call normalized. The
operands, their result type, target and mode are those of the call's ``dot_general``
(``lhs`` and ``rhs`` with the dimension numbers' ``dot_dimension_numbers``; the rhs group
dimension is one of its free dimensions), checked by :func:`~emulate.engine.args.dot_args`.

The three modes are JAX's (``jax._src.lax.lax.RaggedDotMode``): the lhs ragged dimension
is a free dimension of lhs ("noncontracting": ``[b,m,k] x [g,b,k,n] -> [b,m,n]``, rows
sorted by group, each row multiplied by its group's rhs), a contracting one
("contracting": ``[b,m,k] x [b,k,n] -> [g,b,m,n]``, one partial sum per group) or a batch
dimension ("batch": a plain ``dot_general``, group sizes unused, as in JAX).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import targets
from emulate.engine import sites
from emulate.engine.args import DotArgs, dot_args, shape_of
from emulate.engine.operands import OperandLike, Precision, describe, refuse_non_array
from emulate.engine.passthrough import is_plain
from emulate.engine.prepared import view
from emulate.formats import FormatLike
from emulate.group_sizes import as_group_sizes, check_group_sizes
from emulate.numerics.storage import is_array
from emulate.quantized.array import QArray

__all__ = ["BASIC", "MODES", "RaggedArgs", "ragged_args", "ragged_shape"]

#: ``lax.ragged_dot``'s dimension numbers: ``(m, k) x (g, k, n) -> (m, n)``.
BASIC = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (1,)), ((), ())),
    lhs_ragged_dimensions=(0,),
    rhs_group_dimensions=(0,),
)

#: The modes, by where the lhs ragged dimension is (see the module docstring).
MODES = ("noncontracting", "contracting", "batch")


@dataclasses.dataclass(frozen=True)
class RaggedArgs:
    """One validated ``ragged_dot_general`` call.

    Attributes:
      dot: the call's ``dot_general`` (operands, dimension numbers, result, target, mode).
      group_sizes: int array, shape ``(g,)`` or JAX's ``[b..., x..., g]``; as given.
      mode: one of :data:`MODES`.
      lhs_ragged: the lhs ragged dimension.
      rhs_group: the rhs group dimension ("noncontracting"), None otherwise.
      prefix: the lhs dimensions a ``group_sizes`` of rank > 1 is indexed by, in order
        (JAX's ``_ragged_dot_prefix_dims``).
      out_shape: the result's shape (JAX's shape rule).
      preferred: ``preferred_element_type`` as given.
    """

    dot: DotArgs
    group_sizes: Any
    mode: str
    lhs_ragged: int
    rhs_group: int | None
    prefix: tuple[int, ...]
    out_shape: tuple[int, ...]
    preferred: Any = None

    @property
    def target(self) -> targets.Target:
        return self.dot.target

    def read_back(self) -> RaggedArgs:
        """The call as the XLA route takes it (:meth:`DotArgs.read_back`)."""
        dot = self.dot.read_back()
        return self if dot is self.dot else dataclasses.replace(self, dot=dot)

    @property
    def groups(self) -> int:
        return int(self.group_sizes.shape[-1])

    def tag(self) -> sites.SiteTag:
        """The site record of this call (:mod:`emulate.engine.sites`); flops of the
        ragged product (each row against its own group), not of the dense one."""
        per_group = self.groups if self.mode == "noncontracting" else 1
        tag = self.dot.tag()
        return dataclasses.replace(tag, op="ragged_dot_general", flops=tag.flops // per_group)


def _mode(rdn: lax.RaggedDotDimensionNumbers, lhs_rank: int) -> tuple[str, int, tuple[int, ...]]:
    """(mode, lhs ragged dimension, the prefix dimensions of group_sizes)."""
    (lc, _), (lb, _) = rdn.dot_dimension_numbers
    ragged = rdn.lhs_ragged_dimensions[0]
    free = [d for d in range(lhs_rank) if d not in lc and d not in lb]
    if ragged in free:
        return "noncontracting", ragged, (*lb, *free[: free.index(ragged)])
    if ragged in lc:
        return "contracting", ragged, (*lb, *lc[: list(lc).index(ragged)])
    return "batch", ragged, tuple(lb[: list(lb).index(ragged)])


def ragged_shape(lhs_shape, rhs_shape, gs_shape, rdn) -> tuple[int, ...]:
    """The result shape by ``lax.ragged_dot_general``'s own shape rule (float32 stand-ins);
    its refusals re-raised with the same type, naming the arguments.

    Raises:
      TypeError, ValueError: as ``lax.ragged_dot_general`` for these shapes.
    """
    f32 = jnp.float32
    try:
        out = jax.eval_shape(
            lambda x, y, g: lax.ragged_dot_general(x, y, g, rdn),
            jax.ShapeDtypeStruct(tuple(lhs_shape), f32),
            jax.ShapeDtypeStruct(tuple(rhs_shape), f32),
            jax.ShapeDtypeStruct(tuple(gs_shape), jnp.int32),
        )
    except (TypeError, ValueError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(
            f"lhs, rhs, group_sizes, ragged_dot_dimension_numbers: {e} (lhs shape "
            f"{tuple(lhs_shape)}, rhs shape {tuple(rhs_shape)}, group_sizes shape "
            f"{tuple(gs_shape)})"
        ) from None
    return tuple(out.shape)


def ragged_args(
    lhs: OperandLike | QArray,
    rhs: OperandLike | QArray,
    group_sizes: Any,
    ragged_dot_dimension_numbers: lax.RaggedDotDimensionNumbers,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    *,
    target: targets.TargetLike = None,
    mode: str | None = None,
    lhs_format: FormatLike | None = None,
    rhs_format: FormatLike | None = None,
) -> RaggedArgs:
    """The one validator of an emulated ``ragged_dot_general`` call (arguments as
    :func:`emulate.ragged_dot_general`'s). Prepared experts
    (:func:`emulate.pallas.prepare_experts`) stay in the record as
    :func:`~emulate.engine.args.dot_args` keeps a prepared weight.

    Raises:
      TypeError: ``ragged_dot_dimension_numbers`` that is no
        ``lax.RaggedDotDimensionNumbers``; a ``group_sizes`` that is not an integer array
        of rank >= 1; shapes and dimension numbers ``lax.ragged_dot_general`` refuses
        (its message, naming the arguments); a QArray lhs outside mode "noncontracting"
        or "batch"; the operand refusals of :func:`~emulate.engine.args.dot_args`.
      ValueError: concrete group sizes that are negative
        (:func:`emulate.group_sizes.check_group_sizes`); the value refusals of
        ``dot_args``.
    """
    rdn = ragged_dot_dimension_numbers
    if not isinstance(rdn, lax.RaggedDotDimensionNumbers):
        raise TypeError(
            "ragged_dot_dimension_numbers: expected a jax.lax.RaggedDotDimensionNumbers, got "
            f"{type(rdn).__name__} {rdn!r}"
        )
    for arg, x in (("lhs", lhs), ("rhs", rhs)):
        if is_plain(x) and not is_array(x):
            refuse_non_array(x, arg)  # before the shapes, which would blame the dimensions
    gs = as_group_sizes(group_sizes)
    lhs_shape, rhs_shape = (shape_of(view(x)) for x in (lhs, rhs))
    out_shape = ragged_shape(lhs_shape, rhs_shape, np.shape(gs), rdn)
    call = dot_args(
        lhs,
        rhs,
        rdn.dot_dimension_numbers,
        precision,
        preferred_element_type,
        target=target,
        mode=mode,
        lhs_format=lhs_format,
        rhs_format=rhs_format,
    )
    m, ragged, prefix = _mode(rdn, len(call.lhs.shape))
    if m == "contracting" and isinstance(call.lhs, QArray):
        raise TypeError(
            "lhs: a QArray lhs is not built for a ragged contracting dimension (its rows "
            "are masked per group); pass lhs.dequantize() or an array; "
            + describe(call.lhs, call.rhs, call.target)
        )
    check_group_sizes(gs)
    rhs_group = rdn.rhs_group_dimensions[0] if m == "noncontracting" else None
    return RaggedArgs(call, gs, m, ragged, rhs_group, prefix, out_shape, preferred_element_type)
