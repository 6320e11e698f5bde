"""``emulate.pallas.dot``: a matmul for values loaded inside a Pallas TPU kernel.

A kernel written with ``jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)``
on int8 tiles lowers to a ``tpu.matmul`` with int8 operands, which Mosaic rejects on a
chip whose matrix unit has no int8 path (``Unsupported matmul RHS type on target:
'vector<256x256xi8>'`` on a TPU v4 or v7x). Written with :func:`dot`, the same kernel
applies the target's rules when it is traced: the ``tpu.matmul`` keeps int8 operands on a
TPU v5e / v6e and gets exactly decoded bf16 operands (f32 sums, exact for integers
because every chunk of at most 1024 int8 products fits f32's 24 bits) on a v4 or v7x.

What the decode adds to a kernel's VMEM: :func:`dot_vmem_bytes` says it for given operands
(0 for a native pair; otherwise ``(4 + compute bytes)`` per decoded element, plus ``4 * M *
N`` for an exact sum in f32). Raise ``vmem_limit_bytes`` (``pltpu.CompilerParams``) by as
much, or shrink the blocks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.formats import FormatLike
from emulate.numerics import accumulate
from emulate.pallas import compute
from emulate.targets import TargetLike

__all__ = ["dot", "dot_vmem_bytes"]


def _format_of(x: jax.Array, arg: str) -> formats.Format:
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(
            f"{arg}: expected an array loaded from a ref (x_ref[...]), got {type(x).__name__}"
        )
    try:
        return formats.get(np.dtype(x.dtype))
    except ValueError:
        raise TypeError(
            f"{arg}: dtype {np.dtype(x.dtype).name} is not a matmul operand type; accepted: "
            f"{', '.join(formats.MATMUL_OPERANDS)}"
        ) from None


_MATMUL_DN = (((1,), (0,)), ((), ()))
_LANES = 128


def _dimension_numbers(dn: Any) -> Any:
    """``dn`` as ``(((ca,), (cb,)), ((), ()))`` with ``ca, cb`` in 0, 1 (2-D operands)."""
    if dn is None:
        return _MATMUL_DN
    try:
        (ca, cb), (ba, bb) = dn
        ca, cb, ba, bb = (tuple(int(d) for d in x) for x in (ca, cb, ba, bb))
    except (TypeError, ValueError):
        raise TypeError(
            "dimension_numbers: expected ((lhs_contracting, rhs_contracting), (lhs_batch, "
            f"rhs_batch)) of int sequences, as lax.dot_general takes them; got {dn!r}"
        ) from None
    if ba or bb:
        raise NotImplementedError(
            f"dimension_numbers: emulate.pallas.dot contracts 2-D tiles without batch "
            f"dimensions, got batch dimensions {ba} and {bb}; loop over the batch in the "
            "kernel (or its grid)"
        )
    if len(ca) != 1 or len(cb) != 1 or ca[0] not in (0, 1) or cb[0] not in (0, 1):
        raise ValueError(
            "dimension_numbers: expected one contracting dimension of each 2-D operand, 0 "
            f"or 1 (((1,), (0,)) for a @ b, ((1,), (1,)) for a @ b.T), got {ca} and {cb}"
        )
    return ((ca[0],), (cb[0],)), ((), ())


def _checked(a: Any, b: Any, dimension_numbers: Any) -> tuple[formats.Format, formats.Format, Any]:
    """The operands' formats and the dimension numbers, after :func:`dot`'s checks."""
    fa, fb = _format_of(a, "a"), _format_of(b, "b")
    for arg, x in (("a", a), ("b", b)):
        if len(x.shape) != 2:
            raise ValueError(
                f"{arg}: emulate.pallas.dot takes 2-D operands (M, K) @ (K, N), got shape "
                f"{tuple(x.shape)}"
            )
    dn = _dimension_numbers(dimension_numbers)
    (ca,), (cb,) = dn[0]
    if a.shape[ca] != b.shape[cb]:
        raise ValueError(
            f"a, b: a's K ({a.shape[ca]}) differs from b's K ({b.shape[cb]}); shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)}, contracting dimensions {ca} and {cb}"
        )
    return fa, fb, dn


def _decode_step(r: compute.Compute, fa: formats.Format, fb: formats.Format, k: int) -> int:
    """How much of K to decode at a time: for K longer than the target's MXU width, that
    width if it divides K, else 128 if that does; else all of K, as for 4-bit operands
    (both formats must take a byte or more). The decoded copies and temporaries alive at
    once are then those of one K-slice (issue 28: the (128, 512) x (512, 256) int8 blocks
    of pytorch/xla's quantized matmul took 314368 bytes more scoped VMEM on a TPU v4, not
    556032, and fit the kernel's own limit)."""
    if min(fa.bits, fb.bits) < 8:
        return max(k, 1)
    mxu = targets.get(r.target).mxu_column_size or _LANES
    if k > mxu:
        for width in (mxu, _LANES):
            if k % width == 0:
                return width
    return max(k, 1)


def _k_slice(x: jax.Array, start: int, step: int, axis: int, k: int) -> jax.Array:
    return x if step >= k else lax.slice_in_dim(x, start, start + step, axis=axis)


#: The share of a generation's scoped VMEM (Mosaic's default limit, 16 MiB, or less VMEM)
#: that one output tile's decoded slices and partial sums may take: the kernel's own
#: blocks and buffers take the rest.
_TILE_SHARE = 8
_SCOPED_VMEM = 16 << 20


def _tile_bytes(mb: int, nb: int, step: int, r: compute.Compute) -> int:
    """VMEM of one output tile (mb, nb): the K-slices of both operands decoded (the copy
    and the 32-bit temporaries), and its partial and running sums (32-bit each)."""
    cx = 4 + jnp.dtype(r.lhs_compute).itemsize
    cy = 4 + jnp.dtype(r.rhs_compute).itemsize
    return cx * mb * step + cy * step * nb + 8 * mb * nb


def _cuts(size: int, unit: int) -> list[int]:
    """The block lengths that cut ``size`` into equal blocks of whole ``unit``s, longest
    first (``size`` alone where it is no multiple of ``unit``)."""
    if size % unit:
        return [size]
    return [b for b in range(size, 0, -unit) if size % b == 0]


def _output_tile(r: compute.Compute, m: int, n: int, step: int) -> tuple[int, int]:
    """The (rows, columns) of the output tiles :func:`dot` contracts one at a time: the
    whole (m, n) where its decoding fits the budget (:data:`_TILE_SHARE` of the target's
    scoped VMEM), else the largest tiles of whole 128-lane column blocks and 32-row
    blocks (a sublane tile of 8-bit values) that do, columns cut first. So a large block
    decoded on a generation of 16 MiB of VMEM (v2 to v4: 1024 x 1024 int8 tiles took
    23-26 MiB decoded whole) stays within it."""
    vmem = targets.get(r.target).vmem_capacity_bytes or _SCOPED_VMEM
    budget = min(vmem, _SCOPED_VMEM) // _TILE_SHARE
    rows, cols = _cuts(m, 32), _cuts(n, _LANES)
    for mb in rows:
        for nb in cols:
            if _tile_bytes(mb, nb, step, r) <= budget:
                return mb, nb
    return rows[-1], cols[-1]


def _rows_first(x: jax.Array) -> jax.Array:
    """``x.T`` for a (K, M) operand narrower than 16 bits, transposed as 32-bit values:
    Mosaic transposes 8-bit values (4-bit on v7x) only in compatibility mode ("Unsupported
    transpose with element type bitwidth smaller than supported minimum"), and with it
    off a matmul whose narrow LHS is contracted along dimension 0 crashed the compiler
    (libtpu 0.0.42.1)."""
    dt = jnp.dtype(x.dtype)
    if jnp.issubdtype(dt, jnp.integer):
        return x.astype(jnp.int32).T.astype(dt)
    unsigned = jnp.uint8 if dt.itemsize == 1 and formats.get(dt).bits == 8 else jnp.uint4
    u = lax.bitcast_convert_type(x, unsigned)
    return lax.bitcast_convert_type(u.astype(jnp.int32).T.astype(unsigned), dt)


def _is_narrow(x: jax.Array) -> bool:
    return formats.get(np.dtype(x.dtype)).bits < 16


def _lhs_as_rows(x: jax.Array, dn: Any) -> tuple[jax.Array, Any]:
    """``x`` and the dimension numbers with a narrow LHS contracted along dimension 0 made
    (M, K) (:func:`_rows_first`); anything else as it is."""
    (ca,), (cb,) = dn[0]
    if ca == 0 and _is_narrow(x):
        return _rows_first(x), (((1,), (cb,)), ((), ()))
    return x, dn


def _contract_tile(a: jax.Array, b: jax.Array, r: compute.Compute, dn: Any, step: int) -> jax.Array:
    """One output tile: K decoded a slice of ``step`` at a time, the slices' products
    summed as they come (each partial dies at once)."""
    (ca,), (cb,) = dn[0]
    k = a.shape[ca]
    total = None
    for start in range(0, k, step) if k else (0,):  # one piece when K is not cut
        x = compute.decode_values(_k_slice(a, start, step, ca, k), r.lhs_compute, r.lhs_scale)
        y = compute.decode_values(_k_slice(b, start, step, cb, k), r.rhs_compute, r.rhs_scale)
        x, xdn = _lhs_as_rows(x, dn)
        if r.exact:  # int32, wrapping as XLA's integer dots do
            part = compute.exact_dot(x, y, r, xdn)
        else:
            part = compute.float_dot(x, y, r.precision, xdn)
        total = part if total is None else total + part
    assert total is not None
    return total


def _free_slice(x: jax.Array, start: int, size: int, contracting: int) -> jax.Array:
    axis = 1 - contracting
    if size >= x.shape[axis]:
        return x
    return lax.slice_in_dim(x, start, start + size, axis=axis)


def _tiled(a: jax.Array, b: jax.Array, r: compute.Compute, dn: Any, step: int) -> jax.Array:
    """The decoded contraction, one output tile (:func:`_output_tile`) at a time."""
    (ca,), (cb,) = dn[0]
    m, n = a.shape[1 - ca], b.shape[1 - cb]
    mb, nb = _output_tile(r, m, n, step)
    rows = []
    for m0 in range(0, m, mb) if m else (0,):
        cols = [
            _contract_tile(_free_slice(a, m0, mb, ca), _free_slice(b, n0, nb, cb), r, dn, step)
            for n0 in (range(0, n, nb) if n else (0,))
        ]
        rows.append(cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=1))
    return rows[0] if len(rows) == 1 else jnp.concatenate(rows, axis=0)


