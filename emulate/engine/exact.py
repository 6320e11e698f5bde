"""Mode "exact" for float formats outside the exact class: exponent slicing.

Every finite value of a float format is ``m * 2**E`` with an integer mantissa
``|m| < 2**p`` (``p = mantissa_bits + 1``) and ``E`` at least the format's quantum
exponent ``q_min``. Each operand is cut into ``S`` *slices*: arrays of integers below
``2**(p + w - 1)`` (static slicing) or ``2**w`` (per-row slicing) that, each scaled by its
slice's power of two, add up to the operand exactly. The slices are exact in int8 (when
they stay within 127), in bf16 (when they have at most 8 significant bits) and in f32.
Each pair of slices is one matmul whose chunk sums are exact (chunks short enough for the
int32 or f32 accumulator), and every chunk sum is an integer in units of the pair's
quantum.

Two ways to cut an operand:

* **static** (the low-precision formats: float8, float6, float4, integers): the exponent
  range ``[q_min, q_max]`` is cut into ``S`` slices of ``w`` exponents each.
* **per row** (the wide formats bfloat16, float16, float32, whose exponent ranges are far
  too wide to cut statically): each row of the lhs (column of the rhs) is scaled by the
  power of two of its largest element, and the ``S * w`` bits below it are cut into
  ``S`` slices of ``w`` bits. Bits of smaller elements that fall below those ``S * w``
  bits are left in a *residual*; while any residual is non-zero, further blocks of ``S``
  slices are taken below each row's residual maximum (a data-dependent number of passes:
  none for rows that span less than ``S * w`` bits, the usual case).

Program shape (its size is the compile time): the first block of both sides is summed
outside any control flow; with a per-row side, a ``lax.cond`` on "some row has bits below
its first block" either rounds those limbs or runs the further blocks, every pair of an
lhs block and an rhs block after the first in one ``while_loop`` (one copy of the block
program), whose state is each side's per-row *cut* (the block takes the mantissa bits
below it) and the wide limbs: no operand-sized array is carried or written out.

The chunk sums, at up to ``S_lhs * S_rhs`` different scales, are added exactly in a wide
fixed-point number held in 16-bit limbs of uint32 arrays (positive and negative parts
apart, so no limb ever overflows), at the power of two of the row and column scales, and
the total is rounded once into float32, with its subnormals and overflow to Inf: to
nearest even for a float32 result, or *to odd* for a narrower one, which makes the second
rounding equal to a single one. NaN and Inf follow IEEE: they come from a dot of the
operands with every finite non-zero value replaced by its sign (no overflow, no flushed
subnormals), run only when an operand holds NaN or Inf.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.engine.layout import result_shape, to_bkn, to_bmk
from emulate.engine.limbs import (
    n_limbs,
    place,
    round_wide,
    sign_magnitude,
    signed_limbs,
    subtract_stacked,
)
from emulate.engine.operands import Operand, decode_to
from emulate.engine.slices import ALL_BITS, Maker, Side
from emulate.numerics import accumulate
from emulate.numerics.bits import f32_bits
from emulate.planning.exactness import F32_EXACT, MAX_CHUNKS

__all__ = ["contract"]


# ------------------------------------------------------------------ chunk sums and limbs


def _pair_chunk_sums(
    make_a: Maker, make_b: Maker, counts: tuple[int, int], n: int, chunk: int, rhs_big: bool
):
    """Chunk sums of every pair of lhs slices, (B, Sa, M, K), and rhs slices, (B, K, Sb, N),
    K = ``n * chunk``: ``pair(i, j)``, int32 (B, C, M, N). The smaller side's slices are
    stacked into one operand; the larger side's are made one per dot, inside its operand."""
    sa, sb = counts
    if rhs_big:
        a = make_a(range(sa))
        nb, _, m, _ = a.shape
        a = a.reshape(nb, sa * m, n, chunk)
        parts = []
        for j in range(sb):
            b = make_b(j)
            a = _distinct(a, j)
            parts.append(_dot(a, b.reshape(nb, n, chunk, b.shape[-1])).reshape(nb, n, sa, m, -1))
        return lambda i, j: parts[j][:, :, i]
    b = make_b(range(sb))
    nb, _, _, nn = b.shape
    b = b.reshape(nb, n, chunk, sb * nn)
    parts = []
    for i in range(sa):
        a = make_a(i)
        b = _distinct(b, i)
        parts.append(_dot(a.reshape(nb, a.shape[1], n, chunk), b).reshape(nb, n, -1, sb, nn))
    return lambda i, j: parts[i][:, :, :, j]


