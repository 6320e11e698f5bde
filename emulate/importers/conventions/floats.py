"""Low-precision float codes with block scales: gpt-oss MXFP4, FP8 with 128x128
``weight_scale_inv`` blocks (DeepSeek-V3), NVIDIA modelopt NVFP4, and compressed-tensors'
``nvfp4-pack-quantized`` and ``mxfp4-pack-quantized``.

Each parser returns :class:`~emulate.importers.stored.StoredParts` of logical
shape ``(..., K, N)`` (the torch ``(..., N, K)`` weights transposed).

- **gpt-oss MXFP4** (openai/gpt-oss ``gpt_oss/torch/weights.py``): ``{name}_blocks`` (or
  ``{name}.blocks``) uint8 ``(..., N, K/32, 16)``, element ``2i`` of a block in the low
  nibble of byte ``i`` and ``2i+1`` in the high one, e2m1 codes; ``{name}_scales``
  uint8 ``(..., N, K/32)``, e8m0 (``2**(s - 127)``). Decoded into bfloat16. The scale
  byte 255 is NaN in e8m0; gpt-oss's ``ldexp`` reads it as ``2**128`` (Inf).
- **FP8 blocks** (deepseek-ai/DeepSeek-V3 ``inference/kernel.py``, ``weight_dequant``):
  ``weight`` float8_e4m3fn ``(N, K)``, ``weight_scale_inv`` float32
  ``(ceil(N/bn), ceil(K/bk))`` with ``weight_block_size`` ``[bn, bk]`` from the config;
  ``W = f32(q) * s``, stored in the default dtype (bfloat16).
- **modelopt NVFP4** (NVIDIA Model-Optimizer ``qtensor/nvfp4_tensor.py``): ``weight``
  uint8 ``(N, K/2)`` (low nibble first, e2m1), ``weight_scale`` float8_e4m3fn
  ``(N, K/16)``, ``weight_scale_2`` float32 scalar; ``W = q * (f32(s) * s2)``.
- **compressed-tensors NVFP4 / MXFP4** (``compressors/nvfp4``, ``compressors/mxfp4``):
  ``weight_packed`` uint8 ``(N, K/2)`` low nibble first; NVFP4: ``weight_scale``
  float8_e4m3fn per 16 and ``weight_global_scale`` float32, ``W = q * (s / g)``; here
  ``tensor_scale = 1/g`` rounded to float32, so a product may differ from the division
  by one float32 unit in the last place before the bfloat16 rounding. MXFP4:
  ``weight_scale`` uint8 e8m0 per 32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from emulate.importers.conventions.config import setting
from emulate.importers.conventions.readers import bad, nibbles, tensor
from emulate.importers.stored import StoredParts

__all__ = [
    "parse_gpt_oss_mxfp4",
    "parse_fp8_blocks",
    "parse_modelopt_nvfp4",
    "parse_compressed_fp4",
]

_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def _bits(*ts: np.ndarray) -> int:
    return sum(t.size * t.dtype.itemsize * 8 for t in ts)


def _fp4_codes(packed: np.ndarray) -> np.ndarray:
    """e2m1 codes of a ``(..., N, K/2)`` low-nibble-first array, logical ``(..., K, N)``."""
    return np.ascontiguousarray(np.swapaxes(nibbles(packed, high_first=False), -1, -2))


def _t(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _pick(tensors: Mapping[str, Any], prefix: str, part: str) -> str:
    """``{prefix}_{part}`` (transformers' names) or ``{prefix}.{part}`` (gpt-oss's own);
    refused when both or neither exist."""
    names = [f"{prefix}_{part}", f"{prefix}.{part}"]
    present = [n for n in names if n in tensors]
    if len(present) != 1:
        got = "both" if present else "neither"
        raise ValueError(
            f"{prefix}: {part} tensor is ambiguous or missing ({got} of {names}); expected one"
        )
    return present[0]


def parse_gpt_oss_mxfp4(tensors: Mapping[str, Any], prefix: str) -> StoredParts:
    """gpt-oss MXFP4 (``{prefix}_blocks``/``_scales``, or ``.blocks``/``.scales``)."""
    bname, sname = _pick(tensors, prefix, "blocks"), _pick(tensors, prefix, "scales")
    blocks = tensor(tensors, bname, [np.uint8], range(3, 8))
    scales = tensor(tensors, sname, [np.uint8], range(2, 7))
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise bad(
            bname, "shape", blocks.shape, f"{scales.shape + (16,)} (16 bytes per block of 32)"
        )
    *lead, n, g, _ = blocks.shape
    codes = nibbles(blocks, high_first=False).reshape(*lead, n, g * 32)
    return StoredParts(
        codes=_t(codes),
        fmt="float4_e2m1fn",
        bits=4,
        block_shape=(1,) * len(lead) + (32, 1),
        scales=_t(scales.view(_E8M0)),
        dtype="bfloat16",
        source=f"gpt-oss MXFP4 {list(blocks.shape[:-2]) + [g * 32]}: {bname}, {sname}",
        stored_bits=_bits(blocks, scales),
    )


def parse_fp8_blocks(
    tensors: Mapping[str, Any], prefix: str, config: Mapping[str, Any], *, dtype: str = "bfloat16"
) -> StoredParts:
    """FP8 e4m3 with block scales (``{prefix}.weight``, ``{prefix}.weight_scale_inv``).
    ``config``: ``quant_method`` "fp8", ``fmt`` "e4m3", ``weight_block_size`` [bn, bk].
    ``dtype``: what the model decodes into (DeepSeek-V3: bfloat16)."""
    where = "quantization_config"
    setting(config, "quant_method", where=where, kind=str, allowed=("fp8",), default="fp8")
    setting(config, "fmt", where=where, kind=str, allowed=("e4m3",), default="e4m3")
    block = setting(config, "weight_block_size", where=where, kind=(list, tuple))
    if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise bad(where, "weight_block_size", block, "[rows, columns], two positive ints")
    w = tensor(tensors, f"{prefix}.weight", [_E4M3], 2)
    s = tensor(tensors, f"{prefix}.weight_scale_inv", [np.float32], 2)
    n, k = w.shape
    grid = (-(-n // block[0]), -(-k // block[1]))
    if s.shape != grid:
        raise bad(f"{prefix}.weight_scale_inv", "shape", s.shape, f"{grid} for blocks {block}")
    return StoredParts(
        codes=_t(w.view(np.uint8)),
        fmt="float8_e4m3fn",
        bits=8,
        block_shape=(block[1], block[0]),
        scales=_t(s),
        dtype=dtype,
        source=f"FP8 e4m3 {block[0]}x{block[1]} blocks: {prefix}.weight, {prefix}.weight_scale_inv",
        stored_bits=_bits(w, s),
    )


def _fp4_pair(
    tensors: Mapping[str, Any], wname: str, sname: str, scale_dtype: np.dtype, group: int
) -> tuple[np.ndarray, np.ndarray]:
    w = tensor(tensors, wname, [np.uint8], range(2, 5))
    s = tensor(tensors, sname, [scale_dtype], w.ndim)
    want = w.shape[:-1] + (w.shape[-1] * 2 // group,)
    if (w.shape[-1] * 2) % group or s.shape != want:
        raise bad(
            sname,
            "shape",
            s.shape,
            f"{want}: one scale per {group} of the {w.shape[-1] * 2} elements of a row",
        )
    return w, s


def parse_modelopt_nvfp4(
    tensors: Mapping[str, Any], prefix: str, config: Mapping[str, Any], *, dtype: str = "bfloat16"
) -> StoredParts:
    """NVIDIA modelopt NVFP4 (``{prefix}.weight``, ``.weight_scale``, ``.weight_scale_2``).
    ``config``: ``quant_algo`` "NVFP4" and ``group_size`` 16 (``hf_quant_config.json``'s
    ``quantization`` or the ``quantization_config``). ``dtype``: the model's dtype."""
    where = "quantization_config"
    setting(
        config, "quant_method", where=where, kind=str, allowed=("modelopt",), default="modelopt"
    )
    setting(config, "quant_algo", where=where, kind=str, allowed=("NVFP4",))
    group = setting(config, "group_size", where=where, kind=int, allowed=(16,), default=16)
    w, s = _fp4_pair(tensors, f"{prefix}.weight", f"{prefix}.weight_scale", _E4M3, group)
    s2 = tensor(tensors, f"{prefix}.weight_scale_2", [np.float32], (0, 1))
    if s2.size != 1:
        raise bad(f"{prefix}.weight_scale_2", "shape", s2.shape, "one float32 (a scalar or (1,))")
    lead = w.ndim - 2
    return StoredParts(
        codes=_fp4_codes(w),
        fmt="float4_e2m1fn",
        bits=4,
        block_shape=(1,) * lead + (group, 1),
        scales=_t(s),
        tensor_scale=np.float32(s2.reshape(())),
        dtype=dtype,
        source=f"modelopt NVFP4: {prefix}.weight, {prefix}.weight_scale, {prefix}.weight_scale_2",
        stored_bits=_bits(w, s, s2),
    )


