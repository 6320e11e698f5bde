"""Drop-in ``ragged_dot`` and ``ragged_dot_general``: grouped matmuls (mixture-of-experts
layers) of any operand pair on any target.

``lax.ragged_dot(lhs, rhs, group_sizes)`` multiplies the rows of ``lhs`` (m, k), sorted by
group, each by its group's matrix of ``rhs`` (g, k, n): rows ``0 .. group_sizes[0] - 1`` by
``rhs[0]``, the next ``group_sizes[1]`` rows by ``rhs[1]``, and so on. Here ``rhs`` may be a
stacked :class:`emulate.QArray` (one block per expert along its leading axis: what
``emulate.quantize`` makes of a 3-D weight, and what the importers load for expert
tensors) or an array of a low-precision format, and ``lhs`` any operand
:func:`emulate.dot_general` takes.

The XLA route: every row is contracted with every group's matrix by
:func:`emulate.dot_general` (its plan, its numerics contract), and each row then takes
its own group's result (a gather, no arithmetic): each output row is bit for bit the
``dot_general`` of that row with its group's matrix, so the contract is
``dot_general``'s, per group (exact for integer pairs; bounded by ``gamma_K`` in mode
"fast" with K the contraction, not ``g * K``), and a NaN or Inf in another group's
matrix does not reach the row. The dense product costs ``g`` times the ragged flops, as
JAX's own CPU lowering does.
"""

from __future__ import annotations

from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import routing, targets
from emulate.dot import dot_general
from emulate.engine import front, sites
from emulate.engine.operands import Operand, OperandLike, Precision
from emulate.engine.plain import plain_ragged
from emulate.engine.ragged_args import BASIC, RaggedArgs, ragged_args
from emulate.formats import FormatLike
from emulate.quantized.array import QArray
from emulate.routing.query import ragged_dot_route

__all__ = ["ragged_dot", "ragged_dot_general", "ragged_dot_route"]


def ragged_dot(
    lhs: OperandLike | QArray,
    rhs: OperandLike | QArray,
    group_sizes: Any,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    group_offset: Any = None,
    *,
    target: targets.TargetLike = None,
    mode: str | None = None,
    lhs_format: FormatLike | None = None,
    rhs_format: FormatLike | None = None,
    out_sharding: Any = None,
) -> jax.Array:
    """``jax.lax.ragged_dot`` for operands of any format, on any target.

    Args:
      lhs: (m, k), rows sorted by group: an array of any registered format, ``uint8``
        codes with ``lhs_format``, or a Packed array.
      rhs: (g, k, n): the same, or a QArray (a stacked expert weight).
      group_sizes: (g,) integers >= 0, the rows of each group. Any total, as in JAX:
        fewer than m leave the rows after the last group zero, more cut the groups at
        the last row (:mod:`emulate.group_sizes`).
      precision, preferred_element_type: as in ``lax.ragged_dot``.
      group_offset: None (JAX implements nothing else either).
      target, mode, lhs_format, rhs_format: as in :func:`emulate.dot_general`.
      out_sharding: None (not built).

    Returns:
      (m, n) of the type ``lax.ragged_dot`` returns for the operand types; each row the
      :func:`emulate.dot_general` of that row with its group's matrix (see the module
      docstring). Differentiable with respect to ``lhs`` (and a float ``rhs``) as
      ``dot_general`` is.

    Raises:
      TypeError, ValueError: as :func:`ragged_dot_general`.
      NotImplementedError: a ``group_offset`` or an ``out_sharding``.
    """
    return ragged_dot_general(
        lhs,
        rhs,
        group_sizes,
        BASIC,
        precision,
        preferred_element_type,
        group_offset,
        target=target,
        mode=mode,
        lhs_format=lhs_format,
        rhs_format=rhs_format,
        out_sharding=out_sharding,
    )


def ragged_dot_general(
    lhs: OperandLike | QArray,
    rhs: OperandLike | QArray,
    group_sizes: Any,
    ragged_dot_dimension_numbers: lax.RaggedDotDimensionNumbers,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    group_offset: Any = None,
    *,
    target: targets.TargetLike = None,
    mode: str | None = None,
    lhs_format: FormatLike | None = None,
    rhs_format: FormatLike | None = None,
    out_sharding: Any = None,
) -> jax.Array:
    """``jax.lax.ragged_dot_general`` for operands of any format, on any target: its three
    modes (the lhs ragged dimension a free, a contracting or a batch dimension; see
    :mod:`emulate.engine.ragged_args`), batch dimensions and a ``group_sizes`` of shape
    ``(g,)`` or JAX's ``[b..., x..., g]``.

    A call emulate has nothing to add to (plain arrays whose pair the target runs as it
    is, mode "fast": :func:`emulate.dot_general`'s rule) goes to ``lax.ragged_dot_general``
    unchanged, after the group-size check below. Otherwise each group's contraction is
    :func:`emulate.dot_general`'s (its plan and numerics); in mode "contracting" the lhs
    entries outside a group are zeros in that group's sum, as in JAX; in mode "batch" the
    group sizes are unused, as in JAX.

    Raises:
      TypeError: a ``group_sizes`` that is not an integer array of rank >= 1; shapes and
        dimension numbers ``lax.ragged_dot_general`` refuses (its message and type, naming
        the arguments); a QArray lhs with a ragged contracting dimension; the operand
        refusals of :func:`emulate.dot_general`.
      ValueError: concrete group sizes that are negative (naming ``group_sizes``; any
        total is accepted, as in JAX: :mod:`emulate.group_sizes`; traced sizes are not
        checked); the value refusals of :func:`emulate.dot_general`; under
        ``emulate.use_route("kernel")``, a call ``emulate.pallas.ragged_dot`` cannot take,
        naming the argument and the kernel's reason.
      NotImplementedError: a ``group_offset`` (not built; ``lax.ragged_dot_general`` of
        jax 0.10.2 fails on one too, with a TypeError: it hashes the array) or an
        ``out_sharding``.
    """
    if group_offset is not None:
        raise NotImplementedError(
            "group_offset: not supported (jax.lax.ragged_dot_general fails on it too); pass None"
        )
    if out_sharding is not None:
        raise NotImplementedError(
            "out_sharding: not built for emulate.ragged_dot; pass None and shard the result"
        )
    return front.call(_DOOR, locals())


