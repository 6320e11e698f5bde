"""The programs tests/test_tpu_compile.py compiles with the real TPU compiler.

Every job function lives here, at module level, so that :func:`emulate.compiler.check_many`
can hand it to its compat-off subprocess by reference (``functools.partial`` of these with
plain arguments pickles). Each builds one small program: one ``pallas_call`` for the
Pallas cases, one emulate front-end call for the XLA-level ones and for the kernel route's
(a prepared weight in ``emulate.matmul``, prepared experts in ``emulate.ragged_dot``).
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import emulate
import emulate.pallas
from emulate import formats

# Shapes: small, one block. Pallas kernels: M = 32 (the sublane tiling of int8 tiles), N =
# 128 lanes, K = 128 lanes times the codes per byte group of a packed weight (1, 2 for
# 4-bit formats, 4 for float6). XLA-level programs: (16, 128) x (128, 128).
M, N = 32, 128
XLA_M, XLA_K = 16, 128


def pallas_k(rhs: str) -> int:
    """K of the Pallas cases with weight format ``rhs``."""
    bits = formats.get(rhs).bits
    return 128 * (4 if bits == 6 else 2 if bits == 4 else 1)


# Formats XLA cannot hold (float6) and the sub-byte ones pallas.matmul takes packed.
_PACKED = {"int4", "uint4", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"}
# Of those, the ones pallas.matmul gets as emulate.pallas.prepare_weight returns them (a
# traced float6 Packed weight, laid out again on every call, is refused in a TPU program).
_PREPARED = {"int4", "float4_e2m1fn", "float6_e3m2fn", "float6_e2m3fn"}

DN = (((1,), (0,)), ((), ()))


def out_format(lhs: str, rhs: str) -> str:
    """int32 for two integer operands, float32 otherwise."""
    both_int = formats.get(lhs).is_integer and formats.get(rhs).is_integer
    return "int32" if both_int else "float32"


def _is_wide(fmt: str) -> bool:
    return not formats.get(fmt).is_low_precision


# --------------------------------------------------------------------------------------
# emulate.pallas.matmul


def matmul_specs(lhs: str, rhs: str) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """x as its dtype (wide) or uint8 codes (low precision); w as its dtype, or uint8
    codes for 8-bit formats XLA holds, or packed bytes along K for sub-byte formats."""
    k = pallas_k(rhs)
    if _is_wide(lhs):
        x = jax.ShapeDtypeStruct((M, k), jnp.dtype(lhs))
    else:
        x = jax.ShapeDtypeStruct((M, k), jnp.uint8)
    f = formats.get(rhs)
    if rhs in _PACKED:
        w = jax.ShapeDtypeStruct((k * f.bits // 8, N), jnp.uint8)
    else:
        w = jax.ShapeDtypeStruct((k, N), jnp.dtype(f.dtype))
    return x, w


def pallas_matmul(x: jax.Array, w: Any, *, lhs: str, rhs: str, target: str) -> jax.Array:
    """``emulate.pallas.matmul`` compiled for TPU (interpret off)."""
    if rhs in _PREPARED:  # the layout users keep (same bytes: one K-planar tile)
        w = emulate.pallas.KernelWeight(w, rhs, pallas_k(rhs))
    elif rhs in _PACKED:  # emulate.pack's layout: x in column planes
        w = emulate.Packed(w, rhs, -2, pallas_k(rhs))
    return emulate.pallas.matmul(
        x,
        w,
        target=target,
        out_dtype=out_format(lhs, rhs),
        interpret=False,
        x_format=None if _is_wide(lhs) else lhs,
    )


def ragged_specs() -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """bf16 x (5, 700) and a K-planar int4 weight (700, 130): three tiles of 256 rows."""
    return (
        jax.ShapeDtypeStruct((5, 700), jnp.bfloat16),
        jax.ShapeDtypeStruct((384, 130), jnp.uint8),
    )


def pallas_matmul_ragged(x: jax.Array, w: jax.Array, *, target: str) -> jax.Array:
    """``emulate.pallas.matmul`` on shapes no block divides, K in two steps of 512."""
    kw = emulate.pallas.KernelWeight(w, "int4", 700)
    return emulate.pallas.matmul(
        x, kw, target=target, out_dtype="float32", interpret=False, block_shape=(16, 128, 512)
    )


#: QArray weights in pallas.matmul (issue 27): name -> (x type, element format, scale
#: format, block of the scales, tensor scale, result). K = 256 rows, N = 128 columns.
QARRAY_K = 256
QARRAY_SCHEMES = {
    # GPTQ / AWQ-like: K-planar int4, float16 scales (held as uint16 bits) per 128 rows and
    # column, applied per group in the kernel; a bfloat16 result stored by the kernel.
    "int4-g128-f16": ("bfloat16", "int4", "float16", (128, 1), False, "bfloat16"),
    # int8 x int8 per channel: exact int32 limbs, the scales applied outside the kernel.
    "int8xint8-channel-f16": ("int8", "int8", "float16", (QARRAY_K, 1), False, "bfloat16"),
    # OCP MXFP4: K-planar e2m1, e8m0 scales per 32 rows (8 groups a K step; the word step
    # where 32 rows of partial sums per group fit: v2 to 7x).
    "fp4-mx32-e8m0": ("bfloat16", "float4_e2m1fn", "float8_e8m0fnu", (32, 1), False, "float32"),
    # NVFP4: e4m3 scales per 16 rows and a tensor scale (the word step to v5p).
    "fp4-nv16-e4m3-tensor": ("bfloat16", "float4_e2m1fn", "float8_e4m3fn", (16, 1), True,
                             "float32"),
    # float8 with one bfloat16 scale per 128 rows for all columns, and a tensor scale.
    "e4m3-gN-bf16-tensor": ("bfloat16", "float8_e4m3fn", "bfloat16", (128, N), True,
                            "bfloat16"),
}  # fmt: skip


def qarray_specs(scheme: str) -> tuple[jax.ShapeDtypeStruct, ...]:
    """x, the codes as the kernel reads them (K-planar bytes for 4-bit), the scales as a
    KernelQWeight holds them, and a tensor scale where the scheme has one."""
    lhs, fmt, sf, block, ts, _ = QARRAY_SCHEMES[scheme]
    f = formats.get(fmt)
    x = jax.ShapeDtypeStruct((M, QARRAY_K), jnp.dtype(lhs))
    if f.bits == 4:
        codes = jax.ShapeDtypeStruct((QARRAY_K // 2, N), jnp.uint8)
    else:
        codes = jax.ShapeDtypeStruct((QARRAY_K, N), jnp.dtype(f.dtype))
    grid = (QARRAY_K // block[0], N // block[1])
    held = jnp.uint16 if sf == "float16" else jnp.dtype(formats.get(sf).dtype)
    specs = (x, codes, jax.ShapeDtypeStruct(grid, held))
    return specs + ((jax.ShapeDtypeStruct((), jnp.float32),) if ts else ())


def pallas_matmul_qarray(x, codes, scales, *ts, scheme: str, target: str) -> jax.Array:
    """``emulate.pallas.matmul`` on a prepared QArray weight (a KernelQWeight)."""
    _, fmt, sf, block, _, out = QARRAY_SCHEMES[scheme]
    if formats.get(fmt).bits == 4:
        codes = emulate.pallas.KernelWeight(codes, fmt, QARRAY_K)
    w = emulate.pallas.KernelQWeight(
        codes, scales, ts[0] if ts else None, fmt, sf, block, (QARRAY_K, N), np.dtype("float32")
    )
    return emulate.pallas.matmul(x, w, target=target, out_dtype=out, interpret=False)


# --------------------------------------------------------------------------------------
# emulate.pallas.dot, inside a one-block kernel


def dot_specs(lhs: str, rhs: str) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    return (
        jax.ShapeDtypeStruct((M, 128), jnp.dtype(formats.get(lhs).dtype)),
        jax.ShapeDtypeStruct((128, N), jnp.dtype(formats.get(rhs).dtype)),
    )


def _dot_kernel(a_ref: Any, b_ref: Any, o_ref: Any, *, target: str, out: str) -> None:
    o_ref[...] = emulate.pallas.dot(
        a_ref[...], b_ref[...], target=target, preferred_element_type=out
    )


def pallas_dot(a: jax.Array, b: jax.Array, *, lhs: str, rhs: str, target: str) -> jax.Array:
    """One ``pallas_call`` whose kernel is ``o = emulate.pallas.dot(a, b)``."""
    out = out_format(lhs, rhs)
    kernel = functools.partial(_dot_kernel, target=target, out=out)
    shape = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.dtype(out))
    return pl.pallas_call(kernel, out_shape=shape)(a, b)


# --------------------------------------------------------------------------------------
# XLA-level front ends


def xla_specs(lhs: str, rhs: str) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """Operands as their dtype, or uint8 codes for float6 (which XLA cannot hold)."""

    def spec(fmt: str, shape: tuple[int, int]) -> jax.ShapeDtypeStruct:
        f = formats.get(fmt)
        return jax.ShapeDtypeStruct(shape, jnp.dtype(f.dtype) if f.xla_storable else jnp.uint8)

    return spec(lhs, (XLA_M, XLA_K)), spec(rhs, (XLA_K, N))


def _codes_format(fmt: str) -> str | None:
    return None if formats.get(fmt).xla_storable else fmt


def dot_general(
    a: jax.Array, b: jax.Array, *, lhs: str, rhs: str, target: str, mode: str
) -> jax.Array:
    return emulate.dot_general(
        a,
        b,
        DN,
        preferred_element_type=out_format(lhs, rhs),
        target=target,
        mode=mode,
        lhs_format=_codes_format(lhs),
        rhs_format=_codes_format(rhs),
    )


# NHWC activations, HWIO kernel: a 3x3 convolution over a 6x6 image, 32 -> 16 features.
CONV_LHS, CONV_RHS = (1, 6, 6, 32), (3, 3, 32, 16)


def conv_specs(lhs: str, rhs: str) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    return (
        jax.ShapeDtypeStruct(CONV_LHS, jnp.dtype(formats.get(lhs).dtype)),
        jax.ShapeDtypeStruct(CONV_RHS, jnp.dtype(formats.get(rhs).dtype)),
    )


def conv(a: jax.Array, b: jax.Array, *, lhs: str, rhs: str, target: str, mode: str) -> jax.Array:
    return emulate.conv_general_dilated(
        a,
        b,
        (1, 1),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        preferred_element_type=out_format(lhs, rhs),
        target=target,
        mode=mode,
    )


def scaled_specs() -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    return (
        jax.ShapeDtypeStruct((XLA_M, XLA_K), jnp.float32),
        jax.ShapeDtypeStruct((XLA_K, N), jnp.float32),
    )


def scaled(x: jax.Array, w: jax.Array, *, scheme: str, target: str, mode: str) -> jax.Array:
    """Quantize both operands with ``emulate.mx.<scheme>`` (blocks along K) and contract
    the QArrays with ``emulate.dot_general``."""
    s = getattr(emulate.mx, scheme)
    qx = emulate.quantize(x, s, axis=1)
    qw = emulate.quantize(w, s, axis=0)
    return emulate.dot_general(
        qx, qw, DN, preferred_element_type=jnp.float32, target=target, mode=mode
    )


# --------------------------------------------------------------------------------------
# the polyfilled decoder-block example


@functools.cache
def _decoder() -> tuple[Any, Any, Any, jax.Array]:
    """(example module, graphdef, state treedef, x) of examples/decoder_block.py's block."""
    from flax import nnx

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "decoder_block.py"
    spec = importlib.util.spec_from_file_location("decoder_block", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    block, x = example.make()
    graphdef, state = nnx.split(block)
    leaves, treedef = jax.tree.flatten(state)
    return graphdef, treedef, leaves, x


def decoder_specs() -> tuple[list[jax.ShapeDtypeStruct], jax.ShapeDtypeStruct]:
    _, _, leaves, x = _decoder()
    specs = [jax.ShapeDtypeStruct(np.shape(v), v.dtype) for v in leaves]
    return specs, jax.ShapeDtypeStruct(x.shape, x.dtype)


def decoder(leaves: list[jax.Array], x: jax.Array, *, target: str) -> jax.Array:
    """The example's block, its weights as arguments, polyfilled for ``target``."""
    from flax import nnx

    graphdef, treedef, _, _ = _decoder()
    block = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    return emulate.polyfill(block, target=target)(x)


# --------------------------------------------------------------------------------------
# the kernel route (emulate.routing): a model's weights prepared once, route "auto"

#: a model's projection: K x N with int4 codes in groups of 32 rows, float16 scales
#: (Q4_K-like), prepared once for a TPU (emulate.prepare_weights: a K-planar KernelQWeight).
MODEL_K, MODEL_N = 1024, 512


@functools.cache
def _model_weight() -> Any:
    """The prepared weight as shapes (jax.eval_shape: nothing materialized)."""

    def prepare(w: jax.Array) -> Any:
        q = emulate.quantize(w, "int4", block_shape=32, axis=0, scale_fmt="float16")
        return emulate.prepare_weights(q, target="tpu_v5e")

    return jax.eval_shape(prepare, jax.ShapeDtypeStruct((MODEL_K, MODEL_N), jnp.float32))


def model_specs() -> tuple[jax.ShapeDtypeStruct, list[Any]]:
    """x (1, 1, K) bf16 (M = 1 decode behind a batch axis) and the weight's leaves."""
    return (
        jax.ShapeDtypeStruct((1, 1, MODEL_K), jnp.bfloat16),
        jax.tree.leaves(_model_weight()),
    )


def model_matmul(x: jax.Array, leaves: list[jax.Array], *, target: str) -> jax.Array:
    """``emulate.matmul(x, prepared weight)``, route "auto" on ``target``."""
    w = jax.tree.unflatten(jax.tree.structure(_model_weight()), leaves)
    with emulate.target(target):
        return emulate.matmul(x, w, preferred_element_type=jnp.float32)


#: gpt-oss-like MoE decode: MXFP4 experts (E, K, N), e2m1 codes packed along K with an e8m0
#: scale per 32 rows, prepared once; M rows routed among them by group sizes.
MOE_E, MOE_K, MOE_N, MOE_M = 8, 1024, 512, 8


@functools.cache
def _moe_experts() -> Any:
    """The prepared experts as shapes (jax.eval_shape: nothing materialized)."""

    def prepare(codes: jax.Array, scales: jax.Array) -> Any:
        packed = emulate.Packed(codes, "float4_e2m1fn", -2, MOE_K)
        q = emulate.QArray.from_parts(packed, scales, block_shape=(1, 32, 1))
        return emulate.prepare_weights(q, target="tpu_v5e")

    return jax.eval_shape(
        prepare,
        jax.ShapeDtypeStruct((MOE_E, MOE_K // 2, MOE_N), jnp.uint8),
        jax.ShapeDtypeStruct((MOE_E, MOE_K // 32, MOE_N), jnp.float8_e8m0fnu),
    )


def moe_specs() -> tuple[jax.ShapeDtypeStruct, list[Any], jax.ShapeDtypeStruct]:
    """x (M, K) bf16, the experts' leaves and the group sizes (E,) int32."""
    return (
        jax.ShapeDtypeStruct((MOE_M, MOE_K), jnp.bfloat16),
        jax.tree.leaves(_moe_experts()),
        jax.ShapeDtypeStruct((MOE_E,), jnp.int32),
    )


def moe_expert_bytes() -> int:
    """The prepared experts' bytes."""
    return sum(int(np.prod(v.shape)) * v.dtype.itemsize for v in jax.tree.leaves(_moe_experts()))


def moe_ragged_dot(
    x: jax.Array, leaves: list[jax.Array], group_sizes: jax.Array, *, target: str
) -> jax.Array:
    """``emulate.ragged_dot(x, prepared experts, group_sizes)``, route "auto" on ``target``."""
    w = jax.tree.unflatten(jax.tree.structure(_moe_experts()), leaves)
    return emulate.ragged_dot(x, w, group_sizes, preferred_element_type=jnp.float32, target=target)
