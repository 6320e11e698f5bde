"""How an operand pair computes inside a kernel, and the building blocks shared by
:mod:`emulate.pallas.kernel_dot` and the matmul kernel. (Which back end runs a contraction,
a kernel or XLA, is :mod:`emulate.routing`'s; this is the compute inside the kernel.)

* :func:`in_kernel`: how one operand pair computes inside a Pallas TPU kernel on a target
  (a :class:`Compute`). It is :func:`emulate.plan` with one kernel-level correction: of
  the native integer pairs only int8 x int8 is kept. Pallas TPU ``dot`` treats every
  integer operand as signed, so uint8 and uint4 values above 127 / 7 would be misread; and
  XLA's CPU backend, which runs kernels in interpret mode, cannot compile a dot of int4
  operands. Those pairs compute as int8 when their values fit int8 and as bf16 (or f32)
  otherwise. And a pair goes to ``tpu.matmul`` as it is (native, or as int8) only where Mosaic
  compiles it with compatibility mode off (:meth:`emulate.targets.Target.compiles`, the
  recorded probe of the real compiler): never a mixed pair, never int8 x int8 on a v7x,
  whose compatibility mode would sum it in f32.
* :func:`decode_codes` / :func:`decode_values`: exact decoding of loaded tiles, on 32-bit
  words, with the bit formulas of :mod:`emulate.numerics.codecs` (no gathers, no lookup tables,
  no conversion of a low-precision type by the compiler), optionally scaled by ``2**k``
  so that exact-class values become integers.
* :func:`exact_dot`: a tile contraction whose partial sums stay exact (K cut into chunks
  of ``Compute.k_chunk``), returning the int32 sum in units of the products' quantum.
* :func:`refuse`: the one NotImplementedError for a part of a QArray weight no kernel
  decodes (the codebooks, zero points, offsets and scales the kernel modules check).

Everything here runs on values already loaded from refs, inside a kernel (or outside one:
it is plain ``jnp``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
from jax import lax

from emulate import formats, targets
from emulate.formats import Format, FormatLike
from emulate.numerics import codecs
from emulate.planning.exactness import F32_EXACT, exact_class, exact_scale, max_quanta
from emulate.planning.plan import plan

__all__ = [
    "Compute",
    "in_kernel",
    "decode_codes",
    "decode_values",
    "exact_dot",
    "exact_limit",
    "float_dot",
    "refuse",
]

_LANES = 128
_MATMUL_DN = (((1,), (0,)), ((), ()))


@dataclasses.dataclass(frozen=True)
class Compute:
    """How ``lhs x rhs`` computes inside a kernel on ``target``.

    Attributes:
      target, lhs, rhs, out: names (``out`` is the result format).
      method: "native", "int8", "bf16" or "f32" (as :class:`emulate.Plan`).
      lhs_compute, rhs_compute: the element types ``tpu.matmul`` sees.
      accumulator: "int32" or "float32".
      lhs_scale, rhs_scale: exact-class operands are decoded as ``value * 2**scale``
        (integers); the sum is scaled back by ``2**-(lhs_scale + rhs_scale)`` once.
      k_chunk: the longest contraction one float dot may take and still return an exact
        sum (exact class computed in bf16 or f32); None where no cut is needed.
      exact: whether the result is the exact sum rounded once.
      note: why the compute differs from :func:`emulate.plan`'s, or "".
    """

    target: str
    lhs: str
    rhs: str
    out: str
    method: str
    lhs_compute: str
    rhs_compute: str
    accumulator: str
    lhs_scale: int
    rhs_scale: int
    k_chunk: int | None
    exact: bool
    note: str = ""

    @property
    def scale(self) -> int:
        return self.lhs_scale + self.rhs_scale

    @property
    def precision(self) -> lax.Precision | None:
        """HIGHEST for f32 operands whose values bf16 cannot hold (a TPU otherwise
        multiplies them in one bf16 pass); None (one pass) when both formats' values are
        exact in bf16, as every decoded low-precision value is (scaled by ``2**scale`` or
        not): the pass then rounds nothing and each product is exact in f32 (on a TPU
        v5e, computes for v2 gave the int64 sums of int8 tiles, K = 2048, and the same bits
        as HIGHEST for bf16 x e4m3fn, fp4 and e5m2). On TPU v2 and v3, whose Mosaic runs
        f32 dots only, HIGHEST made the kernel add 2 to 3 times the VMEM of one pass."""
        if self.lhs_compute != "float32":
            return None
        return None if _bf16_exact(self.lhs) and _bf16_exact(self.rhs) else lax.Precision.HIGHEST


def _bf16_exact(fmt: FormatLike) -> bool:
    """Whether bf16 holds every value of ``fmt`` exactly."""
    f = formats.get(fmt)
    return f.name == "bfloat16" or "bfloat16" in f.exact_in


def _widest_float(t: targets.Target, lhs: Format, rhs: Format) -> str:
    """bf16 if the target has bf16 x bf16 and both formats fit bf16, else f32."""
    fits = _bf16_exact(lhs) and _bf16_exact(rhs)
    native = t.compiles("bfloat16", "bfloat16")
    return "bfloat16" if fits and native else "float32"


def in_kernel(
    lhs: FormatLike,
    rhs: FormatLike,
    *,
    target: targets.TargetLike = None,
    preferred_element_type: FormatLike | None = None,
) -> Compute:
    """How ``lhs x rhs`` computes inside a kernel on ``target`` (a TPU profile or any
    other).

    Raises:
      ValueError, TypeError, NotImplementedError: as :func:`emulate.plan`.
    """
    t = targets.current_target(target)
    a, b = formats.get(lhs), formats.get(rhs)
    p = plan(a, b, target=t, preferred_element_type=preferred_element_type)
    exact = exact_class(a, b)
    ka, kb = (exact_scale(a) or 0, exact_scale(b) or 0) if exact else (0, 0)
    prod = max_quanta(a, ka) * max_quanta(b, kb) if exact else 0
    method, lc, rc, note = p.method, p.lhs_compute, p.rhs_compute, ""
    if method == "native" and a.is_integer and (a.name, b.name) != ("int8", "int8"):
        if not a.signed or not b.signed:
            note = (
                f"Pallas TPU dot reads integer operands as signed, so native {a.name} x "
                f"{b.name} would misread the values above {int(a.max) // 2}"
            )
        else:
            note = (
                f"{a.name} x {b.name} is widened to int8 (exactly): XLA's CPU backend, which "
                "runs kernels in interpret mode, cannot compile a dot of 4-bit integers"
            )
        if a.max <= 127 and b.max <= 127 and a.min >= -128 and b.min >= -128:
            method, lc, rc = "int8", "int8", "int8"
        else:
            lc = rc = _widest_float(t, a, b)
            method = "bf16" if lc == "bfloat16" else "f32"
    # A kernel must not depend on compatibility mode: it converts what the unit lacks (int8
    # to bf16 with an f32 sum on v7x, exact only below 2**24) or mixed pairs, behind our back.
    if method in ("int8", "native") and (lc != rc or not t.compiles(lc, rc)):
        note = (
            f"Mosaic compiles {lc} x {rc} on {t.name} only in compatibility mode, which "
            "converts the operands behind the kernel's back; decoded instead"
        )
        lc = rc = _widest_float(t, a, b)
        method = "bf16" if lc == "bfloat16" else "f32"
    if method in ("int8", "native") and exact:
        acc, k_chunk = "int32", None
    elif exact:
        acc, k_chunk = "float32", F32_EXACT // prod
    else:
        acc, k_chunk = formats.dot_accumulator(a, b), None
    return Compute(
        target=t.name,
        lhs=a.name,
        rhs=b.name,
        out=p.out,
        method=method,
        lhs_compute=lc,
        rhs_compute=rc,
        accumulator=acc,
        lhs_scale=ka,
        rhs_scale=kb,
        k_chunk=k_chunk,
        exact=exact,
        note=note,
    )


def decode_codes(codes: jax.Array, fmt: FormatLike, to: str, scale: int = 0) -> jax.Array:
    """Decode a tile of raw codes (any integer dtype, the code in the low bits) into ``to``.

    ``to`` is "bfloat16", "float32" or "int8"; the value is multiplied by ``2**scale``
    first (exactly: exact-class values become integers, int8 holds every one of them).
    Only 32-bit integer and f32 operations are used, plus the final conversion.
    """
    f = formats.get(fmt)
    c = codes.astype(jnp.int32) & f.code_mask
    if f.is_integer:
        return _int_to(codecs.decode_int_bits(c, f), to)
    bits = codecs.decode_float_bits(c, f)
    v = lax.bitcast_convert_type(bits, jnp.float32)
    if scale:
        v = v * jnp.float32(2.0**scale)
    if to == "int8":
        return v.astype(jnp.int32).astype(jnp.int8)
    return v.astype(to)


def decode_values(x: jax.Array, to: str, scale: int = 0) -> jax.Array:
    """Decode loaded values of any XLA-holdable format into ``to`` (times ``2**scale``)."""
    f = formats.get(x.dtype)
    if x.dtype == jnp.dtype(to) and not scale:
        return x
    if not f.is_low_precision:  # bfloat16, float16, float32: exact widening only
        return x.astype(jnp.float32).astype(to) if to != "float32" else x.astype(to)
    if f.is_integer:
        return _int_to(x.astype(jnp.int32), to)
    if f.bits == 8:
        codes = lax.bitcast_convert_type(x, jnp.uint8)
    else:  # float4_e2m1fn: bitcast through the 4-bit container
        codes = lax.bitcast_convert_type(x, jnp.uint4)
    return decode_codes(codes, f, to, scale)


# 2**23 + 2**22: bitcast to f32, 0x4B400000 + v is the float 2**23 + 2**22 + v for every
# |v| < 2**22 (one ulp of [2**23, 2**24) is 1), so subtracting this constant is exact.
_MAGIC_BITS = 0x4B400000
_MAGIC = 12582912.0


def _int_to(v: jax.Array, to: str) -> jax.Array:
    """int32 values (of at most 8 bits) into int8, f32 or bf16, exactly.

    No integer-to-float conversion: Mosaic folds ``int32 -> f32`` after a sign extension
    from 8 bits into an 8-bit conversion, and ``int32 -> f32 -> bf16`` into one int32 ->
    bf16 conversion, and v2 to v7x convert only 32-bit integers to f32 without
    compatibility mode ("integer-to-float conversions can only happen on 32-bit values").
    The f32 value is built from its bits instead (an int32 add, a bitcast, an f32
    subtraction: exact for |v| < 2**22), then rounded (exactly) to bf16 if asked.
    """
    if to == "int8":
        return v.astype(jnp.int8)
    bits = v.astype(jnp.int32) + jnp.int32(_MAGIC_BITS)
    f = lax.bitcast_convert_type(bits, jnp.float32) - jnp.float32(_MAGIC)
    return f if to == "float32" else f.astype(to)


def float_dot(
    a: jax.Array,
    b: jax.Array,
    precision: lax.PrecisionLike = None,
    dimension_numbers: Any = _MATMUL_DN,
) -> jax.Array:
    """``a @ b`` (2-D operands contracted as ``dimension_numbers`` say: one axis each, no
    batch axes) with an f32 (float operands) or int32 (integer operands) accumulator."""
    acc = jnp.int32 if jnp.issubdtype(a.dtype, jnp.integer) else jnp.float32
    return lax.dot_general(a, b, dimension_numbers, precision=precision, preferred_element_type=acc)


def exact_dot(
    a: jax.Array, b: jax.Array, r: Compute, dimension_numbers: Any = _MATMUL_DN
) -> jax.Array:
    """The int32 sum of ``a @ b`` for decoded exact-class operands (integers in value),
    contracted as :func:`float_dot`.

    Int8 operands accumulate in int32 (wrapping past 2**31 as XLA's integer dots do). Float
    operands are contracted in chunks of at most ``r.k_chunk`` along K (rounded down to a
    multiple of 128 lanes), each exact in f32, converted to int32 exactly and summed in
    int32.
    """
    if a.dtype == jnp.int8:
        return float_dot(a, b, None, dimension_numbers)
    (ca,), (cb,) = dimension_numbers[0]
    k = a.shape[ca]
    chunk = r.k_chunk or k
    if chunk < k and chunk >= _LANES:  # lane-aligned slices of the loaded tiles
        chunk = chunk // _LANES * _LANES
    total = None
    for start in range(0, k, chunk):
        stop = min(start + chunk, k)
        part = float_dot(
            lax.slice_in_dim(a, start, stop, axis=ca),
            lax.slice_in_dim(b, start, stop, axis=cb),
            r.precision,
            dimension_numbers,
        ).astype(jnp.int32)
        total = part if total is None else total + part
    if total is None:  # K == 0
        return jnp.zeros((a.shape[1 - ca], b.shape[1 - cb]), jnp.int32)
    return total


def exact_limit(r: Compute) -> int:
    """The largest |product| in quanta (``2**-(lhs_scale + rhs_scale)``)."""
    return max_quanta(r.lhs, r.lhs_scale) * max_quanta(r.rhs, r.rhs_scale)


def refuse(arg: str, what: str, why: str = "") -> NoReturn:
    """Raise the NotImplementedError for argument ``arg``, a QArray weight with a part
    (``what``) that :func:`emulate.pallas.matmul` does not decode in the kernel; ``why``:
    what is built instead, or why not (optional)."""
    raise NotImplementedError(
        f"{arg}: emulate.pallas.matmul does not decode {what} in the kernel"
        + (f" ({why})" if why else "")
        + "; use emulate.dot_general for this QArray"
    )
