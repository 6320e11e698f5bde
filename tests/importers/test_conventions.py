"""The safetensors conventions against each project's own decoder (tests/importers/
_st_oracles.py: ported from the projects' published source, commits cited there).

For each convention: tiny tensors written in the project's layout (by its own packing
code, ported) into a .safetensors file, read back by emulate's importer, decoded by the
parts' formula and by the project's decoder: bit-identical. One case per convention is
cross-checked by a second route (another of the project's own code paths). Wrong-layout
controls miss the matmul bound by orders of magnitude. Reading and refusing:
tests/importers/test_safetensors.py.
"""

from __future__ import annotations

import json

import _st_oracles as O
import ml_dtypes
import numpy as np
import pytest
from _st_cases import (
    AWQ_CONFIG,
    F16,
    awq_tensors,
    bnb_tensors,
    bound_ratio,
    ct_tensors,
    decoded,
    gptq_tensors,
    half_scales,
    mx_scales,
    same_bits,
    write,
)
from hypothesis import example, given
from hypothesis import strategies as st

from emulate.importers import safetensors as S
from emulate.importers.stored import StoredParts

# the oracles decode Inf and NaN scales as the projects do, with numpy's warnings
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


seeds = st.integers(0, 2**32 - 1)

# ------------------------------------------------------------------------------------ AWQ


@given(
    seed=seeds, kg=st.integers(1, 3), n8=st.integers(1, 3), group=st.sampled_from([1, 8, 16, 32])
)
def test_awq_matches_autoawq(tmp_path_factory, seed: int, kg: int, n8: int, group: int) -> None:
    rng = np.random.default_rng(seed)
    k, n = kg * group, n8 * 8
    t = awq_tensors(rng, k, n, group)
    path = write(tmp_path_factory.mktemp("awq"), t, {**AWQ_CONFIG, "group_size": group})
    parts = S.read_awq(path, "l")
    assert parts.shape == (k, n) and parts.block_shape == (group, 1) and parts.fmt == "uint4"
    same_bits(
        decoded(parts),
        O.awq_dequantize_gemm(t["l.qweight"], t["l.qzeros"], t["l.scales"], 4, group),
    )


def test_awq_second_route_autoawq_exllama_converter(tmp_path) -> None:
    """AutoAWQ's own AWQ -> exllama (GPTQ v1) converter, read as GPTQ: the same weights."""
    rng = np.random.default_rng(1)
    t = awq_tensors(rng, 64, 32, 16, zmin=1)  # v1 stores zeros - 1: a zero of 0 would borrow
    qw, qz = O.awq_unpack_reorder_pack(t["l.qweight"], t["l.qzeros"])
    awq = S.read_awq(write(tmp_path / "a", t, AWQ_CONFIG), "l")
    gptq_file = write(tmp_path / "g", {"l.qweight": qw, "l.qzeros": qz, "l.scales": t["l.scales"]})
    gptq = S.read_gptq(
        gptq_file, "l", config={"bits": 4, "group_size": 16, "checkpoint_format": "gptq"}
    )
    same_bits(decoded(awq), decoded(gptq))
    np.testing.assert_array_equal(awq.codes, gptq.codes)


def test_awq_without_its_interleave_misses_the_bound(tmp_path) -> None:
    rng = np.random.default_rng(2)
    t = awq_tensors(rng, 64, 64, 16)
    t["l.scales"] = np.abs(rng.standard_normal((4, 64))).astype(F16) * F16(0.01)
    right = O.awq_dequantize_gemm(t["l.qweight"], t["l.qzeros"], t["l.scales"], 4, 16)
    # the same file read with the nibbles in plain order (no [0,2,4,6,1,3,5,7] interleave)
    wrong = S.read_awq(
        write(
            tmp_path,
            {**t, "l.qweight": O.awq_pack(O.awq_unpack(t["l.qweight"], t["l.qzeros"])[0] & 15)},
            AWQ_CONFIG,
        ),
        "l",
    )
    x = rng.standard_normal((8, 64))
    assert bound_ratio(x, right, decoded(wrong)) > 1e3
    assert bound_ratio(x, right, right) == 0