def _emulated_ragged(call: RaggedArgs) -> jax.Array:
    """Run a validated call by the route :func:`emulate.routing.choose` gives it: the
    grouped kernel (:func:`emulate.routing.run`), or the XLA route on the call read back."""
    op = routing.ragged_op(call, _xla_route)
    route = routing.choose(call, op)
    with sites.scope(routing.site_tag(call, op, route) or call.tag()):
        if op is not None and route is not None and route.kernel:
            return routing.run(call, op, route)
        return _xla_route(call.read_back())


_DOOR = front.FrontDoor(plain_ragged, ragged_args, _emulated_ragged)


def _xla_route(call: RaggedArgs) -> jax.Array:
    """The XLA route of a validated call (module docstring), in its mode; each group's
    dot on the XLA route (the route of the call is decided)."""
    with routing.use_route("xla"):
        if call.mode == "noncontracting":
            return _noncontracting(call)
        if call.mode == "contracting":
            return _contracting(call)
        return _dot(call, call.dot.lhs, call.dot.dimension_numbers)


def _dot(call: RaggedArgs, lhs: Operand | QArray, dn: Any) -> jax.Array:
    d = call.dot
    return dot_general(
        lhs,
        d.rhs,
        dn,
        d.precision,
        call.preferred,
        target=d.target,
        mode=d.mode,
    )


def _group_of_row(call: RaggedArgs, rows: int) -> jax.Array:
    """int32 ``[prefix..., rows]``: the group of each index along the ragged dimension,
    ``g`` for an index after the last group (``#{j: end_j <= i}``, JAX's
    ``start_j <= i < end_j`` for sizes >= 0)."""
    gs = jnp.asarray(call.group_sizes).astype(jnp.int32)
    ends = jnp.cumsum(gs, axis=-1)
    index = jnp.arange(rows, dtype=jnp.int32)
    return jnp.sum(ends[..., None, :] <= index[:, None], axis=-1, dtype=jnp.int32)


def _noncontracting(call: RaggedArgs) -> jax.Array:
    """Every row against every group (emulate's dot), then each row's own group's result."""
    d = call.dot
    (lc, rc), (lb, rb) = d.dimension_numbers
    lf = [i for i in range(len(d.lhs.shape)) if i not in lc and i not in lb]
    rf = [i for i in range(len(d.rhs.shape)) if i not in rc and i not in rb]
    dense = _dot(call, d.lhs, d.dimension_numbers)  # [b..., lf..., rf...], g among rf
    at = len(lb) + len(lf)
    dense = jnp.moveaxis(dense, at + rf.index(cast(int, call.rhs_group)), at)
    gid = _group_of_row(call, d.lhs.shape[call.lhs_ragged])  # [prefix..., rows]
    before = len(lb) + lf.index(call.lhs_ragged)  # the prefix's length when gs has rank > 1
    lead = before - (gid.ndim - 1)
    after = len(lf) - lf.index(call.lhs_ragged) - 1
    gid = gid.reshape((1,) * lead + gid.shape + (1,) * after + (1,) * (len(rf)))
    gid = jnp.broadcast_to(gid, dense.shape[:at] + (1,) * len(rf))
    out = jnp.take_along_axis(dense, gid, axis=at, mode="fill", fill_value=0)
    return jnp.squeeze(out, axis=at)


def _contracting(call: RaggedArgs) -> jax.Array:
    """One partial sum per group: lhs with the entries outside the group zeroed (a new
    leading axis of ``g`` copies), contracted as the call's dot, the group axis first."""
    d = call.dot
    op = d.lhs
    assert isinstance(op, Operand)  # ragged_args refuses a QArray lhs in this mode
    (lc, rc), (lb, rb) = d.dimension_numbers
    values = op.unpacked()  # codes of a low-precision format: code 0 is zero
    rows = values.shape[call.lhs_ragged]
    gid = _group_of_row(call, rows)  # [prefix..., rows]
    g = call.groups
    # gid's axes are lhs's prefix dimensions then the ragged one: place them in lhs's order.
    axes = list(call.prefix[len(call.prefix) - (gid.ndim - 1) :]) + [call.lhs_ragged]
    shape = [1] * values.ndim
    for pos, dim in enumerate(axes):
        shape[dim] = gid.shape[pos]
    order = [int(i) for i in np.argsort(axes)]
    gid = jnp.transpose(gid, order).reshape(shape)
    member = gid[None] == jnp.arange(g, dtype=jnp.int32).reshape((g,) + (1,) * values.ndim)
    masked = jnp.where(member, values[None], jnp.zeros((), values.dtype))
    lhs = Operand(masked, op.format_name)
    shift = tuple(i + 1 for i in lc), tuple(i + 1 for i in lb)
    out = _dot(call, lhs, ((shift[0], rc), (shift[1], rb)))  # [b..., g, lf..., rf...]
    return jnp.moveaxis(out, len(lb), 0)
