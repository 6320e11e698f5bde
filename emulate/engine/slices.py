"""Exponent slices for mode "exact": an operand cut into arrays of small integers that,
each scaled by its slice's power of two, add up to it exactly (:mod:`emulate.engine.exact`
multiplies them pairwise).

The slice makers return the slices ``which`` (indices, lowest first) stacked along a new
axis ``at`` of the values' shape, built by broadcasting the values against per-slice
constants. The larger operand is sliced one slice per dot (``which`` of length 1), so
that XLA fuses the slicing into that dot's operand and no slice of it is written out.
:class:`Side` is one operand in canonical layout with its slice makers: static (the
low-precision formats) or per row (the wide formats, in blocks below each row's cut).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate.numerics.bits import split_f32
from emulate.planning.slicing import Slicing

__all__ = ["ALL_BITS", "Maker", "Side", "static_slices", "static_stack"]

#: Makes the slices ``which`` of one block of one side, stacked at the side's slice axis;
#: for an int, that one slice without the slice axis.
Maker = Callable[[Sequence[int] | int], jax.Array]


_NONE = -(1 << 20)  # "no bits": the top exponent of a zero residual


ALL_BITS = 1 << 20  # a cut above every bit: the first block of per-row slices


def _column(values: list, shape: tuple[int, ...], at: int | None, dtype) -> jax.Array:
    """Per-slice constants shaped to broadcast against values expanded at ``at``; with
    ``at`` None (one slice, no slice axis), a scalar."""
    if at is None:
        (value,) = values
        return jnp.asarray(np.asarray(value, dtype))
    return jnp.asarray(np.asarray(values, dtype)).reshape(
        (1,) * at + (len(values),) + (1,) * (len(shape) - at)
    )


def _expand(x: jax.Array, at: int | None) -> jax.Array:
    return x if at is None else jnp.expand_dims(x, at)


def static_stack(
    v: jax.Array, s: Slicing, compute: str, at: int | None, which: Sequence[int] | None = None
) -> jax.Array:
    """The static slices ``which`` (default all) of decoded f32 values (NaN and Inf already
    zeroed), integer-valued in ``compute``, stacked along a new axis ``at`` (exponent
    windows, or balanced digits); ``at`` None: the one slice ``which``, without that axis."""
    which = list(range(s.count)) if which is None else list(which)
    bits = lax.bitcast_convert_type(v, jnp.uint32)
    if s.digits:
        return _digit_stack(bits, s, compute, at, which)
    biased = ((bits >> 23) & 0xFF).astype(jnp.int32)
    e = jnp.maximum(biased - 127 - (s.p - 1), s.q_min)
    index = _expand((e - s.q_min) // s.width, at)
    scale = _column([2.0 ** -(s.q_min + i * s.width) for i in which], v.shape, at, np.float32)
    hit = index == _column(which, v.shape, at, np.int32)
    return jnp.where(hit, _expand(v, at) * scale, 0.0).astype(compute)


def static_slices(v: jax.Array, s: Slicing, compute: str) -> list[jax.Array]:
    """:func:`static_stack` as a list of slices, lowest first."""
    stack = static_stack(v, s, compute, 0)
    return [stack[i] for i in range(s.count)]


def _digit_stack(bits: jax.Array, s: Slicing, compute: str, at: int | None, which: list[int]):
    """The balanced base-``2**width`` digits ``which`` of ``|v| / 2**q_min`` (an integer
    below 2**32: every value of the format is a multiple of ``2**q_min``), each with the
    value's sign, from the f32 bits: uint32 shifts and masks, no float operation."""
    neg, u = _digit_word(bits, s)
    top = s.count - 1
    shape = bits.shape
    shift = _column([s.width * i for i in which], shape, at, np.uint32)
    # every digit but the top one is masked and less 2**(width - 1); the top one is at
    # most 2**(width - 1) as it is
    mask = [0xFFFFFFFF if i == top else (1 << s.width) - 1 for i in which]
    half = [0 if i == top else 1 << (s.width - 1) for i in which]
    d = _expand(u, at) >> shift
    d = (d & _column(mask, shape, at, np.uint32)).astype(jnp.int32)
    d = d - _column(half, shape, at, np.int32)
    return jnp.where(_expand(neg, at), -d, d).astype(compute)


def _digit_word(bits: jax.Array, s: Slicing) -> tuple[jax.Array, jax.Array]:
    """``(negative, V + offset)`` (uint32) of the values given by their f32 bits: the
    plain base-``2**width`` digits of the second are the balanced digits of ``V`` plus
    ``2**(width - 1)`` each (but the top one)."""
    neg, m, e = split_f32(bits)
    sh = e - s.q_min  # V = m * 2**sh; m's trailing zeros cover a negative sh
    mu = m.astype(jnp.uint32)
    v = jnp.where(
        sh >= 0,
        mu << jnp.clip(sh, 0, 31).astype(jnp.uint32),
        mu >> jnp.clip(-sh, 0, 31).astype(jnp.uint32),
    )
    return neg, v + jnp.uint32(s.offset)  # below 2**32 (slicing checks it)