def _distinct(x: jax.Array, i: int) -> jax.Array:
    """``x``, seen by XLA as a different array for each ``i``: XLA merges dots that share
    an operand into one dot over the concatenation of the others (its DotMerger pass),
    which would write every slice of the larger side out in full."""
    return lax.optimization_barrier((x, jnp.int32(i)))[0]


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """(B, R, C, chunk) x (B, C, chunk, N) -> (B, C, R, N), int32: exact chunk sums (int32
    accumulation for int8 slices, f32 for the others)."""
    acc = jnp.int32 if a.dtype == jnp.int8 else jnp.float32
    if a.shape[0] == 1 and a.shape[2] == 1:  # a plain matrix product: what XLA fuses best
        r = lax.dot_general(
            a[0, :, 0], b[0, 0], (((1,), (0,)), ((), ())), preferred_element_type=acc
        )
        return r.astype(jnp.int32)[None, None]
    dn = (((3,), (2,)), ((0, 2), (0, 1)))
    return lax.dot_general(a, b, dn, preferred_element_type=acc).astype(jnp.int32)


# ---------------------------------------------------------------------------- contract


def _canonical_bits(x, batch, contracting, lhs: bool, pad: int) -> jax.Array:
    """The f32 bits of operand ``x`` (an :class:`Operand`, or values exact in f32 or of a
    wide type) in canonical layout, K zero-padded by ``pad``."""
    if isinstance(x, Operand):
        x = x.value if not x.format.is_low_precision else decode_to(x, "float32", 0)
    x = to_bmk(x, batch, contracting) if lhs else to_bkn(x, batch, contracting)
    bits = f32_bits(x)
    if pad:
        bits = jnp.pad(bits, ((0, 0), (0, 0), (0, pad)) if lhs else ((0, 0), (0, pad), (0, 0)))
    return bits