def dot(
    a: jax.Array,
    b: jax.Array,
    *,
    preferred_element_type: FormatLike | None = None,
    target: TargetLike = None,
    precision: lax.PrecisionLike = None,
    dimension_numbers: Any = None,
) -> jax.Array:
    """``a @ b`` for 2-D values inside a Pallas TPU kernel, lowered the way ``target`` runs it.

    Call it where a kernel would call ``jnp.dot`` on loaded tiles. At trace time it looks
    up how ``target``'s matrix unit runs the operand pair (:func:`emulate.plan`, corrected
    for Pallas' signed-integer dot): a native pair becomes one ``tpu.matmul`` of the
    operands as they are; any other pair is decoded exactly, in vector registers, into the
    type the unit takes (int8 after a power-of-two scaling, bf16 or f32) and contracted
    with an int32 or f32 accumulator, in K-chunks short enough that exact-class sums stay
    exact. The decoding goes a K-slice of the MXU width at a time, summed as it goes, so
    that the kernel holds one slice's decoded copies (:func:`dot_vmem_bytes`); a large
    block is contracted one output tile at a time, so that the slices and partial sums of
    a tile stay within an eighth of the generation's scoped VMEM (16 MiB at most).

    Args:
      a: an (M, K) array loaded from a ref ((K, M) if ``dimension_numbers`` contract its
        dimension 0): int8, uint8, int4, uint4, a float8 type, bfloat16, float16 or
        float32.
      b: a (K, N) array ((N, K) if ``dimension_numbers`` contract its dimension 1),
        likewise.
      preferred_element_type: the result type, as for ``lax.dot_general`` (default: what
        ``lax.dot_general`` returns for the pair, e.g. int8 for int8 x int8: pass
        ``jnp.int32`` for the int32 sum).
      target: a TPU target name or :class:`emulate.targets.Target`; default the current
        one (``emulate.target(...)``, ``EMULATE_TARGET``), read when the kernel is traced.
        JAX caches traces: pass it explicitly when one process traces a kernel for several
        targets.
      precision: passed to native float dots (decoded operands are exact; f32 ones are
        multiplied at ``Precision.HIGHEST`` where bf16 cannot hold their values, in one
        bf16 pass where it can).
      dimension_numbers: None (``a @ b``), or ``lax.dot_general``'s with one contracting
        dimension per operand and no batch dimensions: ``(((1,), (1,)), ((), ()))`` takes
        ``b`` as stored (N, K), ``a @ b.T``, so that a transposed narrow operand is
        contracted as it is, with no transpose (which Mosaic converts only in
        compatibility mode for narrow types). A narrow ``a`` stored (K, M) (8 or 4 bits
        as it reaches the matrix unit) is transposed as 32-bit values first: Mosaic
        transposes narrower ones only in compatibility mode.

    Returns:
      An (M, N) array of the result type (M: ``a``'s free dimension, N: ``b``'s). Integer
      pairs: the int32 sum (wrapping past 2**31 as XLA's integer dots do) converted to the
      result type; other exact-class pairs (float4_e2m1fn with integers or itself): the
      exact sum rounded once; the other float pairs: f32 accumulation, within the bound of
      mode "fast".

    Raises:
      TypeError: an operand that is not an array of a matmul operand type, or an integer
        result type for float operands.
      ValueError: operands that are not 2-D or whose K differ, dimension numbers that do
        not contract one dimension of each, or an unknown target.
      NotImplementedError: dimension numbers with batch dimensions.
    """
    fa, fb, dn = _checked(a, b, dimension_numbers)
    r = compute.in_kernel(fa, fb, target=target, preferred_element_type=preferred_element_type)
    out = jnp.dtype(formats.get(r.out).dtype)
    if r.method == "native":
        a, dn = _lhs_as_rows(a, dn)
        acc = compute.float_dot(a, b, precision if precision is not None else r.precision, dn)
        return accumulate.round_accumulator(acc, r.out) if acc.dtype != out else acc
    (ca,), (cb,) = dn[0]
    step = _decode_step(r, fa, fb, a.shape[ca])
    total = _tiled(a, b, r, dn, step)
    if not r.exact:
        return accumulate.round_accumulator(total, r.out) if total.dtype != out else total
    if formats.get(r.out).is_integer:
        return accumulate.round_accumulator(total, r.out) if out != jnp.int32 else total
    hi, lo = accumulate.split(total)
    return accumulate.round_limbs(hi, lo, r.scale, r.out)