def _top(m: jax.Array, e: jax.Array) -> jax.Array:
    """Exponent of the highest set bit of ``m * 2**e``; ``_NONE`` where ``m == 0``."""
    return jnp.where(m != 0, e + 31 - lax.clz(m), _NONE)


def _row_base(m, e, s: Slicing, axis: int) -> jax.Array:
    """Each row's base exponent (K, along ``axis``, reduced to 1): ``count * width`` bits
    below the row's highest bit, and not below ``q_min``."""
    t = jnp.max(_top(m, e), axis=axis, keepdims=True, initial=_NONE)
    return jnp.maximum(t - s.count * s.width + 1, s.q_min)


def _row_stack(neg, m, e, base, s: Slicing, compute: str, at: int | None, which: Sequence[int]):
    """The slices ``which`` of one block of per-row slices of ``(-1)**neg * m * 2**e`` at
    the rows' ``base`` exponents, stacked along a new axis ``at``."""
    rel = _expand(e - base, at)  # the element's lowest bit relative to the base
    sh = rel - _column([i * s.width for i in which], e.shape, at, np.int32)
    mx = _expand(m, at)
    left = mx << jnp.clip(sh, 0, 31)  # bits past the slice are masked off below
    right = mx >> jnp.clip(-sh, 0, 31)
    part = jnp.where(sh >= 0, left, right) & ((1 << s.width) - 1)
    part = jnp.where(_expand(neg, at), -part, part)
    return part.astype(compute)


def _residual(m, e, base) -> jax.Array:
    """The mantissa bits of ``m * 2**e`` below each row's ``base`` (what later blocks take)."""
    rel = e - base
    below = jnp.clip(-rel, 0, 31)
    return jnp.where(rel >= 0, 0, m & ((1 << below) - 1))


def _where(which: Sequence[int] | int, at: int) -> tuple[list[int], int | None]:
    """The slice indices and the stacking axis for a maker's ``which``."""
    return ([which], None) if isinstance(which, int) else (list(which), at)


@dataclasses.dataclass(frozen=True)
class Side:
    """One operand in canonical layout, (B, M, K) for the lhs and (B, K, N) for the rhs,
    with K padded to whole chunks: ``bits`` builds its f32 bits anew at every use, from the
    operand as the caller passed it (codes, Packed bytes or values), so that the decode and
    the slicing fuse into whatever reads them and no copy of the operand is made."""

    s: Slicing
    bits: Callable[[], jax.Array]
    compute: str
    axis: int  # the contracting axis: 2 for the lhs (B, M, K), 1 for the rhs (B, K, N)
    specials: bool  # whether the operand's format has NaN or Inf

    @property
    def at(self) -> int:
        """Where the slices are stacked: before the free axis."""
        return 1 if self.axis == 2 else 2

    def finite_bits(self) -> jax.Array:
        b = self.bits()
        return jnp.where((b & 0x7F800000) != 0x7F800000, b, 0) if self.specials else b

    def split(self):
        return split_f32(self.finite_bits())

    def first(self) -> tuple[Maker, int | jax.Array]:
        """The first block: its slice maker and base exponent (``q_min``, or each row's)."""
        if not self.s.dynamic:  # low-precision values: normal in f32, float ops are safe
            v = lax.bitcast_convert_type(self.finite_bits(), jnp.float32)

            def make(which: Sequence[int] | int) -> jax.Array:
                idx, at = _where(which, self.at)
                return static_stack(v, self.s, self.compute, at, idx)

            return make, self.s.q_min
        neg, m, e = self.split()
        return self.block(neg, m, e, _row_base(m, e, self.s, self.axis))

    def block(self, neg, m, e, base: jax.Array) -> tuple[Maker, jax.Array]:
        """A block of per-row slices of ``(-1)**neg * m * 2**e`` at ``base``. The makers
        read arrays made in the caller's scope, where they run: XLA fuses those
        elementwise producers into every dot operand that reads them."""

        def make(which: Sequence[int] | int) -> jax.Array:
            idx, at = _where(which, self.at)
            return _row_stack(neg, m, e, base, self.s, self.compute, at, idx)

        return make, base

    def below(self, cut: jax.Array) -> tuple[Maker, jax.Array]:
        """The block of the mantissa bits below each row's ``cut`` (per-row slicing; the
        previous block's base, or ``ALL_BITS`` for the first block): maker and base."""
        neg, m, e = self.split()
        res = _residual(m, e, cut)
        return self.block(neg, res, e, _row_base(res, e, self.s, self.axis))

    def more(self, base: jax.Array) -> jax.Array:
        """Whether some element has bits below its row's ``base`` (per-row slicing)."""
        _, m, e = self.split()
        return jnp.any(_residual(m, e, base) != 0)
