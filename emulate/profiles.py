"""The builtin hardware profiles as data, and the reading of JAX's TPU table.

One :class:`Row` per profile, in table order (:data:`BUILTIN`): the TPU generations
``tpu_v2`` ... ``tpu_v8i``, the XLA CPU backend ``cpu``, and the NVIDIA GPU profiles
``gpu_sm80``, ``gpu_sm89``, ``gpu_sm90``, ``gpu_sm100``. :mod:`emulate.targets` turns each
row into a :class:`emulate.targets.Target` (its fields are a Target's, ``rules`` and
``table_pairs`` aside), reading a TPU row from JAX's own table when it can
(:func:`from_jax`: ``jax.experimental.pallas.tpu.get_tpu_info_for_chip(chip, 1)``, its
``is_matmul_supported`` and op rates) and laying the recorded compiler probe over it.
The TPU rows here are a copy of JAX 0.10's table, per TensorCore as JAX states them.

The ``cpu`` row states what XLA's CPU backend compiles in jax 0.10, measured (see
``tests/test_targets.py``). A pair is native there when ``lax.dot_general`` with
``preferred_element_type`` float32 (int32 for two integer operands) reaches XLA with both
operands in their own types and returns the exact-accumulator result: every pair of
float32/bfloat16/float16; int8 x int8 and uint8 x uint8 (int32 sums, wrapping like int32;
XLA widens uint8 to int32 itself);
each float8 format with itself except e8m0 (XLA converts both operands to float32, exactly,
and accumulates in float32). Not native: int4, uint4 and float4_e2m1fn pairs (the dot
fails to compile: "custom element sizes on non-sub-byte types ... operand_upcaster");
float6 (XLA cannot hold it); float8_e8m0fnu (a scale type; 2**-127 is a float32 denormal,
flushed); and every mixed pair with a low-precision operand, which JAX's lowering converts
to the accumulator type before XLA sees it (a full-size temporary the emulator does better).
The CPU has no stated op rates or bandwidth: those fields are None.

The GPU rows are approximate, from public sources (NVIDIA datasheets' dense peak
figures, XLA's GEMM rewriter): float32/bfloat16/float16 dots native everywhere; int8 x
int8 -> int32 native through cuBLAS; float8 pairs with at least one e4m3fn operand
(e4m3fn x e4m3fn, e4m3fn x e5m2, e5m2 x e4m3fn: cuBLASLt's FP8 GEMMs need one e4m3fn
operand) native from sm89 on; int4, float6 and float4 never (XLA has no path).
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Iterable
from typing import NamedTuple

from emulate import formats as _formats

__all__ = ["ALIASES", "BUILTIN", "JAX_CHIP", "OPERANDS", "TPU_F32_PASSES", "Row", "from_jax"]

#: The operand formats whose pairs a profile states: the low-precision family and the
#: wide float types. Any other pair (int32 operands, say) is never native.
OPERANDS: tuple[str, ...] = _formats.LOW_PRECISION + ("bfloat16", "float32", "float16")

#: f32 x f32 at ``Precision.HIGHEST`` costs six bf16 passes on a TPU matrix unit.
TPU_F32_PASSES = 6


class Row(NamedTuple):
    """One builtin profile: the fields of :class:`emulate.targets.Target` of the same
    names (see there for units), before the recorded compiler probe is laid over it."""

    name: str
    kind: str
    generation: int | None
    device_kinds: tuple[str, ...]
    native_pairs: frozenset[tuple[str, str]]
    bf16_ops_per_second: int | None
    f32_ops_per_second: int | None
    int8_ops_per_second: int | None
    fp8_ops_per_second: int | None
    int4_ops_per_second: int | None
    mem_bw_bytes_per_second: int | None
    vmem_capacity_bytes: int | None = None
    mxu_column_size: int | None = None
    cores_per_chip: int = 1
    compute_capability: str | None = None
    source: str = "builtin"


def _product(lhs: Iterable[str], rhs: Iterable[str]) -> frozenset[tuple[str, str]]:
    return frozenset(itertools.product(tuple(lhs), tuple(rhs)))


def _square(*groups: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    """Every pair with both operands in the same group."""
    return frozenset().union(*(_product(g, g) for g in groups))


_F32_BF16 = ("float32", "bfloat16")
_E4M3FN_E5M2 = ("float8_e4m3fn", "float8_e5m2")

# The builtin copy of JAX's TpuInfo.is_matmul_supported (jax 0.10), by generation.
_TPU_V2_NATIVE = frozenset({("float32", "float32")})
_TPU_V4_NATIVE = _product(_F32_BF16, _F32_BF16 + ("int8",))
_TPU_V5_NATIVE = _square(
    _F32_BF16 + ("float8_e5m2", "float8_e4m3b11fnuz"), ("int8", "uint8"), ("int4", "uint4")
)
_TPU_V7_NATIVE = _square(_F32_BF16) | _product(_F32_BF16 + _E4M3FN_E5M2, _E4M3FN_E5M2)

_CPU_FLOAT8 = (
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
)
_CPU_NATIVE = _square(_formats.WIDE_FLOATS) | frozenset(
    (f, f) for f in ("int8", "uint8") + _CPU_FLOAT8
)
_GPU_NATIVE = _square(_formats.WIDE_FLOATS) | {("int8", "int8")}
# cuBLASLt's FP8 GEMMs need at least one e4m3fn operand; XLA upcasts e5m2 x e5m2.
_GPU_FP8_NATIVE = _GPU_NATIVE | (
    _product(_E4M3FN_E5M2, _E4M3FN_E5M2) - {("float8_e5m2", "float8_e5m2")}
)


def _tpu(
    name: str,
    generation: int,
    device_kinds: tuple[str, ...],
    native: frozenset[tuple[str, str]],
    bf16: float,
    int8: float,
    fp8: float,
    int4: float,
    mem_bw: float,
    vmem: int,
    mxu: int,
    cores: int,
) -> Row:
    """A builtin TPU row; rates are written as floats but every one is an exact integer."""
    return Row(
        name=name,
        kind="tpu",
        generation=generation,
        device_kinds=device_kinds,
        native_pairs=native,
        bf16_ops_per_second=int(bf16),
        f32_ops_per_second=int(bf16) // TPU_F32_PASSES,
        int8_ops_per_second=int(int8),
        fp8_ops_per_second=int(fp8),
        int4_ops_per_second=int(int4),
        mem_bw_bytes_per_second=int(mem_bw),
        vmem_capacity_bytes=vmem,
        mxu_column_size=mxu,
        cores_per_chip=cores,
    )


def _gpu(
    name: str,
    cc: str,
    native: frozenset[tuple[str, str]],
    bf16: float,
    f32: float,
    int8: float,
    fp8: float,
    mem_bw: float,
) -> Row:
    """A builtin GPU row; int4 has no XLA path on any of them."""
    return Row(
        name=name,
        kind="gpu",
        generation=None,
        device_kinds=(),
        native_pairs=native,
        bf16_ops_per_second=int(bf16),
        f32_ops_per_second=int(f32),
        int8_ops_per_second=int(int8),
        fp8_ops_per_second=int(fp8),
        int4_ops_per_second=0,
        mem_bw_bytes_per_second=int(mem_bw),
        compute_capability=cc,
    )


_MiB = 1024 * 1024

# The builtin table, in table order. TPU rows copy JAX 0.10's get_tpu_info_for_chip(chip, 1)
# (per TensorCore); GPU rows are datasheet figures for A100 SXM, L40S, H100 SXM, HGX B200.
# Rates in ops/s, bandwidth in bytes/s, VMEM in bytes.
# fmt: off
#: Every builtin profile, in table order.
BUILTIN: tuple[Row, ...] = (
    #    name       gen device_kinds                 native          bf16      int8      fp8
    #    int4      mem_bw    vmem       mxu  cores
    _tpu("tpu_v2",  2, ("TPU v2",),                  _TPU_V2_NATIVE, 23e12,    0,        0,
         0,        358e9,    16 * _MiB, 128, 2),
    _tpu("tpu_v3",  3, ("TPU v3",),                  _TPU_V2_NATIVE, 70e12,    0,        0,
         0,        412.5e9,  16 * _MiB, 128, 2),
    _tpu("tpu_v4",  4, ("TPU v4",),                  _TPU_V4_NATIVE, 137.5e12, 0,        0,
         0,        615e9,    16 * _MiB, 128, 2),
    _tpu("tpu_v4i", 4, ("TPU v4 lite",),             _TPU_V4_NATIVE, 137e12,   0,        0,
         0,        614e9,    16 * _MiB, 128, 1),
    _tpu("tpu_v5e", 5, ("TPU v5e", "TPU v5 lite"),   _TPU_V5_NATIVE, 197e12,   394e12,   0,
         788e12,   820e9,    128 * _MiB, 128, 1),
    _tpu("tpu_v5p", 5, ("TPU v5p", "TPU v5"),        _TPU_V5_NATIVE, 229.5e12, 459e12,   0,
         920e12,   1.23e12,  64 * _MiB, 128, 2),
    _tpu("tpu_v6e", 6, ("TPU v6e", "TPU v6 lite"),   _TPU_V5_NATIVE, 920e12,   1.84e15,  920e12,
         3.68e15,  1.64e12,  128 * _MiB, 256, 1),
    _tpu("tpu_v7",  7, ("TPU7",),                    _TPU_V7_NATIVE, 1.155e15, 0,        2.3e15,
         0,        3.7e12,   64 * _MiB, 256, 2),
    _tpu("tpu_v7x", 7, ("TPU7x",),                   _TPU_V7_NATIVE, 1.155e15, 0,        2.3e15,
         0,        3.7e12,   64 * _MiB, 256, 2),
    _tpu("tpu_v8i", 8, ("TPU8i",),                   _TPU_V7_NATIVE, 550.5e12, 0,        4.404e15,
         0,        4.3e12,   192 * _MiB, 256, 2),
    Row(
        name="cpu", kind="cpu", generation=None, device_kinds=("cpu",), native_pairs=_CPU_NATIVE,
        bf16_ops_per_second=None, f32_ops_per_second=None, int8_ops_per_second=None,
        fp8_ops_per_second=None, int4_ops_per_second=None, mem_bw_bytes_per_second=None,
    ),
    #    name         cc      native           bf16     f32      int8     fp8      mem_bw
    _gpu("gpu_sm80",  "8.0",  _GPU_NATIVE,     312e12,  19.5e12, 624e12,  0,       2.039e12),
    _gpu("gpu_sm89",  "8.9",  _GPU_FP8_NATIVE, 362e12,  91.6e12, 733e12,  733e12,  864e9),
    _gpu("gpu_sm90",  "9.0",  _GPU_FP8_NATIVE, 989e12,  67e12,   1979e12, 1979e12, 3.35e12),
    _gpu("gpu_sm100", "10.0", _GPU_FP8_NATIVE, 2.25e15, 75e12,   4.5e15,  4.5e15,  8e12),
)
# fmt: on

#: JAX's ChipVersion value for each TPU profile.
JAX_CHIP = {
    "tpu_v2": "v2",
    "tpu_v3": "v3",
    "tpu_v4": "v4",
    "tpu_v4i": "v4i",
    "tpu_v5e": "v5e",
    "tpu_v5p": "v5p",
    "tpu_v6e": "v6e",
    "tpu_v7": "7",
    "tpu_v7x": "7x",
    "tpu_v8i": "8i",
}

#: Each profile's aliases besides its name and device kinds.
ALIASES = {
    "tpu_v2": ("v2",),
    "tpu_v3": ("v3",),
    "tpu_v4": ("v4",),
    "tpu_v4i": ("v4i", "v4 lite"),
    "tpu_v5e": ("v5e", "v5 lite", "v5litepod"),
    "tpu_v5p": ("v5p",),
    "tpu_v6e": ("v6e", "v6 lite", "trillium"),
    "tpu_v7": ("v7",),
    "tpu_v7x": ("v7x", "7x", "ironwood"),
    "tpu_v8i": ("v8i", "8i"),
    "cpu": ("host",),
    "gpu_sm80": ("sm80", "sm_80", "a100", "ampere"),
    "gpu_sm89": ("sm89", "sm_89", "l40s", "ada"),
    "gpu_sm90": ("sm90", "sm_90", "h100", "h200", "hopper"),
    "gpu_sm100": ("sm100", "sm_100", "b200", "blackwell"),
}


def from_jax(t: Row) -> Row | None:
    """The TPU row ``t`` with the fields JAX's TPU table states (``source="jax"``), or None
    if the installed JAX has no such table or reading it raises anything."""
    try:
        pltpu = importlib.import_module("jax.experimental.pallas.tpu")
        info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(JAX_CHIP[t.name]), 1)
        native = frozenset(
            (a, b)
            for a, b in itertools.product(OPERANDS, repeat=2)
            if info.is_matmul_supported(_formats.get(a).dtype, _formats.get(b).dtype)
        )
        bf16 = int(info.bf16_ops_per_second)
        return t._replace(
            generation=int(info.generation),
            native_pairs=native,
            bf16_ops_per_second=bf16,
            f32_ops_per_second=bf16 // TPU_F32_PASSES,
            int8_ops_per_second=int(info.int8_ops_per_second),
            fp8_ops_per_second=int(info.fp8_ops_per_second),
            int4_ops_per_second=int(info.int4_ops_per_second),
            mem_bw_bytes_per_second=int(info.mem_bw_bytes_per_second),
            vmem_capacity_bytes=int(info.vmem_capacity_bytes),
            mxu_column_size=int(info.mxu_column_size),
            source="jax",
        )
    except Exception:  # any change in JAX's private-ish API: keep the builtin copy
        return None
