"""Shared pieces of the safetensors importer tests: a writer of .safetensors files (raw
bytes for the dtypes safetensors' numpy API cannot hold), bit-for-bit comparison, the
matmul-bound ratio of the wrong-layout controls, and each convention's tiny tensors written
by the project's own packing code (tests/importers/_st_oracles.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import _st_oracles as O
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from emulate.importers import safetensors as S
from emulate.importers.stored import StoredParts

_ST_NAMES = {np.dtype(v): k for k, v in S.DTYPES.items()}
F16 = np.float16


def write(
    tmp: Path, tensors: dict[str, np.ndarray], config: dict | None = None, name: str = "model"
) -> Path:
    """A .safetensors file of ``tensors`` (raw bytes when safetensors' numpy API cannot hold
    a dtype) and, with ``config``, a config.json beside it."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{name}.safetensors"
    if all(
        t.dtype.name not in ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu")
        for t in tensors.values()
    ):
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    else:  # the documented layout: u64 header length, JSON header, data
        header, blobs, offset = {}, [], 0
        for k, v in tensors.items():
            b = np.ascontiguousarray(v).tobytes()
            header[k] = {
                "dtype": _ST_NAMES[v.dtype],
                "shape": list(v.shape),
                "data_offsets": [offset, offset + len(b)],
            }
            blobs.append(b)
            offset += len(b)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    if config is not None:
        (tmp / "config.json").write_text(json.dumps({"quantization_config": config}))
    return path