def contract(plan, lhs, rhs, dimension_numbers, precision) -> jax.Array:
    """The exact-mode contraction for a "sliced" plan.

    ``lhs`` and ``rhs`` are :class:`~emulate.engine.operands.Operand` values as the caller
    stored them (decoded inside the fusions that read them), or arrays of values exact in
    float32 or of a wide type. ``precision`` is accepted for symmetry with the other routes;
    every dot here multiplies values that are exact in the compute type.
    """
    del precision
    sa, sb = plan.slicings()
    (lc, rc), (lb, rb) = dimension_numbers
    out_shape = result_shape(tuple(lhs.shape), tuple(rhs.shape), dimension_numbers)
    k = math.prod(lhs.shape[i] for i in lc)
    n_chunks = -(-max(k, 1) // min(plan.k_chunk, max(k, 1)))
    if n_chunks > MAX_CHUNKS:
        raise ValueError(
            f"lhs, rhs: exact mode covers contractions of up to {MAX_CHUNKS * plan.k_chunk} "
            f"for {plan.lhs} x {plan.rhs}; got K = {k}"
        )
    chunk = -(-max(k, 1) // n_chunks)  # as even as the chunks go: no padding where n divides K
    pad = n_chunks * chunk - k

    def sides(a, b) -> tuple[Side, Side]:
        return (
            Side(
                sa,
                functools.partial(_canonical_bits, a, lb, lc, True, pad),
                plan.lhs_compute,
                2,
                _has_specials(plan.lhs),
            ),
            Side(
                sb,
                functools.partial(_canonical_bits, b, rb, rc, False, pad),
                plan.rhs_compute,
                1,
                _has_specials(plan.rhs),
            ),
        )

    # the larger operand is sliced one slice per dot (fused into it), the smaller stacked
    m_rows = math.prod(lhs.shape[i] for i in range(len(lhs.shape)) if i not in lc and i not in lb)
    n_cols = math.prod(rhs.shape[i] for i in range(len(rhs.shape)) if i not in rc and i not in rb)

    side_a, side_b = sides(lhs, rhs)
    first, q0, block, to_odd = _first_block(
        side_a, side_b, plan=plan, chunks=(n_chunks, chunk), rhs_big=n_cols >= m_rows
    )
    if not (sa.dynamic or sb.dynamic):
        r = round_wide(first[0], first[1], q0[0], to_odd)
    else:
        # The first block (every row's top S*w bits) is summed outside the cond, which only
        # takes its output-sized limbs; the further blocks, when some row has bits below
        # its first block, run inside it from the operands as passed (a cond that captured
        # arrays made from them would write those arrays out).
        more = jnp.zeros((), bool)
        for side, base in ((side_a, q0[1]), (side_b, q0[2])):
            if side.s.dynamic:
                more = more | side.more(base)

        def further(first, q0, a, b):
            x, y = sides(a, b)
            return _further_blocks(x, y, first, q0, block, to_odd)

        def done(first, q0, a, b):
            return round_wide(first[0], first[1], q0[0], to_odd)

        r = lax.cond(more, further, done, first, q0, lhs, rhs)
    r = _specials(r, (lhs, rhs), sides, plan)
    return accumulate.round_accumulator(r.reshape(out_shape), plan.out)


def _has_specials(fmt: str) -> bool:
    f = formats.get(fmt)
    return f.has_nan or f.has_inf


def _first_block(side_a: Side, side_b: Side, *, plan, chunks: tuple[int, int], rhs_big: bool):
    """The first block of the (B, M, K) x (B, K, N) operands' sum: ``(negative, magnitude
    limbs)`` relative to ``2**q0`` with ``q0 = (q0, base_a, base_b)``; the block summer
    (two slice makers to sign-magnitude limbs) and whether the rounding is to odd (for a
    result narrower than f32)."""
    sa, sb = side_a.s, side_b.s
    shifts = np.add.outer(np.arange(sa.count) * sa.width, np.arange(sb.count) * sb.width)
    n_rel = n_limbs(int(shifts.max()))
    to_odd = formats.get(plan.out).name != "float32"
    n_chunks, chunk = chunks
    if plan.lhs_compute == "int8":
        bound = chunk * sa.max_int * sb.max_int  # the largest |chunk sum|
    else:
        bound = min(chunk * sa.max_int * sb.max_int, F32_EXACT)

    def block(make_a: Maker, make_b: Maker):
        """The lhs slices times the rhs slices, as (negative, magnitude limbs)."""
        counts = (sa.count, sb.count)
        pair = _pair_chunk_sums(make_a, make_b, counts, n_chunks, chunk, rhs_big)
        return sign_magnitude(signed_limbs(pair, shifts, n_rel, bound))

    make_a, base_a = side_a.first()
    make_b, base_b = side_b.first()
    return block(make_a, make_b), (_q0(base_a, base_b), base_a, base_b), block, to_odd


def _q0(base_a, base_b):
    """The exponent of the relative limbs' unit, per (B, M, N) element (or an int)."""
    if isinstance(base_a, int) and isinstance(base_b, int):
        return base_a + base_b
    ea = base_a if not isinstance(base_a, int) else jnp.full((1, 1, 1), base_a, jnp.int32)
    eb = base_b if not isinstance(base_b, int) else jnp.full((1, 1, 1), base_b, jnp.int32)
    return ea + eb  # (B, M, 1) + (B, 1, N)


def _further_blocks(side_a: Side, side_b: Side, first, q0, block, to_odd) -> jax.Array:
    """The exact sum, rounded into f32, when a per-row operand has bits below its first
    block: every block of the lhs against every block of the rhs, added at run-time
    shifts into one fixed-point number covering the whole range of the two formats.

    One while loop places a pending block's limbs and makes the next pair's (one copy of
    the block program, inside a cond that skips it after the last pair), the rhs blocks
    innermost: its state is each side's current *cut* (a per-row exponent: the block takes
    the bits below it), the pending block and the limbs; every block's slices are made
    again from the operands inside the body that reads them."""
    sa, sb = side_a.s, side_b.s
    lo = sa.q_min + sb.q_min  # no base is below its format's q_min
    hi_a = sa.q_max + sa.p if sa.dynamic else sa.q_min
    hi_b = sb.q_max + sb.p if sb.dynamic else sb.q_min
    n_rel = len(first[1])
    n_abs = (hi_a + hi_b - lo) // 16 + n_rel + 4  # room for the carries of many blocks
    shape = first[1][0].shape

    def add(accs, rel, base_a, base_b):
        """Place a block's limbs, positive and negative parts stacked on axis 1 of accs."""
        negative, mag = rel
        off = jnp.broadcast_to(_q0(base_a, base_b) - lo, (2, *shape))
        parts = [jnp.stack([jnp.where(negative, 0, x), jnp.where(negative, x, 0)]) for x in mag]
        return place(accs, parts, off)

    def side_block(side: Side, cut):
        if not side.s.dynamic:
            make, base = side.first()
            return make, jnp.int32(base)
        return side.below(cut)

    def pair(cut_a, cut_b):
        (make_a, base_a), (make_b, base_b) = side_block(side_a, cut_a), side_block(side_b, cut_b)
        return block(make_a, make_b), base_a, base_b

    def no_pair(cut_a, cut_b):
        zero = jnp.zeros(shape, jnp.uint32)
        base_a = jnp.int32(sa.q_min) if not sa.dynamic else jnp.full_like(cut_a, sa.q_min)
        base_b = jnp.int32(sb.q_min) if not sb.dynamic else jnp.full_like(cut_b, sb.q_min)
        return (jnp.zeros(shape, bool), [zero] * n_rel), base_a, base_b

    def body(state):
        cut_a, cut_b, _, pending, base_a, base_b, accs = state
        accs = add(accs, pending, base_a, base_b)
        # the cuts of the next pair of blocks, and whether there is one
        more_b = side_b.more(base_b) if sb.dynamic else jnp.zeros((), bool)
        more_a = side_a.more(base_a) if sa.dynamic else jnp.zeros((), bool)
        if sb.dynamic:
            cut_b = jnp.where(more_b, base_b, ALL_BITS)
        if sa.dynamic:
            cut_a = jnp.where(more_b, cut_a, base_a)
        go = more_b | more_a
        # both branches' results vary over the mesh axes either's do (inside shard_map a
        # branch of constants varies over none, and lax.cond refuses a pair that differs)
        types = [jax.eval_shape(f, cut_a, cut_b) for f in (pair, no_pair)]
        want = jax.tree.map(lambda a, b: _axes(a) | _axes(b), *types)
        branches = [lambda *c, f=f: _vary(f(*c), want) for f in (pair, no_pair)]
        return (cut_a, cut_b, go, *lax.cond(go, *branches, cut_a, cut_b), accs)

    _, base_a, base_b = (jnp.asarray(x, jnp.int32) for x in q0)
    cut_a = jnp.full_like(base_a, ALL_BITS)
    cut_b = jnp.full_like(base_b, ALL_BITS)
    accs = jnp.zeros((n_abs, 2, *shape), jnp.uint32)
    state = (cut_a, cut_b, jnp.ones((), bool), first, base_a, base_b, accs)
    accs = _varying_while(lambda s: s[2], body, state)[6]
    return round_wide(*subtract_stacked(accs[:, 0], accs[:, 1]), lo, to_odd)


def _specials(r, operands, sides, plan) -> jax.Array:
    """NaN and Inf by IEEE rules, from a dot of the operands with every finite value
    replaced by its sign (0, +-1): exact, no overflow, nothing flushed. Run only when an
    operand whose format has NaN or Inf holds one."""
    side_a, side_b = sides(*operands)
    if not (side_a.specials or side_b.specials):
        return r
    try:
        bf16 = targets.get(plan.target).supports("bfloat16", "bfloat16")
    except ValueError:  # a Target built by the caller, not registered by name
        bf16 = plan.lhs_compute == "bfloat16"
    dtype = jnp.bfloat16 if bf16 else jnp.float32

    def signs(bits):  # from the bits: no float operation sees a subnormal
        finite = (bits & 0x7F800000) != 0x7F800000
        one = jnp.where((bits >> 31) == 1, -1.0, 1.0)
        nan = jnp.where((bits << 9) != 0, jnp.nan, jnp.inf)  # NaN, or Inf with the sign
        value = jnp.where(finite, jnp.where((bits << 1) == 0, 0.0, 1.0), nan)
        return (value * one).astype(dtype)

    def with_specials(r, a, b):
        x, y = sides(a, b)
        dn = (((2,), (1,)), ((0,), (0,)))
        s = lax.dot_general(
            signs(x.bits()), signs(y.bits()), dn, preferred_element_type=jnp.float32
        )
        return jnp.where(jnp.isfinite(s), r, s)

    special = jnp.zeros((), bool)
    for side in (side_a, side_b):
        if side.specials:
            special = special | jnp.any((side.bits() & 0x7F800000) == 0x7F800000)
    return lax.cond(special, with_specials, lambda r, a, b: r, r, *operands)


def _axes(t) -> frozenset:
    """The mesh axes an array or a ShapeDtypeStruct varies over (inside ``jax.shard_map``;
    none elsewhere)."""
    mat = t.manual_axis_type if isinstance(t, jax.ShapeDtypeStruct) else jax.typeof(t).mat
    return frozenset() if mat is None else frozenset(mat.varying)


def _vary(tree, want):
    """``tree`` with each array cast to also vary over the axes of ``want``'s leaf."""

    def to(y, need):
        more = tuple(sorted(need - _axes(y)))
        return lax.pcast(y, more, to="varying") if more else y

    return jax.tree.map(to, tree, want)


def _varying_while(cond_fun: Callable, body: Callable, state):
    """``lax.while_loop`` whose carry varies over the mesh axes any pass of ``body`` makes
    it vary over (``lax.while_loop`` inside ``jax.shard_map`` refuses a carry whose types
    change; outside ``shard_map`` nothing is added)."""
    for _ in range(len(jax.tree.leaves(state)) + 1):
        out = jax.eval_shape(body, state)
        want = jax.tree.map(lambda a, b: _axes(a) | _axes(b), state, out)
        if all(_axes(a) == w for a, w in zip(jax.tree.leaves(state), jax.tree.leaves(want))):
            break
        state = _vary(state, want)
    want = jax.tree.map(_axes, state)
    return lax.while_loop(cond_fun, lambda s: _vary(body(s), want), state)
