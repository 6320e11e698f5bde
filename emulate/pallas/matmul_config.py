"""The static side of :func:`emulate.pallas.matmul`: the weight's layout
(:class:`Stored`), the block shape and the VMEM budget of one call (:func:`config`,
:class:`Config`, the kernel's jit key). The kernel is :mod:`emulate.pallas.matmul_kernel`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.pallas import compute, qgroups, word_groups, word_step
from emulate.pallas.qcodebook import KernelCodebook
from emulate.pallas.qweight import Scaling
from emulate.planning.exactness import MAX_CHUNKS, MAX_TOTAL_QUANTA

__all__ = ["Config", "LAYOUTS", "Stored", "config"]

_LANES = 128
_SUBLANES = {1: 32, 2: 16, 4: 8}  # second-minor tiling of a VMEM block, by element bytes
_DEFAULT_SCOPED_VMEM = 16 << 20  # Mosaic's default scoped VMEM limit on v4 / v5e
LAYOUTS = ("dense", "planar", "packed")
#: Default bk: at most this many scale groups per K step (each group is a dot of its own):
#: 8 on chips with 16 MiB of VMEM (v2, v3, v4: 35.8 of 16 MiB for groups of 32 at bk =
#: 1024), 32 on the others (docs/performance.md: on a v5e, Q4_K at M = 1 and 64 ran
#: 1.7-2.2x faster at bk = 1024 than at bk = 256).
_MAX_GROUPS_PER_STEP = 8
_MAX_GROUPS_PER_STEP_LARGE_VMEM = 32


@dataclasses.dataclass(frozen=True)
class Stored:
    """The weight as the kernel reads it (static part).

    Attributes:
      layout: "dense" (one code per byte, or the format's own 8-bit dtype), "planar"
        (:class:`KernelWeight`) or "packed" (:func:`emulate.pack`'s layout, one byte per
        group of codes along K).
      dtype: the stored element type's name ("int8", "uint8", "float8_e4m3fn", ...).
      rows: rows of the stored array (bytes along K for planar / packed layouts).
      group, nbytes: codes per group of whole bytes along K, and its bytes (1, 1 dense).
      code: an integer code format of ``emulate.formats.CODE_FORMATS`` (2, 3, 5, 6 bits)
        the kernel decodes into ``compute.rhs`` (int8: every value fits), or "".
    """

    layout: str
    dtype: str
    rows: int
    group: int = 1
    nbytes: int = 1
    code: str = ""


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything static about one kernel call (hashable: the jit cache key).

    Attributes:
      compute: the :class:`emulate.pallas.compute.Compute` of the pair on the target.
      m, n, k: the logical problem shape.
      bm, bn, bk: the block shape (bk in rows of K).
      stored: the weight's :class:`Stored` layout.
      w_passthrough: the weight goes to the matrix unit in its stored type (no decoding).
      limbs: accumulate an exact int32 sum as two limbs (exact pair, float result).
      x_resident: x's block spans all of K (fetched once per row block of the output).
      interpret: whether to run in interpret mode (else compile for TPU).
      vmem_bytes: the estimated VMEM footprint of one grid step.
      vmem_limit: the scoped VMEM limit asked of Mosaic (None: its default, 16 MiB or
        more, when twice the estimate fits in it).
      x_dtype: the type x is stored in (decoded in the kernel into ``compute.lhs_compute``).
      scaling: a QArray weight's :class:`emulate.pallas.qweight.Scaling`, or None.
      out: the result type (``compute.out`` unless a QArray's scales are applied to the f32
        accumulator first).
      codebook: a codebook weight's :class:`emulate.pallas.qcodebook.KernelCodebook`, or
        None (``compute.rhs`` is then the format its values take in the kernel).
      word_step: the kernel body is :func:`emulate.pallas.word_step.body` (a 4- or 6-bit weight
        read in whole words, group partial sums on the matrix unit; x spans K).
    """

    compute: compute.Compute
    m: int
    n: int
    k: int
    bm: int
    bn: int
    bk: int
    stored: Stored
    w_passthrough: bool
    limbs: bool
    x_resident: bool
    interpret: bool
    vmem_bytes: int
    vmem_limit: int | None
    x_dtype: str = ""
    scaling: Scaling | None = None
    out: str = ""
    codebook: KernelCodebook | None = None
    word_step: bool = False

    @property
    def scaled_in_kernel(self) -> bool:
        """Whether the kernel applies a QArray's scales (and tensor scale) itself and
        writes the result type: an f32 sum, or an exact int32 one that cannot overflow (not
        limbs), and a float32 or bfloat16 result (Mosaic stores no float16)."""
        return self.scaling is not None and not self.limbs and self.out in ("float32", "bfloat16")

    @property
    def tensor_scaled(self) -> bool:
        """Whether the QArray weight has a tensor scale (kernel operands of its own)."""
        return self.scaling is not None and self.scaling.tensor_scaled

    @property
    def group_scaled(self) -> bool:
        """Whether the kernel applies block scales per group of K rows."""
        return self.scaling is not None and self.scaling.along_k

    @property
    def padded(self) -> tuple[int, int, int]:
        return _round_up(self.m, self.bm), _round_up(self.n, self.bn), _round_up(self.k, self.bk)

    @property
    def grid(self) -> tuple[int, int, int]:
        mp, np_, kp = self.padded
        return mp // self.bm, np_ // self.bn, kp // self.bk

    @property
    def x_planes(self) -> int:
        """Column planes of x (``g`` for the packed layout, else 1)."""
        return self.stored.group if self.stored.layout == "packed" else 1

    @property
    def w_block_rows(self) -> int:
        """Rows of the stored weight per K step."""
        s = self.stored
        return self.bk if s.layout == "dense" else self.bk // s.group * s.nbytes


def _max_groups(t: targets.Target) -> int:
    """Scale groups per K step of a default bk on ``t`` (:data:`_MAX_GROUPS_PER_STEP`)."""
    vmem = t.vmem_capacity_bytes or 16 << 20
    return _MAX_GROUPS_PER_STEP if vmem <= 16 << 20 else _MAX_GROUPS_PER_STEP_LARGE_VMEM


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _itemsize(name: str) -> int:
    return np.dtype(formats.get(name).dtype).itemsize


def _check_block(name: str, value: Any, multiple: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise TypeError(f"block_shape: {name} must be a positive int, got {value!r}")
    if value % multiple:
        raise ValueError(f"block_shape: {name} = {value} must be a multiple of {multiple} ({why})")
    return int(value)


def _vmem_bytes(
    bm: int, bn: int, bk: int, limbs: bool, x_cols: int, w_rows: int, highest: bool = False
) -> int:
    x_block = bm * x_cols * 4  # at most 4 bytes stored, decoded in the kernel
    w_block = w_rows * bn  # one byte per stored element
    temps = 4 * bk * bn * 4  # int32 bytes / words, codes and the decoded tile
    acc = bm * bn * 4 * (2 if limbs else 1)
    # an f32 dot at Precision.HIGHEST: each operand cut into bfloat16 pieces and a partial
    # product per pass (measured on v2, f32 x at 2048 x 4096 x 14336 Q4_K: 20.3 MiB of
    # scoped VMEM for (1024, 256, 256) blocks, 6.9 MiB counted without this term)
    split = 6 * (2 * bm * bk + 2 * bk * bn + 4 * bm * bn) if highest else 0
    return 2 * x_block + 2 * w_block + temps + acc + 2 * acc + split


def _spread_vmem(scaling: Scaling | None, n: int, bn: int) -> tuple[int, str]:
    """VMEM of spreading super-block scales of several columns to an output block of ``bn``
    columns (:func:`emulate.pallas.qgroups.block_spread`), per such two-level part: its
    ``(W, bn)`` f32 one-hot selector, its ``(8, W)`` byte planes and the ``(1, W)`` row
    block it reads (double-buffered, 8 sublanes), ``W`` the scales of the window
    :func:`emulate.pallas.qgroups.supers_window` gives or, where none fits, of the whole
    row (``N / cols``: it grows with N); and, for the error, a note naming a whole row.
    An upper bound: at N = 65536, bn = 384 and 4 columns a scale (a whole row of 16384)
    Mosaic used 16630272 bytes of scoped VMEM in all on v5e, where this counts 26738688
    for the spread alone (libtpu 0.0.42.1); uncounted, tpu_v4 ran out of its 16 MiB."""
    total, note = 0, ""
    levels = scaling.affine.spreads if scaling is not None and scaling.affine else ()
    for lv in levels:
        row = -(-n // lv.cols)
        window = qgroups.supers_window(lv.cols, bn)
        lanes = _round_up(row if window is None else min(row, window[0]), _LANES)
        part = lanes * bn * 4 + 8 * lanes * 4 + 2 * 8 * lanes * 4
        total += part
        if window is None:
            note = (
                f" ({part} of them to spread the whole row of {row} super-block scales of "
                f"{lv.cols} columns each to every output block: a bn with bn / {lv.cols} a "
                "divisor or a multiple of 128 reads a window of them)"
            )
    return total, note


def _default_bk(kq: int, k_multiple: int, bn: int) -> int:
    """The deepest multiple of ``k_multiple`` that divides ``kq`` (K rounded up to whole
    ``k_multiple``s) and is at most ``2**18 / bn`` rows (or ``k_multiple``): whole K
    blocks, so that the last one reads no rows past the weight's end."""
    cap = max(k_multiple, min(kq, (512 * 512 // bn) // k_multiple * k_multiple))
    units = kq // k_multiple
    best = 1
    for d in range(1, cap // k_multiple + 1):
        if units % d == 0:
            best = d
    return best * k_multiple


@dataclasses.dataclass(frozen=True)
class _Tiling:
    """What every block shape of one call must respect, resolved before any is chosen.

    Attributes:
      x_sub: the sublane tiling of x's blocks in the type the matrix unit takes (rows).
      stored_sub: the sublane tiling of x's blocks in the type x is stored in (rows).
      group, nbytes: the weight's codes per byte group along K and that group's bytes.
      k_multiple: what bk must be a multiple of: the lane width times ``group``.
      packed: the weight is stored in groups along K (not "dense").
      limbs: an exact int32 sum for a float result, carried as two limbs.
      cap: half the target's VMEM (16 MiB where unknown), bytes: what a default block
        shape and a resident x may fill.
      highest: the dots run at ``Precision.HIGHEST`` (f32 operands bf16 cannot hold).
    """

    x_sub: int
    stored_sub: int
    group: int
    nbytes: int
    k_multiple: int
    packed: bool
    limbs: bool
    cap: int
    highest: bool = False

    def w_rows(self, bk: int) -> int:
        """Rows of the stored weight per K step of ``bk`` rows."""
        return bk // self.group * self.nbytes if self.packed else bk

    def vmem(self, bm: int, bn: int, bk: int, x_cols: int) -> int:
        """VMEM of one grid step (:func:`_vmem_bytes`), x blocks of ``x_cols`` columns."""
        return _vmem_bytes(bm, bn, bk, self.limbs, x_cols, self.w_rows(bk), self.highest)


def _tiling(
    r: compute.Compute,
    t: targets.Target,
    k: int,
    stored: Stored,
    x_dtype: str,
    scaling: Scaling | None,
    out: str,
) -> _Tiling:
    # an exact sum for a float result: two int32 limbs, unless it is a QArray's whose
    # scales follow in the kernel (a float32 / bfloat16 result) and no K can carry it
    # past int32
    grouped = scaling is not None and scaling.along_k
    in_kernel = scaling is not None and out in ("float32", "bfloat16")
    fits = in_kernel and r.exact and k * compute.exact_limit(r) < 2**31
    return _Tiling(
        x_sub=_SUBLANES[_itemsize(r.lhs_compute)],
        stored_sub=_SUBLANES[np.dtype(x_dtype).itemsize],
        group=stored.group,
        nbytes=stored.nbytes,
        # each x plane block is lane-dense; whole K-planar tiles
        k_multiple=_LANES * stored.group,
        packed=stored.layout != "dense",
        limbs=r.exact and formats.get(r.out).is_float and not grouped and not fits,
        cap=(t.vmem_capacity_bytes or 16 << 20) // 2,
        highest=r.precision == lax.Precision.HIGHEST,
    )


def _blocks(
    r: compute.Compute,
    t: targets.Target,
    tl: _Tiling,
    shape: tuple[int, int, int],
    block_shape: Sequence[int] | None,
) -> tuple[int, int, int]:
    """(bm, bn, bk): the default for ``shape`` (M, N, K) on ``t``, or ``block_shape``
    checked against the tiling."""
    m, n, k = shape
    km = tl.k_multiple
    if block_shape is None:
        mxu = t.mxu_column_size or _LANES
        sub = max(tl.x_sub, tl.stored_sub)
        bm = m if m < sub else min(_round_up(m, sub), 256)  # below the tiling: all M rows
        bn = min(_round_up(n, _LANES), 2 * mxu)
        bk = _default_bk(_round_up(k, km), km, bn)
        while bk > km and tl.vmem(bm, bn, bk, bk) > tl.cap:
            bk = _default_bk(bk - km, km, bn)
        return bm, bn, bk
    try:
        bm, bn, bk = block_shape
    except (TypeError, ValueError):
        raise TypeError(f"block_shape: expected (bm, bn, bk), got {block_shape!r}") from None
    packs = f" times the {tl.group} codes packed along K per byte group" if tl.group > 1 else ""
    return (
        _check_block("bm", bm, tl.x_sub, f"the sublane tiling of {r.lhs_compute} blocks"),
        _check_block("bn", bn, _LANES, "the lane width"),
        _check_block("bk", bk, km, "the lane width" + packs),
    )


def _align_to_groups(
    bk: int, t: targets.Target, tl: _Tiling, scaling: Scaling, chosen: bool
) -> int:
    """bk fitted to a group-scaled weight's scale groups along K: a multiple or a divisor
    of them (raised on where ``chosen``, the caller's own block shape), and by default at
    most :func:`_max_groups` of them per K step."""
    gk = scaling.group
    if bk % gk and gk % bk:
        if chosen:
            raise ValueError(
                f"block_shape: bk = {bk} must be a multiple or a divisor of the weight's "
                f"scale groups of {gk} rows along K"
            )
        bk = math.lcm(gk, tl.k_multiple)
    most = _max_groups(t)
    if not chosen and bk // gk > most:
        unit = math.lcm(gk, tl.k_multiple)
        bk = max(unit, most * gk // unit * unit)
    return bk


def _scale_vmem(scaling: Scaling | None, n: int, bn: int) -> tuple[int, str]:
    """VMEM of a QArray weight's scales in one grid step: the resident block of scales
    along K (as int32 / f32, double-buffered) and the spread of super-block scales
    (:func:`_spread_vmem`, with its note)."""
    total = 0
    if scaling is not None and scaling.along_k:
        lanes = bn if scaling.per_column else _LANES
        if scaling.columns:  # every block column (emulate.pallas.qsteps.widen)
            lanes = _round_up(-(-n // scaling.columns), _LANES)
        total = 2 * 4 * scaling.rows * lanes * 2
        a = scaling.affine
        levels = (a.scale_level, a.offset_level) if a is not None else ()
        # each two-level part's code bytes as f32, cut in pieces for a one-hot dot at
        # Precision.HIGHEST per K step (emulate.pallas.qgroups.step_levels)
        total += sum(6 * 4 * scaling.rows * lanes for lv in levels if lv is not None)
    spread, note = _spread_vmem(scaling, n, bn)
    return total + spread, note


def _vmem_plan(
    t: targets.Target,
    tl: _Tiling,
    blocks: tuple[int, int, int],
    kp: int,
    scale: tuple[int, str],
) -> tuple[int, bool, int | None]:
    """(VMEM bytes of one grid step, whether x's block spans all of K, the scoped VMEM
    limit to ask of Mosaic or None) for ``blocks`` (bm, bn, bk) over K padded to ``kp``
    and ``scale``, :func:`_scale_vmem`'s bytes and note. Raises ValueError where the step
    needs more than the target's VMEM."""
    bm, bn, bk = blocks
    scale_vmem, note = scale
    vmem = tl.vmem(bm, bn, bk, bk) + scale_vmem
    if t.vmem_capacity_bytes and vmem > t.vmem_capacity_bytes:
        raise ValueError(
            f"block_shape: ({bm}, {bn}, {bk}) needs about {vmem} bytes of VMEM{note}, more "
            f"than {t.name}'s {t.vmem_capacity_bytes}; use smaller blocks"
        )
    resident = kp > bk and tl.vmem(bm, bn, bk, kp) <= tl.cap
    if resident:
        vmem = tl.vmem(bm, bn, bk, kp) + scale_vmem
    return vmem, resident, _scoped_limit(t, vmem)


def _scoped_limit(t: targets.Target, vmem: int) -> int | None:
    """The scoped VMEM limit a call of about ``vmem`` bytes a step asks Mosaic for: twice
    that, within the target's VMEM, where Mosaic's default would not hold it; else None."""
    if 2 * vmem <= _DEFAULT_SCOPED_VMEM:
        return None
    return min(2 * vmem, t.vmem_capacity_bytes or 2 * vmem)


#: Row blocks tried for long x (a prefill), largest first (:func:`_long_bm`).
_LONG_BM = (2048, 1024, 512)


def _long_bm(
    tl: _Tiling, shape: tuple[int, int, int], bn: int, bk: int, scale_vmem: int, bm: int
) -> int:
    """The row block for ``shape``'s M rows (M, N, K) that moves the fewest HBM bytes
    within half the VMEM, from ``bm`` (the default, 256) and :data:`_LONG_BM`: the grid
    walks K innermost, so the weight is read once per row block (``ceil(M / bm)`` times),
    and x once if its row block spans all of K in VMEM (resident), else once per column
    block. Ties go to the smaller block."""
    m, n, k = shape
    kp = _round_up(k, bk)
    w_bytes = tl.w_rows(kp) * _round_up(n, bn)
    x_bytes = m * kp * 2

    def moved(b: int) -> int:
        resident = kp > bk and tl.vmem(b, bn, bk, kp) <= tl.cap
        return -(-m // b) * w_bytes + x_bytes * (1 if resident else -(-n // bn))

    best = bm
    for b in sorted({min(c, _round_up(m, 32)) for c in _LONG_BM if c > bm}):
        if tl.vmem(b, bn, bk, bk) + scale_vmem <= tl.cap and moved(b) < moved(best):
            best = b
    return best


def _check_exact(r: compute.Compute, k: int, bk: int, kp: int) -> None:
    """Raise ValueError where a two-limb exact sum over K in blocks of ``bk`` (K padded to
    ``kp``) takes more K steps or quanta than the exact combination holds."""
    if kp // bk > MAX_CHUNKS or k * compute.exact_limit(r) >= MAX_TOTAL_QUANTA:
        raise ValueError(
            f"x, w: a contraction of K = {k} in blocks of {bk} exceeds what the exact "
            f"{r.lhs} x {r.rhs} kernel combines exactly (at most {MAX_CHUNKS} K steps "
            "and 2**40 quanta); use a larger bk or split the contraction"
        )


def config(
    r: compute.Compute,
    t: targets.Target,
    m: int,
    n: int,
    k: int,
    stored: Stored,
    w_passthrough: bool,
    block_shape: Sequence[int] | None,
    interpret: bool,
    x_dtype: str | None = None,
    scaling: Scaling | None = None,
    out: str | None = None,
    codebook: KernelCodebook | None = None,
    long_rows: bool = True,
    words: bool = True,
) -> Config:
    """The :class:`Config` for one call: block shape defaults and checks. ``x_dtype``: the
    type x is stored in (default: the type the matrix unit takes); ``scaling``: a QArray
    weight's scales; ``out``: the result type (default ``r.out``); ``codebook``: a codebook
    weight's table in the kernel; ``long_rows``: whether more than 256 rows may take a
    longer row block (:func:`_long_bm`; the grouped kernel's tiles follow its groups);
    ``words``: whether :mod:`emulate.pallas.word_step` may run the call (not in the
    grouped kernel, whose x blocks follow its visits)."""
    x_dtype = x_dtype or r.lhs_compute
    out = out or r.out
    tl = _tiling(r, t, k, stored, x_dtype, scaling, out)
    bm, bn, bk = _blocks(r, t, tl, (m, n, k), block_shape)
    if words and word_step.applies(r, stored, scaling, codebook, bm):
        return _word_config(
            r, t, tl, (m, n, k), stored, block_shape, interpret, x_dtype, scaling, out, codebook
        )
    if scaling is not None and scaling.along_k:
        bk = _align_to_groups(bk, t, tl, scaling, block_shape is not None)
    if block_shape is None and long_rows and m > bm:
        bm = _long_bm(tl, (m, n, k), bn, bk, _scale_vmem(scaling, n, bn)[0], bm)
    if bm % tl.stored_sub and bm != m:  # x's stored blocks would be off their tiling
        x_dtype = r.lhs_compute  # decoded outside the kernel instead
    kp = _round_up(k, bk)
    vmem, resident, limit = _vmem_plan(t, tl, (bm, bn, bk), kp, _scale_vmem(scaling, n, bn))
    if tl.limbs:
        _check_exact(r, k, bk, kp)
    return Config(
        compute=r,
        m=m,
        n=n,
        k=k,
        bm=bm,
        bn=bn,
        bk=bk,
        stored=stored,
        w_passthrough=w_passthrough,
        limbs=tl.limbs,
        x_resident=resident,
        interpret=interpret,
        vmem_bytes=vmem,
        vmem_limit=limit,
        x_dtype=x_dtype,
        scaling=scaling,
        out=out,
        codebook=codebook,
    )


#: Default (bk, bn) of the word step (:mod:`emulate.pallas.word_step`), largest first:
#: the first whose VMEM fits half the target's (measured by libtpu's bundle schedule on
#: v4 to 7x, 1 x 4096 x 14336 Q4_K: 2048 x 512 kept the matrix unit fed at fewer
#: bundles per code than 1024 x 256; v2 and v3 take smaller ones with f32 activations).
_WORD_BLOCKS = ((2048, 512), (2048, 256), (1024, 512), (1024, 256), (512, 256), (256, 128))


def _word_config(
    r: compute.Compute,
    t: targets.Target,
    tl: _Tiling,
    shape: tuple[int, int, int],
    stored: Stored,
    block_shape: Sequence[int] | None,
    interpret: bool,
    x_dtype: str,
    scaling: Scaling | None,
    out: str,
    codebook: KernelCodebook | None,
) -> Config:
    """The :class:`Config` of a call :func:`emulate.pallas.word_step.applies` to: its blocks
    (x spans K, resident), checked against VMEM."""
    m, n, k = shape
    bm, bn, bk = _blocks(r, t, tl, shape, block_shape)
    xb = np.dtype(x_dtype).itemsize
    pieces = codebook.pieces if codebook is not None and r.rhs_compute == "bfloat16" else 1

    bits = 8 * stored.nbytes // stored.group
    dot = word_step.dot_rows(r.target)

    def vmem_of(bn: int, bk: int, bm: int = bm) -> int:
        return word_step.vmem_bytes(bm, bn, bk, k, xb, scaling, tl.highest, pieces, bits, dot)

    if block_shape is None:
        for cbk, cbn in _WORD_BLOCKS:
            bn = min(_round_up(n, _LANES), cbn)
            bk = min(_round_up(k, max(word_groups.unit(None), tl.k_multiple)), cbk)
            if vmem_of(bn, bk) <= tl.cap:
                break
        if m > bm and word_step.partial_rows(r, scaling, 1) == 1:
            # one group a dot: as long a row block as fits (the weight is read once per
            # row block, :func:`_long_bm`)
            for b in sorted({min(c, _round_up(m, tl.x_sub)) for c in _LONG_BM}, reverse=True):
                if b > bm and vmem_of(bn, bk, b) <= tl.cap:
                    bm = b
                    break
    kp = _round_up(k, bk)
    vmem = vmem_of(bn, bk)
    if t.vmem_capacity_bytes and vmem > t.vmem_capacity_bytes:
        raise ValueError(
            f"block_shape: ({bm}, {bn}, {bk}) needs about {vmem} bytes of VMEM, more "
            f"than {t.name}'s {t.vmem_capacity_bytes}; use smaller blocks"
        )
    return Config(
        compute=r,
        m=m,
        n=n,
        k=k,
        bm=bm,
        bn=bn,
        bk=bk,
        stored=stored,
        w_passthrough=False,
        limbs=False,
        x_resident=kp > bk,
        interpret=interpret,
        vmem_bytes=vmem,
        vmem_limit=_scoped_limit(t, vmem),
        x_dtype=x_dtype,
        scaling=scaling,
        out=out,
        codebook=codebook,
        word_step=True,
    )