# ----------------------------------------------------------------------------------- GPTQ


@given(
    seed=seeds,
    bits=st.sampled_from([2, 3, 4, 8]),
    v1=st.booleans(),
    act_order=st.booleans(),
    group=st.sampled_from([32, 64]),
    kg=st.integers(1, 3),
    ragged=st.booleans(),
    n32=st.integers(1, 2),
)
@example(seed=0, bits=8, v1=True, act_order=False, group=32, kg=2, ragged=False, n32=1)
def test_gptq_matches_gptqmodel(
    tmp_path_factory, seed, bits, v1, act_order, group, kg, ragged, n32
) -> None:
    rng = np.random.default_rng(seed)
    k, n = kg * group + (32 if ragged and group == 64 else 0), n32 * 32  # ragged last group
    t = gptq_tensors(rng, k, n, group, bits, v1, act_order)
    cfg = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group,
        "checkpoint_format": "gptq" if v1 else "gptq_v2",
    }
    parts = S.read_gptq(write(tmp_path_factory.mktemp("gptq"), t, cfg), "l")
    assert (parts.perm is not None) == (
        act_order and not np.array_equal(t["l.g_idx"], np.arange(k) // group)
    )
    oracle = O.gptq_dequantize(t["l.qweight"], t["l.qzeros"], t["l.scales"], t["l.g_idx"], bits, v1)
    same_bits(decoded(parts), oracle)
    # v1 zero points are the field + 1, up to 2**bits: one bit wider than stored, which
    # at 8 bits means int16 (docs/quantized.md), 8 bits more per zero point than the file.
    widened = 8 * t["l.scales"].size if v1 and bits == 8 else 0
    assert parts.bits_per_element <= 1.02 * (parts.stored_bits + widened) / parts.size
    if widened:
        assert parts.zero_points.dtype == np.int16


def test_gptq_second_route_v1_to_v2_conversion(tmp_path) -> None:
    """GPTQModel's v1 -> v2 conversion (qzeros words + 0x11111111) reads the same."""
    rng = np.random.default_rng(3)
    t = gptq_tensors(rng, 128, 64, 32, 4, v1=True, act_order=True)
    v1 = S.read_gptq(write(tmp_path / "1", t), "l", config={"bits": 4, "group_size": 32})
    t2 = {**t, "l.qzeros": O.gptq_v1_to_v2_qzeros_4bit(t["l.qzeros"])}
    v2 = S.read_gptq(
        write(tmp_path / "2", t2),
        "l",
        config={"bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2"},
    )
    same_bits(decoded(v1), decoded(v2))


def test_gptq_ignoring_g_idx_misses_the_bound(tmp_path) -> None:
    rng = np.random.default_rng(4)
    t = gptq_tensors(rng, 256, 32, 32, 4, v1=False, act_order=True)
    t["l.scales"] = (
        np.abs(rng.standard_normal(t["l.scales"].shape))
        * 2.0 ** rng.integers(-8, 0, t["l.scales"].shape)
    ).astype(F16)
    cfg = {"bits": 4, "group_size": 32, "checkpoint_format": "gptq_v2"}
    right = O.gptq_dequantize(t["l.qweight"], t["l.qzeros"], t["l.scales"], t["l.g_idx"], 4, False)
    no_gidx = {k: v for k, v in t.items() if k != "l.g_idx"}
    wrong = S.read_gptq(write(tmp_path, no_gidx), "l", config=cfg)
    x = rng.standard_normal((8, 256))
    assert bound_ratio(x, right, decoded(wrong)) > 1e3


# ------------------------------------------------------------------- compressed-tensors int


@given(
    seed=seeds,
    bits=st.sampled_from([2, 4, 8]),
    strategy=st.sampled_from(["group", "channel", "tensor"]),
    symmetric=st.booleans(),
    act_order=st.booleans(),
    bf16=st.booleans(),
)
def test_compressed_tensors_int_matches(
    tmp_path_factory, seed, bits, strategy, symmetric, act_order, bf16
) -> None:
    rng = np.random.default_rng(seed)
    symmetric = symmetric or strategy == "tensor"
    act_order = act_order and strategy == "group"
    n, k, group = 24, 64, 16
    dtype = np.dtype(ml_dtypes.bfloat16) if bf16 else np.dtype(F16)
    t, q, scale, zp, g_idx = ct_tensors(
        rng, n, k, bits, strategy, group, symmetric, act_order, dtype
    )
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": strategy,
        "group_size": group,
    }
    cfg = {
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }
    parts = S.read_compressed_tensors(write(tmp_path_factory.mktemp("ct"), t, cfg), "l")
    x_q = O.ct_unpack_from_int32(t["l.weight_packed"], bits, (n, k))
    np.testing.assert_array_equal(x_q, q)  # the project's own unpacker round-trips its packer
    zp_read = (
        None
        if symmetric
        else O.ct_unpack_from_int32(t["l.weight_zero_point"], bits, zp.shape, packed_dim=0)
    )
    oracle = O.ct_dequantize_group(x_q, scale, zp_read, k // scale.shape[1], g_idx)
    same_bits(decoded(parts), np.ascontiguousarray(oracle.T))


def test_compressed_tensors_second_route_quantize_dequantize(tmp_path) -> None:
    """compressed-tensors' fused quantize-dequantize of a float weight equals dequantizing
    the codes its quantizer stores (same scale and zero point), read by emulate."""
    rng = np.random.default_rng(5)
    n, k, group, bits = 16, 64, 32, 4
    w = rng.standard_normal((n, k)).astype(np.float32)
    scale = (np.abs(w).reshape(n, -1, group).max(-1) / 7).astype(F16)
    zp = rng.integers(-2, 3, scale.shape).astype(np.int8)
    scaled = w.reshape(n, -1, group) / scale[..., None].astype(np.float32) + zp[..., None]
    q = np.clip(np.round(scaled), -8, 7)
    qdq = ((q.astype(F16) - zp[..., None].astype(F16)) * scale[..., None]).reshape(n, k)
    qdq = qdq + F16(0)  # the fused path keeps round()'s -0.0; stored int8 codes have none
    t = {
        "l.weight_packed": O.ct_pack_to_int32(q.reshape(n, k).astype(np.int8), bits),
        "l.weight_shape": np.array([n, k], np.int64),
        "l.weight_scale": scale,
        "l.weight_zero_point": O.ct_pack_to_int32(zp, bits, packed_dim=0),
    }
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": False,
        "strategy": "group",
        "group_size": group,
    }
    parts = S.read_compressed_tensors(write(tmp_path, t), "l", config=weights)
    same_bits(decoded(parts), np.ascontiguousarray(qdq.T))