def same_bits(a: np.ndarray, b: np.ndarray, *, zero_sign: bool = True) -> None:
    """Equal bit for bit, NaN matching NaN (and -0 matching +0 with ``zero_sign=False``:
    the numerics contract leaves the sign of a zero out)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    if not zero_sign:
        a, b = a + a.dtype.type(0), b + b.dtype.type(0)
    nan = np.isnan(a32)
    np.testing.assert_array_equal(nan, np.isnan(b32))
    u = np.dtype(f"u{a.dtype.itemsize}")
    np.testing.assert_array_equal(a.view(u)[~nan], b.view(u)[~nan])


def decoded(parts: StoredParts) -> np.ndarray:
    """The parts' float32 values cast to the project's dtype (overflow to Inf is IEEE's)."""
    dtype = np.dtype(ml_dtypes.bfloat16) if parts.dtype == "bfloat16" else parts.dtype
    with np.errstate(over="ignore"):
        return parts.dequantize().astype(dtype)


def half_scales(rng: np.random.Generator, shape: tuple[int, ...], dtype=F16) -> np.ndarray:
    """Random scales of both signs with zeros, subnormals, Inf and NaN mixed in."""
    s = (rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 4, shape)).astype(dtype)
    flat = s.reshape(-1)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, 65504], dtype=np.float32).astype(
        dtype
    )
    picks = rng.integers(0, flat.size, min(flat.size // 4, 4))
    flat[picks] = specials[rng.integers(0, specials.size, picks.size)]
    return s


def bound_ratio(x: np.ndarray, w_right: np.ndarray, w_wrong: np.ndarray) -> float:
    """How many times the wrong layout's matmul misses the f32 matmul bound of the right one
    (gamma_K * sum |x||w| with u = 2**-24)."""
    k = x.shape[-1]
    wr, ww = w_right.astype(np.float64), w_wrong.astype(np.float64)
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    bound = gamma * (np.abs(x) @ np.abs(wr))
    return float(np.max(np.abs(x @ ww - x @ wr) / (bound + 1e-300)))


AWQ_CONFIG = {
    "quant_method": "awq",
    "bits": 4,
    "group_size": 16,
    "zero_point": True,
    "version": "gemm",
}


def awq_tensors(rng, k: int, n: int, group: int, zmin: int = 0) -> dict[str, np.ndarray]:
    q = rng.integers(0, 16, (k, n))
    z = rng.integers(zmin, 16, (k // group, n))
    return {
        "l.qweight": O.awq_pack(q),
        "l.qzeros": O.awq_pack(z),
        "l.scales": half_scales(rng, (k // group, n)),
    }


def gptq_tensors(
    rng, k: int, n: int, group: int, bits: int, v1: bool, act_order: bool
) -> dict[str, np.ndarray]:
    q = rng.integers(0, 2**bits, (k, n))
    groups = -(-k // group)
    z = rng.integers(1 if v1 else 0, 2**bits, (groups, n))
    if act_order:  # GPTQ: g_idx[perm[i]] = i // group for the act-order permutation perm
        perm = rng.permutation(k)
        g_idx = np.empty(k, np.int32)
        g_idx[perm] = np.arange(k) // group
    else:
        g_idx = (np.arange(k) // group).astype(np.int32)
    qweight, qzeros = O.gptq_pack(q, z, bits, v1)
    return {
        "l.qweight": qweight,
        "l.qzeros": qzeros,
        "l.scales": half_scales(rng, (groups, n)),
        "l.g_idx": g_idx,
    }


def ct_tensors(rng, n, k, bits, strategy, group, symmetric, act_order, dtype=F16):
    half = 1 << (bits - 1)
    q = rng.integers(-half, half, (n, k)).astype(np.int8)
    cols = {"group": k // group, "channel": 1, "tensor": 1}[strategy]
    rows = 1 if strategy == "tensor" else n
    scale = half_scales(rng, (rows, cols), dtype)
    t = {
        "l.weight_packed": O.ct_pack_to_int32(q, bits),
        "l.weight_shape": np.array([n, k], np.int64),
        "l.weight_scale": scale.reshape(1) if strategy == "tensor" else scale,
    }
    zp = None
    if not symmetric:
        zp = rng.integers(-half, half, (n, cols)).astype(np.int8)
        t["l.weight_zero_point"] = O.ct_pack_to_int32(zp, bits, packed_dim=0)
    g_idx = None
    if act_order:
        g_idx = np.empty(k, np.int32)
        g_idx[rng.permutation(k)] = np.arange(k) // group
        t["l.weight_g_idx"] = g_idx
    return t, q, scale, zp, g_idx


def mx_scales(rng, shape) -> np.ndarray:
    """e8m0 bytes 0..254 (255 is NaN in e8m0, Inf in gpt-oss's ldexp: tested apart)."""
    return rng.integers(100, 150, shape).astype(np.uint8)


def bnb_tensors(
    rng, n, k, blocksize, nested: bool, quant_type="nf4", dtype="bfloat16", specials=False
):
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    nblocks = -(-n * k // blocksize)
    absmax = np.abs(rng.standard_normal(nblocks)).astype(np.float32) * np.float32(0.05)
    if specials:
        absmax[rng.integers(0, nblocks, 2)] = rng.choice([np.inf, np.nan, 0.0, 1e-40], 2)
    code = O.NF4 if quant_type == "nf4" else rng.standard_normal(16).astype(np.float32)
    t = {"l.weight": O.bnb_pack(q), "l.weight.quant_map": code}
    if nested:
        offset = float(absmax.mean())
        dyn = O.bnb_dynamic_map()
        qa = rng.integers(0, 256, nblocks).astype(np.uint8)
        nested_absmax = np.abs(rng.standard_normal(-(-nblocks // 256))).astype(
            np.float32
        ) * np.float32(0.02)
        t |= {
            "l.weight.absmax": qa,
            "l.weight.nested_absmax": nested_absmax,
            "l.weight.nested_quant_map": dyn,
        }
        extra = {"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": offset}
        oracle = O.bnb_dequantize_4bit(
            t["l.weight"],
            qa,
            code,
            blocksize,
            (n, k),
            np.dtype(dtype),
            (nested_absmax, dyn, 256, offset),
        )
    else:
        t["l.weight.absmax"] = absmax
        extra = None
        oracle = O.bnb_dequantize_4bit(
            t["l.weight"], absmax, code, blocksize, (n, k), np.dtype(dtype)
        )
    t[f"l.weight.quant_state.bitsandbytes__{quant_type}"] = O.bnb_quant_state(
        quant_type, blocksize, dtype, (n, k), extra
    )
    return t, oracle