def parse_compressed_fp4(
    tensors: Mapping[str, Any], prefix: str, config: Mapping[str, Any]
) -> StoredParts:
    """compressed-tensors ``nvfp4-pack-quantized`` or ``mxfp4-pack-quantized``
    (``{prefix}.weight_packed``, ``.weight_scale``, NVFP4 also ``.weight_global_scale``).
    ``config``: the ``quantization_config`` (its ``format`` picks the pack)."""
    fmt_name = setting(
        config,
        "format",
        where="quantization_config",
        kind=str,
        allowed=("nvfp4-pack-quantized", "mxfp4-pack-quantized"),
    )
    nv = fmt_name.startswith("nvfp4")
    group = 16 if nv else 32
    w, s = _fp4_pair(
        tensors,
        f"{prefix}.weight_packed",
        f"{prefix}.weight_scale",
        _E4M3 if nv else np.dtype(np.uint8),
        group,
    )
    stored = _bits(w, s)
    tensor_scale = None
    if nv:
        g = tensor(tensors, f"{prefix}.weight_global_scale", [np.float32], (0, 1))
        if g.size != 1:
            raise bad(f"{prefix}.weight_global_scale", "shape", g.shape, "one float32")
        tensor_scale = np.float32(1) / np.float32(g.reshape(()))
        stored += _bits(g)
    lead = w.ndim - 2
    return StoredParts(
        codes=_fp4_codes(w),
        fmt="float4_e2m1fn",
        bits=4,
        block_shape=(1,) * lead + (group, 1),
        scales=_t(s if nv else s.view(_E8M0)),
        tensor_scale=tensor_scale,
        dtype="bfloat16",
        source=f"compressed-tensors {fmt_name}: {prefix}.weight_packed, {prefix}.weight_scale",
        stored_bits=stored,
    )