# ------------------------------------------------------------------------ gpt-oss MXFP4


@given(
    seed=seeds,
    experts=st.integers(1, 3),
    n=st.integers(1, 5),
    g=st.integers(1, 3),
    dot=st.booleans(),
)
def test_gpt_oss_mxfp4_matches(tmp_path_factory, seed, experts, n, g, dot) -> None:
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (experts, n, g, 16)).astype(np.uint8)
    scales = mx_scales(rng, (experts, n, g))
    sep = "." if dot else "_"
    path = write(
        tmp_path_factory.mktemp("oss"),
        {f"e.mlp1_weight{sep}blocks": blocks, f"e.mlp1_weight{sep}scales": scales},
    )
    parts = S.read_gpt_oss_mxfp4(path, "e.mlp1_weight")
    assert parts.shape == (experts, g * 32, n) and parts.block_shape == (1, 32, 1)
    oracle = O.gpt_oss_mxfp4(blocks, scales)
    same_bits(decoded(parts), np.ascontiguousarray(np.swapaxes(oracle, -1, -2)))
    same_bits(oracle, O.gpt_oss_mxfp4_copy(blocks, scales))  # second route: the short version


def test_gpt_oss_scale_255_is_nan_in_e8m0_and_inf_in_gpt_oss(tmp_path) -> None:
    blocks = np.full((1, 1, 16), 0x22, np.uint8)  # every element 1.0
    scales = np.array([[255]], np.uint8)
    parts = S.read_gpt_oss_mxfp4(write(tmp_path, {"w_blocks": blocks, "w_scales": scales}), "w")
    assert np.isnan(parts.dequantize()).all()
    assert np.isposinf(O.gpt_oss_mxfp4(blocks, scales).astype(np.float32)).all()