def dot_vmem_bytes(
    a: Any,
    b: Any,
    *,
    preferred_element_type: FormatLike | None = None,
    target: TargetLike = None,
    dimension_numbers: Any = None,
) -> int:
    """The VMEM, in bytes, that :func:`dot` on ``a`` and ``b`` adds to a kernel: raise the
    kernel's ``vmem_limit_bytes`` (``pltpu.CompilerParams``) by this much.

    Takes :func:`dot`'s arguments (arrays, or anything with ``shape`` and ``dtype``, such as
    ``jax.ShapeDtypeStruct``) and applies the same checks. A native pair adds nothing. Each
    decoded operand adds ``(4 + c) * size`` bytes: its copy in the compute type (``c`` = 1
    for int8, 2 for bf16, 4 for f32) and the decode's 32-bit temporaries; an operand
    already of the compute type (f32 activations on an f32 route) adds nothing. An exact
    sum in f32 (an exact-class pair on a bf16 / f32 route) adds ``4 * M * N`` for its
    int32 copy.

    It is an upper estimate from the decode's steps (whole tiles, though :func:`dot`
    decodes K a slice at a time), checked against the real compiler
    (tests/pallas/test_kernel_dot_vmem.py: pytorch/xla's quantized matmul with ``dot`` in
    place of its ``lax.dot_general``, int8 x int8, against the same kernel's plain dot on
    a TPU v5e, which runs the pair natively): Mosaic used 24-41% of it on a v4, 62-100% on
    a v2 or v3 (whose Mosaic runs f32 dots only).

    Raises:
      TypeError, ValueError, NotImplementedError: as :func:`dot`.
    """
    fa, fb, dn = _checked(a, b, dimension_numbers)
    r = compute.in_kernel(fa, fb, target=target, preferred_element_type=preferred_element_type)
    if r.method == "native":
        return 0
    total = 0
    for x, f, to, scale in (
        (a, fa, r.lhs_compute, r.lhs_scale),
        (b, fb, r.rhs_compute, r.rhs_scale),
    ):
        if f.name == to and not scale:  # decode_values returns it as it is
            continue
        total += (4 + jnp.dtype(to).itemsize) * int(np.prod(x.shape))
    if r.exact and r.lhs_compute != "int8":
        (ca,), (cb,) = dn[0]
        total += 4 * int(a.shape[1 - ca]) * int(b.shape[1 - cb])
    return total
