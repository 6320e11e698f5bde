"""Each safetensors convention's own writer and decoder, ported from the project's
published torch source to numpy (the oracles of tests/importers/test_conventions.py).

Ported, not designed: each function follows the cited file at the cited commit line by
line (torch ops replaced by their numpy equivalents with the same dtypes, so that every
rounding happens where the project's happens). Nothing here imports emulate.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

# ---------------------------------------------------------------------------------------
# AutoAWQ: casper-hansen/AutoAWQ
#   awq/modules/linear/gemm.py @ 030fe2a15b959425d278de8121f03ed895e3b10c
#     (WQLinear_GEMM.from_linear: the packing with order_map)
#   awq/utils/packing_utils.py @ 7ee28736ab85f95724eeab2598bf49b13b86439f
#     (unpack_awq, reverse_awq_order, dequantize_gemm, unpack_reorder_pack, pack_exllama)
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def awq_pack(intweight: np.ndarray, order: list[int] = AWQ_ORDER) -> np.ndarray:
    """from_linear's loop: ``qweight[:, col] |= intweight[:, col*8 + order[i]] << 4i``.
    ``intweight``: (rows, N) ints in [0, 16). ``order``: the controls pass a wrong one."""
    rows, n = intweight.shape
    out = np.zeros((rows, n // 8), dtype=np.int32)
    iw = intweight.astype(np.int32)
    for col in range(n // 8):
        for i in range(8):
            out[:, col] |= iw[:, col * 8 + order[i]] << (i * 4)
    return out


def awq_unpack(
    qweight: np.ndarray, qzeros: np.ndarray, bits: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    shifts = np.arange(0, 32, bits, dtype=np.int32)
    iweights = (qweight[:, :, None] >> shifts[None, None, :]).astype(np.int8)
    iweights = iweights.reshape(iweights.shape[0], -1)
    izeros = (qzeros[:, :, None] >> shifts[None, None, :]).astype(np.int8)
    izeros = izeros.reshape(izeros.shape[0], -1)
    return iweights, izeros


def awq_reverse_order(
    iweights: np.ndarray, izeros: np.ndarray, bits: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    order = np.arange(izeros.shape[-1], dtype=np.int32).reshape(-1, 32 // bits)
    order = order[:, AWQ_REVERSE_ORDER].reshape(-1)
    return iweights[:, order], izeros[:, order]


def awq_dequantize_gemm(qweight, qzeros, scales, bits: int, group_size: int) -> np.ndarray:
    iweight, izeros = awq_unpack(qweight, qzeros, bits)
    iweight, izeros = awq_reverse_order(iweight, izeros, bits)
    iweight = iweight & ((2**bits) - 1)
    izeros = izeros & ((2**bits) - 1)
    scales = np.repeat(scales, group_size, axis=0)
    izeros = np.repeat(izeros, group_size, axis=0)
    return (iweight - izeros).astype(np.float16) * scales  # int8 tensor * f16 tensor -> f16


def awq_unpack_reorder_pack(qweight, qzeros, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """AutoAWQ's AWQ -> exllama (GPTQ v1) converter: rows packed along K, zeros minus one."""
    iweight, izeros = awq_unpack(qweight, qzeros, bits)
    iweight, izeros = awq_reverse_order(iweight, izeros, bits)
    iweight = (iweight & ((2**bits) - 1)).astype(np.int32)
    izeros = (izeros & ((2**bits) - 1)).astype(np.int32) - 1
    shifts = np.arange(0, 32, bits, dtype=np.int32)
    iw = iweight.reshape(iweight.shape[0] // (32 // bits), 32 // bits, -1)
    qw = (iw << shifts[None, :, None]).sum(axis=1, dtype=np.int64).astype(np.uint32).view(np.int32)
    iz = izeros.reshape(-1, izeros.shape[1] // (32 // bits), 32 // bits)
    qz = (iz << shifts[None, None, :]).sum(axis=-1, dtype=np.int64).astype(np.int64)
    return qw, (qz & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


# ---------------------------------------------------------------------------------------
# GPTQ: AutoGPTQ/AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py
#   @ 179776bd1d97a2e7f84b72318630f43719647a11 (QuantLinear.pack; the zeros + 1 of v1)
# ModelCloud/GPTQModel gptqmodel/nn_modules/qlinear/__init__.py
#   @ f4c327a17eb3e24524d5a97a3d682e3696ae6a28 (dequantize_weight, _dequantize_from_codes:
#   scales[g_idx] * (weight - zeros[g_idx])); gptqmodel/utils/model.py (same commit,
#   convert_gptq_v1_to_v2_format_module: 4-bit qzeros += 0x11111111)
GPTQ_WF3 = np.array(
    [
        [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0],
        [0, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31],
        [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0],
    ],
    dtype=np.int32,
).reshape(1, 3, 12)


def _gptq_pack_rows(intweight: np.ndarray, bits: int) -> np.ndarray:
    """QuantLinear.pack's qweight loop (packs along axis 0)."""
    intweight = intweight.astype(np.uint32)
    q = np.zeros((intweight.shape[0] // 32 * bits, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < q.shape[0]:
        if bits in (2, 4, 8):
            for j in range(i, i + (32 // bits)):
                q[row] |= intweight[j] << (bits * (j - i))
            i += 32 // bits
            row += 1
        else:
            for j in range(i, i + 10):
                q[row] |= intweight[j] << (3 * (j - i))
            i += 10
            q[row] |= intweight[i] << 30
            row += 1
            q[row] |= (intweight[i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                q[row] |= intweight[j] << (3 * (j - i) + 1)
            i += 10
            q[row] |= intweight[i] << 31
            row += 1
            q[row] |= (intweight[i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                q[row] |= intweight[j] << (3 * (j - i) + 2)
            i += 10
            row += 1
    return q.view(np.int32)


def gptq_pack(
    intweight: np.ndarray, zeros: np.ndarray, bits: int, v1: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``intweight`` (K, N) and ``zeros`` (G, N) -> (qweight, qzeros); v1 stores zeros - 1
    (QuantLinear.pack: ``zeros -= 1`` then the same loop along columns)."""
    z = zeros.astype(np.int64) - (1 if v1 else 0)
    qzeros = _gptq_pack_rows((z & 0xFFFFFFFF).astype(np.uint32).T, bits).T
    return _gptq_pack_rows(intweight, bits), np.ascontiguousarray(qzeros)


def gptq_dequantize(qweight, qzeros, scales, g_idx, bits: int, v1: bool) -> np.ndarray:
    """dequantize_weight (wf buffers, the 3-bit splice) with v1's ``zeros + 1``."""
    maxq = 2**bits - 1
    dt = np.int16 if bits == 8 else np.int8
    if bits in (2, 4, 8):
        wf = np.arange(0, 32, bits, dtype=np.int32)[None, :]
        zeros = (np.repeat(qzeros[:, :, None], 32 // bits, axis=2) >> wf[None]).astype(dt) & maxq
        zeros = zeros.reshape(scales.shape)
        weight = (np.repeat(qweight[:, None, :], 32 // bits, axis=1) >> wf[..., None]).astype(
            dt
        ) & maxq
    else:
        z = np.broadcast_to(
            qzeros.reshape(qzeros.shape[0], qzeros.shape[1] // 3, 3, 1),
            (*qzeros.shape[:1], qzeros.shape[1] // 3, 3, 12),
        )
        z = (z >> GPTQ_WF3[None]).copy()
        z[:, :, 0, 10] = (z[:, :, 0, 10] & 0x3) | ((z[:, :, 1, 0] << 2) & 0x4)
        z[:, :, 1, 11] = (z[:, :, 1, 11] & 0x1) | ((z[:, :, 2, 0] << 1) & 0x6)
        z = z & 0x7
        zeros = np.concatenate(
            [z[:, :, 0, :11], z[:, :, 1, 1:12], z[:, :, 2, 1:11]], axis=2
        ).reshape(scales.shape)
        w = np.broadcast_to(
            qweight.reshape(qweight.shape[0] // 3, 3, 1, qweight.shape[1]),
            (qweight.shape[0] // 3, 3, 12, qweight.shape[1]),
        )
        w = (w >> GPTQ_WF3[..., None]) & 0x7
        w[:, 0, 10] = (w[:, 0, 10] & 0x3) | ((w[:, 1, 0] << 2) & 0x4)
        w[:, 1, 11] = (w[:, 1, 11] & 0x1) | ((w[:, 2, 0] << 1) & 0x6)
        w = w & 0x7
        weight = np.concatenate([w[:, 0, :11], w[:, 1, 1:12], w[:, 2, 1:11]], axis=1)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2]).astype(np.int32)
    zeros = zeros.astype(np.int32) + (1 if v1 else 0)
    g = g_idx.astype(np.int64)
    return scales[g] * (weight - zeros[g]).astype(scales.dtype)


def gptq_v1_to_v2_qzeros_4bit(qzeros: np.ndarray) -> np.ndarray:
    """convert_gptq_v1_to_v2_format_module for 4 bits: the int32 words plus 0x11111111."""
    return (
        (qzeros.astype(np.int64) + 0b00010001000100010001000100010001)
        .astype(np.uint32)
        .view(np.int32)
    )


# ---------------------------------------------------------------------------------------
# compressed-tensors: vllm-project/compressed-tensors @ ac8e2ba82f4e0d5eaa40069f8fc642738f124cd4
#   src/compressed_tensors/compressors/pack_quantized/helpers.py (pack_to_int32, unpack_from_int32)
#   src/compressed_tensors/quantization/lifecycle/forward_helpers.py (_process_group, _dequantize)
#   src/compressed_tensors/compressors/nvfp4/helpers.py (pack_fp4_to_uint8, unpack_fp4_from_uint8)
#   src/compressed_tensors/compressors/mx_utils.py (decompress_mx_scale)
def ct_pack_to_int32(value: np.ndarray, num_bits: int, packed_dim: int = 1) -> np.ndarray:
    value = value.astype(np.int32) + (1 << (num_bits - 1))
    if packed_dim == 0:
        value = value.T
    rows, cols = value.shape
    packed_cols = -(-cols * num_bits // 32)
    padded = -(-cols // 32) * 32
    value = np.pad(value, ((0, 0), (0, padded - cols)))
    groups = padded // 32
    vg = value.reshape(rows * groups, 32).astype(np.int64)
    out = np.zeros((rows * groups, num_bits), dtype=np.int64)
    starts = np.arange(32) * num_bits
    word, off = starts // 32, starts % 32
    for e in range(32):
        out[:, word[e]] += vg[:, e] << off[e]
        ov = off[e] + num_bits - 32
        if ov > 0:
            out[:, word[e] + 1] += vg[:, e] >> (num_bits - ov)
    out = (
        (out & 0xFFFFFFFF)
        .astype(np.uint32)
        .view(np.int32)
        .reshape(rows, groups * num_bits)[:, :packed_cols]
    )
    return np.ascontiguousarray(out.T if packed_dim == 0 else out)


def ct_unpack_from_int32(
    value: np.ndarray, num_bits: int, shape: tuple[int, int], packed_dim: int = 1
) -> np.ndarray:
    if packed_dim == 0:
        value = value.T
    rows, words = value.shape
    cols = int(shape[packed_dim])
    if words % num_bits:
        value = np.pad(value, ((0, 0), (0, num_bits - words % num_bits)))
        words = value.shape[1]
    vg = value.reshape(rows * (words // num_bits), num_bits).astype(np.int64) & 0xFFFFFFFF
    starts = np.arange(32) * num_bits
    word, off = starts // 32, starts % 32
    lo = np.minimum(32 - off, num_bits)
    out = (vg[:, word] >> off) & ((1 << lo) - 1)
    ov = lo < num_bits
    hi = num_bits - lo[ov]
    out[:, ov] |= (vg[:, word[ov] + 1] & ((1 << hi) - 1)) << lo[ov]
    out = out.reshape(rows, -1)[:, :cols]
    if packed_dim == 0:
        out = out.T
    return (out - (1 << (num_bits - 1))).astype(np.int8)


def ct_dequantize_group(x_q, scale, zero_point, group_size: int, g_idx=None) -> np.ndarray:
    """_process_group then _dequantize: ``(x_q - zp) * scale`` in scale's dtype."""
    if g_idx is not None:
        perm = np.argsort(g_idx, kind="stable")
        x_q = x_q[:, perm]
    x = x_q.reshape(x_q.shape[0], -1, group_size).astype(scale.dtype)
    if zero_point is not None:
        x = x - zero_point[..., None].astype(scale.dtype)
    out = (x * scale[..., None]).reshape(x_q.shape)
    if g_idx is not None:
        out = out[:, np.argsort(perm, kind="stable")]
    return out


def ct_unpack_fp4(a: np.ndarray) -> np.ndarray:
    """unpack_fp4_from_uint8 (to bfloat16)."""
    table = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
    flat = a.reshape(-1)
    combined = np.stack((flat & 0x0F, (flat & 0xF0) >> 4), axis=1).reshape(-1)
    values = table[combined & 0x07] * np.where(combined & 0x08, -1.0, 1.0).astype(np.float32)
    return values.reshape(a.shape[0], a.shape[1] * 2).astype(BF16)


def ct_pack_fp4(codes: np.ndarray) -> np.ndarray:
    """pack_fp4_to_uint8's final step on e2m1 indices: ``low | high << 4``."""
    pairs = codes.reshape(-1, 2)
    return (
        (pairs[:, 0] | (pairs[:, 1] << 4))
        .astype(np.uint8)
        .reshape(codes.shape[0], codes.shape[1] // 2)
    )


def ct_dequantize_nvfp4(packed, scale_e4m3, global_scale, group: int = 16) -> np.ndarray:
    x = ct_unpack_fp4(packed).astype(np.float32)
    s = scale_e4m3.astype(BF16).astype(np.float32) / global_scale.astype(np.float32)
    return (x.reshape(x.shape[0], -1, group) * s[..., None]).reshape(x.shape).astype(BF16)


def ct_dequantize_mxfp4(packed, scale_u8, group: int = 32) -> np.ndarray:
    x = ct_unpack_fp4(packed)
    s = np.ldexp(np.float32(1), scale_u8.astype(np.int32) - 127).astype(BF16)
    prod = x.reshape(x.shape[0], -1, group).astype(np.float32) * s[..., None].astype(np.float32)
    return prod.astype(BF16).reshape(x.shape)


# ---------------------------------------------------------------------------------------
# gpt-oss: openai/gpt-oss gpt_oss/torch/weights.py @ 7b583341fe16729127f6d5b94a7b09ccae97e1a1
#   (Checkpoint._get_mxfp4_tensor and _get_mxfp4_tensor_copy)
FP4_VALUES = [
    +0.0,
    +0.5,
    +1.0,
    +1.5,
    +2.0,
    +3.0,
    +4.0,
    +6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
]


def gpt_oss_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    exp = scales.astype(np.int32) - 127
    lut = np.array(FP4_VALUES, dtype=np.float32).astype(BF16)
    *prefix, g, b = blocks.shape
    rows = int(np.prod(prefix)) * g
    blk, e = blocks.reshape(rows, b), exp.reshape(rows, 1)
    out = np.empty((rows, b * 2), dtype=BF16)
    # torch.ldexp(sub, exp, out=sub): sub * 2.0**exp (a float32 power), stored in bf16
    out[:, 0::2] = lut[blk & 0x0F]
    out[:, 1::2] = lut[blk >> 4]
    out = (out.astype(np.float32) * np.ldexp(np.float32(1), e)).astype(BF16)
    return out.reshape(*prefix, g * b * 2)


def gpt_oss_mxfp4_copy(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The "short version": stack the nibbles, look up, ldexp by the unsqueezed scales."""
    lo, hi = blocks & 0x0F, blocks >> 4
    idx = np.stack((lo, hi), axis=-1).reshape(*blocks.shape[:-1], blocks.shape[-1] * 2)
    lut = np.array(FP4_VALUES, dtype=np.float32).astype(BF16)
    e = (scales.astype(np.int32) - 127)[..., None]
    t = (lut[idx].astype(np.float32) * np.ldexp(np.float32(1), e)).astype(BF16)
    return t.reshape(*t.shape[:-2], -1)


# ---------------------------------------------------------------------------------------
# DeepSeek-V3: deepseek-ai/DeepSeek-V3 inference/kernel.py
#   @ 06231633430c449a1f6a8c0b5a1d6f99860b8eb2
#   (weight_dequant_kernel: y = x.to(f32) * s, stored in the default dtype, bf16)
def deepseek_weight_dequant(x: np.ndarray, s: np.ndarray, block: int = 128) -> np.ndarray:
    m, n = x.shape
    y = np.empty((m, n), dtype=BF16)
    for i in range(-(-m // block)):
        for j in range(-(-n // block)):
            tile = x[i * block : (i + 1) * block, j * block : (j + 1) * block].astype(np.float32)
            y[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile * s[i, j]).astype(
                BF16
            )
    return y


# ---------------------------------------------------------------------------------------
# modelopt: NVIDIA/Model-Optimizer modelopt/torch/quantization/qtensor/nvfp4_tensor.py
#   @ 211c6b3413c52b2fd7a671eda3ce8b2139a4fedd (quantize's packing, dequantize non-fast)
E2M1_VALUES = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)


def modelopt_pack(q: np.ndarray) -> np.ndarray:
    return ((q[..., 1::2] << 4) | q[..., 0::2]).astype(np.uint8)


def modelopt_dequantize(packed, scale_e4m3, scale_2, block: int = 16, dtype=BF16) -> np.ndarray:
    unpacked = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.int64)
    unpacked[..., 1::2] = packed >> 4
    unpacked[..., 0::2] = packed & 0x0F
    deq = E2M1_VALUES[unpacked]
    per_block = scale_e4m3.astype(np.float32) * np.float32(scale_2)
    deq = deq.reshape(*deq.shape[:-1], -1, block) * per_block[..., None]
    return deq.reshape(*packed.shape[:-1], -1).astype(dtype)


# ---------------------------------------------------------------------------------------
# bitsandbytes: bitsandbytes-foundation/bitsandbytes @ 95f9af309d4d5793847169c39288dcd3fcbdf564
#   bitsandbytes/functional.py (get_4bit_type "nf4", create_dynamic_map, QuantState.as_dict)
#   bitsandbytes/utils.py (pack_dict_to_tensor)
#   bitsandbytes/backends/default/ops.py (quantize_4bit's packing, _dequantize_4bit_compute,
#   _dequantize_blockwise_compute)
NF4 = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)


def bnb_dynamic_map(
    signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8
) -> np.ndarray:
    data: list[float] = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(
            2 ** (i + non_sign_bits - max_exponent_bits) + 1
            if signed
            else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1
        )
        boundaries = np.linspace(0.1, 1, fraction_items, dtype=np.float32)
        means = (boundaries[:-1] + boundaries[1:]) / np.float32(2.0)
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        raise NotImplementedError("not ported: the default map has no additional items")
    data.append(0)
    data.append(1.0)
    data += [0] * (256 - len(data))
    data.sort()
    return np.array(data, dtype=np.float32)


def bnb_pack(q: np.ndarray) -> np.ndarray:
    """``packed = (q8[::2] << 4) | q8[1::2]`` over the flat codes (padded to even), (n, 1)."""
    flat = q.reshape(-1).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return ((flat[::2] << 4) | flat[1::2]).reshape(-1, 1)


def bnb_quant_state(
    quant_type: str, blocksize: int, dtype: str, shape, nested: dict | None = None
) -> np.ndarray:
    d = {"quant_type": quant_type, "blocksize": blocksize, "dtype": dtype, "shape": list(shape)}
    if nested is not None:
        d.update(nested)
    return np.frombuffer(json.dumps(d).encode("utf-8"), dtype=np.uint8).copy()


def bnb_dequantize_blockwise(
    a: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int
) -> np.ndarray:
    n = a.size
    out = code[a.reshape(-1).astype(np.int64)]
    rem = n % blocksize
    full = n - rem
    res = np.empty(n, np.float32)
    res[:full] = (out[:full].reshape(-1, blocksize) * absmax[: full // blocksize, None]).reshape(
        full
    )
    if rem:
        res[full:] = out[full:] * absmax[full // blocksize]
    return res


def bnb_dequantize_4bit(a, absmax, code, blocksize: int, shape, dtype, nested=None) -> np.ndarray:
    """dequantize_4bit: nested absmax first (dequantize_blockwise + offset), then codes."""
    if nested is not None:
        nested_absmax, nested_code, nested_blocksize, offset = nested
        absmax = bnb_dequantize_blockwise(absmax, nested_absmax, nested_code, nested_blocksize)
        absmax = absmax + np.float32(offset)
    flat = a.reshape(-1)
    out_dq = np.empty(flat.size * 2, dtype=np.int32)
    out_dq[1::2] = flat & 0xF
    out_dq[::2] = flat >> 4
    n = int(np.prod(shape))
    vals = code[out_dq][:n]
    rem = n % blocksize
    full = n - rem
    out = np.empty(n, np.float32)
    out[:full] = (vals[:full].reshape(-1, blocksize) * absmax[: full // blocksize, None]).reshape(
        full
    )
    if rem:
        out[full:] = vals[full:] * absmax[full // blocksize]
    return out.reshape(-1, *shape[1:]).astype(dtype)