# -------------------------------------------------------------------------- FP8 blocks
@given(seed=seeds, n=st.integers(1, 300), k=st.integers(1, 300))
def test_fp8_blocks_match_deepseek(tmp_path_factory, seed, n, k) -> None:
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (n, k)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    s = half_scales(rng, (-(-n // 128), -(-k // 128)), np.float32)
    cfg = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    parts = S.read_fp8_blocks(
        write(tmp_path_factory.mktemp("fp8"), {"l.weight": w, "l.weight_scale_inv": s}, cfg), "l"
    )
    oracle = O.deepseek_weight_dequant(w, s)
    same_bits(decoded(parts), np.ascontiguousarray(oracle.T))
    # second route: emulate's FP8 codes through ml_dtypes, scales repeated by np.kron
    kron = np.kron(s, np.ones((128, 128), np.float32))[:n, :k]
    same_bits(decoded(parts), np.ascontiguousarray((w.astype(np.float32) * kron).astype(O.BF16).T))


# ------------------------------------------------------------------------ modelopt NVFP4
@given(seed=seeds, n=st.integers(1, 6), kb=st.integers(1, 4), lead=st.integers(0, 1))
def test_modelopt_nvfp4_matches(tmp_path_factory, seed, n, kb, lead) -> None:
    rng = np.random.default_rng(seed)
    shape = (2,) * lead + (n, kb * 16)
    q = rng.integers(0, 16, shape).astype(np.uint8)
    s = rng.integers(0, 0x7F, shape[:-1] + (kb,)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    s2 = np.array(rng.standard_normal() * 2.0 ** rng.integers(-20, 4), np.float32)
    t = {
        "l.weight": O.modelopt_pack(q),
        "l.weight_scale": s,
        "l.weight_scale_2": s2,
        "l.input_scale": np.float32(1).reshape(()),
    }
    cfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    parts = S.read_modelopt_nvfp4(write(tmp_path_factory.mktemp("nv"), t, cfg), "l")
    oracle = O.modelopt_dequantize(t["l.weight"], s, s2)
    # modelopt's e2m1 table reads the code of -0 as +0; e2m1 (and emulate) keep -0
    same_bits(decoded(parts), np.ascontiguousarray(np.swapaxes(oracle, -1, -2)), zero_sign=False)


def test_modelopt_nvfp4_second_route_compressed_tensors_converter(tmp_path) -> None:
    """compressed-tensors' ModelOptNvfp4Converter (weight_global_scale = 1/weight_scale_2)
    decoded by compressed-tensors: the same weights (a power-of-two scale_2: exact)."""
    rng = np.random.default_rng(6)
    q = rng.integers(0, 16, (8, 64)).astype(np.uint8)
    s = rng.integers(0, 0x7F, (8, 4)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    s2 = np.array(2.0**-7, np.float32)
    packed = O.modelopt_pack(q)
    modelopt = S.read_modelopt_nvfp4(
        write(tmp_path / "m", {"l.weight": packed, "l.weight_scale": s, "l.weight_scale_2": s2}),
        "l",
        config={"quant_algo": "NVFP4"},
    )
    ct = {
        "l.weight_packed": packed,
        "l.weight_scale": s,
        "l.weight_global_scale": (1 / s2).reshape(1),
    }
    ct_parts = S.read_compressed_tensors(
        write(tmp_path / "c", ct), "l", config={"format": "nvfp4-pack-quantized"}
    )
    oracle = O.ct_dequantize_nvfp4(packed, s, ct["l.weight_global_scale"])
    same_bits(decoded(modelopt), np.ascontiguousarray(oracle.T))
    same_bits(decoded(modelopt), O.modelopt_dequantize(packed, s, s2).T, zero_sign=False)
    same_bits(decoded(ct_parts), np.ascontiguousarray(oracle.T))


@given(seed=seeds, mx=st.booleans())
def test_compressed_tensors_fp4_matches(tmp_path_factory, seed, mx) -> None:
    rng = np.random.default_rng(seed)
    group = 32 if mx else 16
    q = rng.integers(0, 16, (6, 2 * group)).astype(np.uint8)
    packed = O.ct_pack_fp4(q)
    if mx:
        s = mx_scales(rng, (6, 2))
        t = {"l.weight_packed": packed, "l.weight_scale": s}
        oracle = O.ct_dequantize_mxfp4(packed, s)
        # second route: the same bytes are gpt-oss's MXFP4 blocks of 32 (16 bytes each)
        oss = O.gpt_oss_mxfp4(packed.reshape(6, 2, 16), s)
        same_bits(oss, oracle)
    else:
        s = rng.integers(0, 0x7F, (6, 2)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
        g = np.array([rng.uniform(1, 3000)], np.float32)
        t = {"l.weight_packed": packed, "l.weight_scale": s, "l.weight_global_scale": g}
        oracle = O.ct_dequantize_nvfp4(packed, s, g)
    cfg = {"format": "mxfp4-pack-quantized" if mx else "nvfp4-pack-quantized"}
    parts = S.read_compressed_tensors(write(tmp_path_factory.mktemp("ctfp4"), t, cfg), "l")
    same_bits(decoded(parts), np.ascontiguousarray(oracle.T))


# -------------------------------------------------------------------------- bitsandbytes


@given(
    seed=seeds,
    nested=st.booleans(),
    fp4=st.booleans(),
    shape=st.sampled_from([(8, 64), (3, 128), (64, 32), (16, 256), (80, 64), (3, 32), (5, 16)]),
    dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
)
def test_bnb_4bit_matches_bitsandbytes(tmp_path_factory, seed, nested, fp4, shape, dtype) -> None:
    rng = np.random.default_rng(seed)
    n, k = shape
    t, oracle = bnb_tensors(rng, n, k, 64, nested, "fp4" if fp4 else "nf4", dtype, specials=True)
    parts = S.read_bnb_4bit(write(tmp_path_factory.mktemp("bnb"), t), "l")
    assert isinstance(parts.scales, StoredParts) == nested
    same_bits(decoded(parts), np.ascontiguousarray(oracle.T))


def test_bnb_second_route_nested_equals_its_dequantized_absmax(tmp_path) -> None:
    rng = np.random.default_rng(7)
    t, oracle = bnb_tensors(rng, 64, 256, 64, nested=True)
    absmax = O.bnb_dequantize_blockwise(
        t["l.weight.absmax"], t["l.weight.nested_absmax"], t["l.weight.nested_quant_map"], 256
    )
    absmax = absmax + np.float32(
        json.loads(t["l.weight.quant_state.bitsandbytes__nf4"].tobytes())["nested_offset"]
    )
    plain = {k: v for k, v in t.items() if "nested" not in k and "quant_state" not in k}
    plain |= {
        "l.weight.absmax": absmax,
        "l.weight.quant_state.bitsandbytes__nf4": O.bnb_quant_state(
            "nf4", 64, "bfloat16", (64, 256)
        ),
    }
    a = S.read_bnb_4bit(write(tmp_path / "n", t), "l")
    b = S.read_bnb_4bit(write(tmp_path / "p", plain), "l")
    same_bits(decoded(a), decoded(b))
    same_bits(decoded(a), np.ascontiguousarray(oracle.T))


def test_bnb_low_nibble_first_misses_the_bound(tmp_path) -> None:
    rng = np.random.default_rng(8)
    t, oracle = bnb_tensors(rng, 32, 64, 64, nested=False)
    swapped = {**t, "l.weight": ((t["l.weight"] << 4) | (t["l.weight"] >> 4)).astype(np.uint8)}
    wrong = S.read_bnb_4bit(write(tmp_path, swapped), "l")
    assert (
        bound_ratio(rng.standard_normal((4, 64)), oracle.T.astype(np.float32), decoded(wrong)) > 1e3
    )
