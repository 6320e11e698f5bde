"""The checkpoint weights the quantized benchmarks multiply, built as the importers build
them from a fixed seed: each convention of docs/quantized.md's table as a :class:`Scheme`
(builder ``(k, n, rng) -> QArray`` and dimension numbers against (M, K) activations).

``SCHEMES`` are those :mod:`benchmarks.quantized` compiles for TPUs and times on the CPU;
``CPU_SCHEMES`` adds the conventions :mod:`benchmarks.qcpu` times on the CPU only (GGUF
legacy and IQ types, MXFP4, GPTQ act-order). :class:`Case` is one timed program of
either benchmark.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import emulate
import emulate.mx
from benchmarks import timing
from emulate.codebooks import NF4
from emulate.importers import ggml, gguf
from emulate.importers.as_qarray import to_qarray
from emulate.importers.conventions.integer import parse_compressed_int
from emulate.importers.stored import StoredParts

#: ``x @ W`` for a (K, N) weight; ``x @ W.T`` for GGUF's (N, K) rows.
KN = (((1,), (0,)), ((), ()))
NK = (((1,), (1,)), ((), ()))


#: Byte offsets of the float16 fields (d, dmin) in a block of each GGUF K-quant type.
_F16_FIELDS = {
    "Q4_0": (0,),
    "Q8_0": (0,),
    "IQ4_XS": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def k_quant_weight(kind: str, k: int, n: int, rng: np.random.Generator) -> emulate.QArray:
    """A GGUF weight of logical shape (N, K) (ggml's rows along K): random code and scale
    bytes, ``d`` in [1e-3, 1.1e-2) and ``dmin = d / 2`` (finite f16 values); for MXFP4
    the e8m0 scale byte in 110..130."""
    block, size = ggml.BLOCKS[kind]
    nb = n * k // block
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    d = (rng.random(nb) * 0.01 + 0.001).astype(np.float16)
    if kind == "MXFP4":
        raw[:, 0] = rng.integers(110, 131, nb, dtype=np.uint8)
    for off, v in zip(_F16_FIELDS.get(kind, ()), (d, (d / 2).astype(np.float16)), strict=False):
        raw[:, off : off + 2] = v.view(np.uint8).reshape(nb, 2)
    return gguf.to_qarray(ggml.parse_blocks(raw, kind, (n, k), name=f"bench.{kind.lower()}"))


def q4_k_weight(k: int, n: int, rng: np.random.Generator) -> emulate.QArray:
    """A GGUF Q4_K weight (:func:`k_quant_weight`)."""
    return k_quant_weight("Q4_K", k, n, rng)


def _int4_group_parts(k: int, n: int, rng: np.random.Generator, group: int) -> StoredParts:
    """uint4 codes (K, N), f16 scales and uint4 zero points per group of ``group`` along K:
    the parts ``parse_awq`` and ``parse_gptq`` return."""
    g = min(group, k)
    return StoredParts(
        codes=rng.integers(0, 16, (k, n), dtype=np.uint8),
        fmt="uint4",
        bits=4,
        block_shape=(g, 1),
        scales=(rng.random((k // g, n)) * 0.01 + 1e-4).astype(np.float16),
        zero_points=rng.integers(0, 16, (k // g, n), dtype=np.uint8),
        zero_bits=4,
        dtype="float16",
        source="benchmarks.qweights: int4 parts in groups along K",
        stored_bits=0,
    )


def awq_weight(k: int, n: int, rng: np.random.Generator, group: int = 128) -> emulate.QArray:
    """An AutoAWQ GEMM int4 weight (K, N) in the parts ``parse_awq`` returns: uint4 codes,
    f16 scales and uint4 zero points per group of ``group`` along K."""
    return to_qarray(_int4_group_parts(k, n, rng, group))


def gptq_act_order_weight(
    k: int, n: int, rng: np.random.Generator, group: int = 128
) -> emulate.QArray:
    """A GPTQ int4 act-order weight (K, N) in the parts ``parse_gptq`` returns: uint4
    codes and their groups stored in a random permutation of K, f16 scales and uint4
    zero points per group."""
    parts = _int4_group_parts(k, n, rng, group)
    perm = rng.permutation(k).astype(np.int32)
    return to_qarray(dataclasses.replace(parts, perm=perm, perm_axis=-2))


def compressed_int4_weight(
    k: int, n: int, rng: np.random.Generator, group: int = 128
) -> emulate.QArray:
    """A compressed-tensors ``pack-quantized`` int4 weight, symmetric, groups of ``group``
    along K (the W4A16 preset), through ``parse_compressed_int``: random int32 words
    ``weight_packed`` (N, K / 8), ``weight_shape`` [N, K], bf16 ``weight_scale``
    (N, K / group) in [1e-4, 1e-2); logical (K, N) as the importer gives it."""
    g = min(group, k)
    tensors = {
        "w.weight_packed": rng.integers(-(2**31), 2**31, (n, k // 8), dtype=np.int64).astype(
            np.int32
        ),
        "w.weight_shape": np.array([n, k], np.int64),
        "w.weight_scale": (rng.random((n, k // g)) * 0.01 + 1e-4).astype(ml_dtypes.bfloat16),
    }
    config = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
    return to_qarray(parse_compressed_int(tensors, "w", {**config, "group_size": g}))


def nf4_weight(k: int, n: int, rng: np.random.Generator, block: int = 64) -> emulate.QArray:
    """A bitsandbytes NF4 weight (K, N) in the parts ``parse_bnb_4bit`` returns: uint4
    codes into the NF4 table, one f32 absmax per ``block`` elements along K."""
    b = min(block, k)
    parts = StoredParts(
        codes=rng.integers(0, 16, (k, n), dtype=np.uint8),
        fmt="uint4",
        bits=4,
        block_shape=(b, 1),
        scales=rng.random((k // b, n)).astype(np.float32) + np.float32(0.01),
        codebook=NF4.array(),
        dtype="bfloat16",
        source="benchmarks.quantized: bitsandbytes NF4 parts",
        stored_bits=0,
    )
    return to_qarray(parts)


def fp8_block128_weight(k: int, n: int, rng: np.random.Generator) -> emulate.QArray:
    """A DeepSeek-V3 FP8 weight (K, N) in the parts ``parse_fp8_blocks`` returns: e4m3fn
    codes (finite), one f32 ``weight_scale_inv`` per 128 x 128 block."""
    codes = rng.integers(0, 256, (k, n), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E  # no NaN codes
    parts = StoredParts(
        codes=codes,
        fmt="float8_e4m3fn",
        bits=8,
        block_shape=(128, 128),
        scales=rng.random((-(-k // 128), -(-n // 128))).astype(np.float32) * 1e-3 + 1e-5,
        dtype="bfloat16",
        source="benchmarks.quantized: DeepSeek-V3 FP8 128x128 block parts",
        stored_bits=0,
    )
    return to_qarray(parts)


def nf4_dq_weight(k: int, n: int, rng: np.random.Generator, block: int = 64) -> emulate.QArray:
    """:func:`nf4_weight` with bitsandbytes' double quantization, in the parts
    ``parse_bnb_4bit`` returns: the absmax as uint8 codes into a 256-entry table (sorted
    values in [-1, 1] with a 0, as the dynamic map; the kernel's work does not depend on
    them), a float32 scale per 256 codes of the flattened (N, K / block) absmax (blocks
    ``(256, 1)`` of the (K / block, N) grid, or ``(G, 256 // G)`` for G = K / block < 256
    groups) and a float offset."""
    b = min(block, k)
    g = k // b
    bk, bn = (256, 1) if g % 256 == 0 else (g, 256 // g)
    table = np.sort(np.concatenate([rng.uniform(-1, 1, 255), [0.0]])).astype(np.float32)
    nested = StoredParts(
        codes=rng.integers(0, 256, (g, n), dtype=np.uint8),
        fmt="uint8",
        bits=8,
        block_shape=(bk, bn),
        scales=(rng.random((-(-g // bk), -(-n // bn))) * 0.02).astype(np.float32),
        codebook=table,
        offsets=np.float32(0.03),
        dtype="float32",
        source="benchmarks.quantized: bitsandbytes nested absmax",
        stored_bits=0,
    )
    parts = StoredParts(
        codes=rng.integers(0, 16, (k, n), dtype=np.uint8),
        fmt="uint4",
        bits=4,
        block_shape=(b, 1),
        scales=nested,
        codebook=NF4.array(),
        dtype="bfloat16",
        source="benchmarks.quantized: bitsandbytes NF4 double-quantized parts",
        stored_bits=0,
    )
    return to_qarray(parts)


def nvfp4_weight(k: int, n: int, rng: np.random.Generator) -> emulate.QArray:
    """An NVFP4 weight (K, N): ``emulate.quantize`` of normal values with the scheme,
    blocks of 16 along K."""
    w = rng.standard_normal((k, n)).astype(np.float32)
    return emulate.quantize(w, emulate.mx.NVFP4, axis=0)


def _without(q: emulate.QArray, part: str) -> emulate.QArray:
    return dataclasses.replace(q, **{part: None})


@dataclasses.dataclass(frozen=True)
class Scheme:
    """One weight: its name, title, builder ``(k, n, rng) -> QArray``, its dimension
    numbers against (M, K) activations, and, for a scheme without its offset term, the
    scheme it is compared with (``base_of``)."""

    name: str
    title: str
    build: Callable[[int, int, np.random.Generator], emulate.QArray]
    dn: Any
    base_of: str | None = None


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme("q4_k", "GGUF Q4_K (scales + mins)", q4_k_weight, NK),
        Scheme(
            "q4_k_no_mins",
            "Q4_K without its mins",
            lambda k, n, r: _without(q4_k_weight(k, n, r), "offsets"),
            NK,
            base_of="q4_k",
        ),
        *(
            Scheme(
                kind.lower(),
                f"GGUF {kind} ({what})",
                functools.partial(k_quant_weight, kind),
                NK,
            )
            for kind, what in (
                ("Q6_K", "6-bit, int8 scales"),
                ("Q5_K", "5-bit, scales + mins"),
                ("Q3_K", "3-bit, 6-bit scales"),
                ("Q2_K", "2-bit, scales + mins"),
            )
        ),
        Scheme("awq_g128", "AWQ int4 g128 (zero points)", awq_weight, KN),
        Scheme(
            "awq_g128_no_zeros",
            "AWQ int4 g128 without zero points",
            lambda k, n, r: _without(awq_weight(k, n, r), "zero_points"),
            KN,
            base_of="awq_g128",
        ),
        Scheme("nf4_b64", "bnb NF4, blocks of 64", nf4_weight, KN),
        Scheme("nf4_dq", "bnb NF4, blocks of 64, double quant", nf4_dq_weight, KN),
        Scheme("nvfp4", "NVFP4 (e4m3 per 16, f32 tensor scale)", nvfp4_weight, KN),
        Scheme("fp8_block128", "FP8 e4m3, f32 scale per 128x128", fp8_block128_weight, KN),
    )
}


@dataclasses.dataclass
class Case:
    """One timed contender (timing.Timed)."""

    scheme: str
    contender: str
    fn: Callable[..., Any]
    args: tuple
    times: list[float] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.scheme} {self.contender}"

    def run(self) -> float:
        return timing.timed_call(self.fn, *self.args)


#: Every convention of docs/quantized.md's table that the CPU benchmark times.
CPU_SCHEMES: dict[str, Scheme] = {
    **{n: s for n, s in SCHEMES.items() if s.base_of is None},
    **{
        s.name: s
        for s in (
            *(
                Scheme(kind.lower(), f"GGUF {kind}", functools.partial(k_quant_weight, kind), NK)
                for kind in ("Q4_0", "Q8_0", "IQ4_XS", "MXFP4")
            ),
            Scheme("gptq_act", "GPTQ int4 g128 act-order", gptq_act_order_weight, KN),
            Scheme(
                "ct_int4",
                "compressed-tensors int4 g128 (symmetric)",
                compressed_int4_weight,
                KN,
            ),
        )
    },
}
