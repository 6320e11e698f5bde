"""The contraction of decoded operands, whole or in exact K-chunks, rounded once.

A plan's compute types reach one ``lax.dot_general`` with an int32 or f32 accumulator.
Where the plan has a K-chunk (exact-class pairs whose partial sums would leave the range
that the accumulator holds exactly), K is cut into chunks, every chunk sum is exact, and
the chunk sums are added exactly in int32 limbs (:mod:`emulate.numerics.accumulate`)
before the single rounding into the result type.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from emulate import formats
from emulate.engine.layout import DimensionNumbers, dot_general, to_bfk
from emulate.engine.operands import Precision
from emulate.numerics import accumulate
from emulate.planning.plan import Plan

__all__ = ["check_k", "combine_chunk_sums", "contract_decoded", "finish"]


def check_k(p: Plan, k: int) -> None:
    """Raise ValueError when a contraction of length ``k`` exceeds ``p.k_limit``."""
    if p.k_limit is not None and k > p.k_limit:
        raise ValueError(
            f"lhs, rhs: a contraction of K = {k} exceeds the {p.k_limit} that the exact "
            f"{p.lhs} x {p.rhs} plan on {p.target} combines exactly; split the contraction"
        )


def finish(p: Plan, acc: jax.Array) -> jax.Array:
    """Round an unchunked accumulator once into ``p.out``."""
    if acc.dtype == jnp.int32 and not formats.get(p.out).is_integer:
        # An exact int32 sum (in quanta): via limbs, so a narrow result rounds only once.
        return accumulate.round_limbs(*accumulate.split(acc), p.lhs_scale + p.rhs_scale, p.out)
    return accumulate.round_accumulator(acc, p.out)


def combine_chunk_sums(p: Plan, partials: jax.Array, axis: int) -> jax.Array:
    """Add exact chunk sums stacked along ``axis`` exactly and round once into ``p.out``.

    f32 chunk sums are exact multiples of the quantum ``2**-(lhs_scale + rhs_scale)``: they
    are scaled to integers (exactly) and combined in int32 limbs like int32 ones.
    """
    scale = p.lhs_scale + p.rhs_scale
    if partials.dtype != jnp.int32:
        partials = (partials * jnp.float32(2.0**scale)).astype(jnp.int32)
    hi, lo = accumulate.combine_chunks(partials, axis=axis)
    return accumulate.round_limbs(hi, lo, scale, p.out)


def contract_decoded(
    p: Plan,
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: DimensionNumbers,
    precision: Precision,
) -> jax.Array:
    """Contract operands decoded to the plan's compute types and round once into ``p.out``.

    Raises:
      ValueError: the contraction is longer than ``p.k_limit``.
    """
    (lc, rc), (lb, rb) = dimension_numbers
    acc_dtype = jnp.dtype(p.accumulator)
    k = math.prod(lhs.shape[d] for d in lc)
    check_k(p, k)
    if p.k_chunk is None or k <= p.k_chunk:
        acc = dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type=acc_dtype)
        return finish(p, acc)
    lhs3 = to_bfk(lhs, lb, lc)
    rhs3 = to_bfk(rhs, rb, rc)
    nb = len(lb)
    chunk = p.k_chunk
    pad = (-k) % chunk
    if pad:
        lhs3 = jnp.pad(lhs3, [(0, 0)] * (lhs3.ndim - 1) + [(0, pad)])
        rhs3 = jnp.pad(rhs3, [(0, 0)] * (rhs3.ndim - 1) + [(0, pad)])
    n_chunks = (k + pad) // chunk
    lhs4 = lhs3.reshape(lhs3.shape[:-1] + (n_chunks, chunk))
    rhs4 = rhs3.reshape(rhs3.shape[:-1] + (n_chunks, chunk))
    batch_l = tuple(range(nb)) + (lhs4.ndim - 2,)
    batch_r = tuple(range(nb)) + (rhs4.ndim - 2,)
    dn = ((lhs4.ndim - 1,), (rhs4.ndim - 1,)), (batch_l, batch_r)
    partial = lax.dot_general(lhs4, rhs4, dn, precision, preferred_element_type=acc_dtype)
    return combine_chunk_sums(p, partial, axis=nb)
