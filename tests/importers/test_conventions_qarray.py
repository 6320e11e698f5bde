"""Imported safetensors weights as ``emulate.QArray``: decoded bit-identically to each
project's own decoder, and multiplied within the matmul bound on the cpu, tpu_v4, tpu_v5e
and tpu_v7x plans; a double-quantized bitsandbytes checkpoint through emulate.pallas.matmul
(interpret mode) bit for bit where the sum is exact.

This file needs issue 24's quantized representation (``QArray.from_parts`` with
``zero_points``, ``offsets``, ``codebook``, ``perm``; 2-, 3- and 5-bit ``uint`` formats;
QArray scales), which helper h24-rep builds: it passes only once that is merged. The
parsers and their oracles are tested without it in tests/importers/test_conventions.py.
"""

from __future__ import annotations

import dataclasses

import _st_oracles as O
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _st_cases import AWQ_CONFIG, awq_tensors, bnb_tensors, ct_tensors, gptq_tensors, write

import emulate
import emulate.bounds
import emulate.cpu
import emulate.pallas
from emulate.engine import qtiled, tiled
from emulate.importers import safetensors as S

DN = (((1,), (0,)), ((), ()))

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
TARGETS = ("cpu", "tpu_v4", "tpu_v5e", "tpu_v7x")
BF16 = np.dtype(ml_dtypes.bfloat16)


def normal_scales(t: dict[str, np.ndarray], name: str, rng: np.random.Generator) -> None:
    """Replace ``t[name]`` by positive scales of 3 significant bits in [2**-8, 2**-4): no
    special values (the matmul bound needs finite weights), and every weight then holds in
    the project's output dtype exactly, so the project's weights are emulate's float32
    values, the ones the matmul contract speaks of."""
    s = t[name]
    m = np.round(rng.uniform(1, 2, s.shape) * 4) / 4
    t[name] = (m * 2.0 ** rng.integers(-8, -4, s.shape)).astype(s.dtype)


def case(name: str, tmp, rng, layout: str = "in_out"):
    """(QArray, the project's decoded weight (K, N) as float64, its weight with every code
    set to the value 0 (the zero-point term alone) or None, zero_sign)."""
    if name == "awq":
        t = awq_tensors(rng, 64, 32, 16)
        normal_scales(t, "l.scales", rng)
        q = S.load_awq(write(tmp, t, AWQ_CONFIG), "l", layout=layout)
        w = O.awq_dequantize_gemm(t["l.qweight"], t["l.qzeros"], t["l.scales"], 4, 16)
        w0 = O.awq_dequantize_gemm(
            np.zeros_like(t["l.qweight"]), t["l.qzeros"], t["l.scales"], 4, 16
        )
        return q, w, w0, True
    if name.startswith("gptq"):
        bits, v1 = int(name[-2]), name.endswith("1")
        t = gptq_tensors(rng, 128, 32, 32, bits, v1, act_order=True)
        normal_scales(t, "l.scales", rng)
        cfg = {"bits": bits, "group_size": 32, "checkpoint_format": "gptq" if v1 else "gptq_v2"}
        q = S.load_gptq(write(tmp, t, cfg), "l", layout=layout)
        args = (t["l.qzeros"], t["l.scales"], t["l.g_idx"], bits, v1)
        w = O.gptq_dequantize(t["l.qweight"], *args)
        w0 = O.gptq_dequantize(np.zeros_like(t["l.qweight"]), *args)
        return q, w, w0, True
    if name == "ct_int4_asym":
        t, x_q, _, zp, g_idx = ct_tensors(rng, 24, 64, 4, "group", 16, False, True)
        normal_scales(t, "l.weight_scale", rng)
        weights = {
            "num_bits": 4,
            "type": "int",
            "symmetric": False,
            "strategy": "group",
            "group_size": 16,
        }
        q = S.load_compressed_tensors(write(tmp, t), "l", config=weights, layout=layout)
        s = t["l.weight_scale"]
        w = O.ct_dequantize_group(x_q, s, zp, 16, g_idx).T
        w0 = O.ct_dequantize_group(np.zeros_like(x_q), s, zp, 16, g_idx).T
        return q, w, w0, True
    if name == "gpt_oss":
        blocks = rng.integers(0, 256, (2, 8, 2, 16)).astype(np.uint8)
        scales = rng.integers(120, 130, (2, 8, 2)).astype(np.uint8)
        q = S.load_gpt_oss_mxfp4(
            write(tmp, {"w_blocks": blocks, "w_scales": scales}), "w", layout=layout
        )
        return q, np.swapaxes(O.gpt_oss_mxfp4(blocks, scales), -1, -2), None, True
    if name == "fp8":
        w8 = rng.integers(0, 0x7F, (160, 200)).astype(np.uint8)
        w8 |= rng.integers(0, 2, w8.shape).astype(np.uint8) << 7
        w8 = w8.view(ml_dtypes.float8_e4m3fn)
        s = rng.choice([0.5, 0.75, 1.0, 1.25, 1.5], (2, 2)).astype(np.float32)
        cfg = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
        q = S.load_fp8_blocks(
            write(tmp, {"l.weight": w8, "l.weight_scale_inv": s}, cfg), "l", layout=layout
        )
        return q, O.deepseek_weight_dequant(w8, s).T, None, True
    if name == "nvfp4":
        codes = rng.integers(0, 16, (16, 64)).astype(np.uint8)
        s = rng.integers(0x30, 0x60, (16, 4)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
        s2 = np.array(2.0**-6, np.float32)
        t = {"l.weight": O.modelopt_pack(codes), "l.weight_scale": s, "l.weight_scale_2": s2}
        q = S.load_modelopt_nvfp4(write(tmp, t), "l", config={"quant_algo": "NVFP4"}, layout=layout)
        return q, O.modelopt_dequantize(t["l.weight"], s, s2).T, None, False
    if name.startswith("bnb"):
        # float32: the NF4 table's products do not hold in bfloat16
        t, oracle = bnb_tensors(rng, 32, 128, 64, nested=name == "bnb_nested", dtype="float32")
        return S.load_bnb_4bit(write(tmp, t), "l", layout=layout), oracle.T, None, True
    raise AssertionError(name)


CASES = [
    "awq",
    "gptq41",
    "gptq42",
    "gptq31",
    "gptq22",
    "ct_int4_asym",
    "gpt_oss",
    "fp8",
    "nvfp4",
    "bnb",
    "bnb_nested",
]


#: The matmul runs one case per contraction route (the plain and nested codebooks share
#: one; GPTQ v1/v2 differ only in the zero points read): compiles are the cost here.
MATMUL_CASES = [c for c in CASES if c not in ("gptq42", "bnb")]


@pytest.mark.parametrize("name", CASES)
def test_every_loader_returns_the_checkpoints_out_in_orientation(tmp_path, name: str) -> None:
    """One orientation for every importer (issue 40): a per-layer loader returns the
    checkpoint's (out, in) QArray by default, as load_gguf and load_safetensors do, and
    the (in, out) one with layout="in_out": the same values, the last two axes swapped."""
    seed = CASES.index(name)
    q_in, w, _, _ = case(name, tmp_path / "a", np.random.default_rng(seed), layout="in_out")
    q_out, _, _, _ = case(name, tmp_path / "b", np.random.default_rng(seed), layout="out_in")
    assert q_in.shape == w.shape  # (..., K, N): the project's decoded weight, as x @ w
    assert q_out.shape == (*w.shape[:-2], w.shape[-1], w.shape[-2])
    got = np.asarray(emulate.dequantize(q_out, jnp.float32))
    want = np.swapaxes(np.asarray(emulate.dequantize(q_in, jnp.float32)), -1, -2)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", CASES)
def test_an_imported_qarray_gives_its_dense_weights_result_type(tmp_path, name: str) -> None:
    """bf16, f16 and f32 activations times the checkpoint's QArray (float16 AWQ / GPTQ,
    bfloat16 compressed-tensors, FP8, NVFP4, ...) give what jnp.matmul gives with the
    dense weight of the QArray's dtype (issue 40): traced only, nothing compiled."""
    q, _, _, _ = case(name, tmp_path, np.random.default_rng(CASES.index(name)))
    w = jax.ShapeDtypeStruct(q.shape, q.dtype)
    for xd in (jnp.bfloat16, jnp.float16, jnp.float32):
        x = jax.ShapeDtypeStruct((2, q.shape[-2]), xd)
        want = jax.eval_shape(jnp.matmul, x, w).dtype
        assert jax.eval_shape(lambda x: emulate.matmul(x, q), x).dtype == want, (name, xd)


def test_an_unknown_layout_is_refused(tmp_path) -> None:
    t = awq_tensors(np.random.default_rng(0), 64, 32, 16)
    with pytest.raises(ValueError) as e:
        S.load_awq(write(tmp_path, t, AWQ_CONFIG), "l", layout="kn")
    assert str(e.value) == "layout: expected 'out_in' or 'in_out', got 'kn'"


@pytest.mark.parametrize("name", CASES)
def test_imported_qarray_decodes_like_the_project(tmp_path, name: str) -> None:
    rng = np.random.default_rng(CASES.index(name))
    q, w, _, zero_sign = case(name, tmp_path, rng)
    assert isinstance(q, emulate.QArray)
    assert q.shape == w.shape and np.dtype(q.dtype) == w.dtype
    got = np.asarray(emulate.dequantize(q))
    want = np.ascontiguousarray(w)
    if not zero_sign:
        got, want = got + got.dtype.type(0), want + want.dtype.type(0)
    np.testing.assert_array_equal(
        got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}")
    )


#: Each case on one target by default, the targets taken in turn, but GPTQ's 4-bit v1
#: (gptq41: gptq31's route, act-order and v1 zero points, with another code width; the
#: 4-bit codes multiply by default in tests/pallas/test_qoffsets.py); every case on every
#: target under EMULATE_LONG_TESTS=1.
MATMUL_TARGET_LONG = ("gptq41",)
MATMUL_TARGET_CASES = [
    pytest.param(
        name,
        target,
        id=f"{name}-{target}",
        marks=()
        if name not in MATMUL_TARGET_LONG and TARGETS[i % len(TARGETS)] == target
        else pytest.mark.long,
    )
    for i, name in enumerate(MATMUL_CASES)
    for target in TARGETS
]


@pytest.mark.parametrize(("name", "target"), MATMUL_TARGET_CASES)
def test_imported_qarray_matmul_within_bound(tmp_path, name: str, target: str) -> None:
    rng = np.random.default_rng(100 + CASES.index(name))
    q, w, w0, _ = case(name, tmp_path, rng)
    k = w.shape[-2]
    x = rng.standard_normal((3, k)).astype(np.float32)
    got = np.asarray(emulate.matmul(x, q, target=target), np.float64)
    wf = w.astype(np.float64)
    exact = x.astype(np.float64) @ wf
    # docs/numerics.md: gamma_(K + S + 4) * sum|a*b| (S <= K segments), over the weights'
    # magnitudes plus the zero-point term's (a block sum of x times the zero points)
    mag = np.abs(wf) + (0 if w0 is None else np.abs(w0.astype(np.float64)))
    n = 2 * k + 4
    bound = (n * 2.0**-24 / (1 - n * 2.0**-24)) * (np.abs(x) @ mag) + 2.0**-126
    assert np.all(np.abs(got - exact) <= bound)
    # and the plain weight's bound (issue 40): gamma_(K + S + 5) * sum |x| |W|, the zero
    # points subtracted as integers, S the scale blocks along K
    segments = -(-k // q.block_shape[-2])
    n = k + segments + emulate.bounds.QARRAY_ROUTE_TERMS["xla"]  # qarray_bound's, batched
    plain = emulate.bounds.gamma(n) * (np.abs(x) @ np.abs(wf)) + n * 2.0**-125
    assert np.all(np.abs(got - exact) <= plain)


#: The CPU kernel (emulate.cpu) takes the integer conventions (AWQ's packed zero points
#: along N, act-order, 2- and 3-bit GPTQ) under EMULATE_LONG_TESTS=1 (GGUF's Q4_K, by
#: default in test_gguf_qarray.py, runs the kernel's integer loops on a real convention);
#: the table codes (bitsandbytes' NF4 codebook, NVFP4's e2m1 codes with its tensor scale,
#: FP8's e4m3 codes) where the host looks their table of that many bits up in registers
#: (emulate.cpu.table_lookups): FP8 by default, NVFP4 long (each form costs a numba compile
#: of some 20 s on CI's 2 cores; tests/cpu/test_gemv.py runs an NVFP4 weight from
#: emulate.quantize through the kernel, its tensor scale included, long too). gpt_oss's
#: stacked experts are not a kernel form (a batched dot): checked by default (no compile).
NOT_KERNEL = ("gpt_oss",)
TABLE_BITS = {"bnb": 4, "bnb_nested": 4, "nvfp4": 4, "fp8": 8}
KERNEL_DEFAULT = ("fp8", *NOT_KERNEL)


@pytest.mark.parametrize(
    "name",
    [n if n in KERNEL_DEFAULT else pytest.param(n, marks=pytest.mark.long) for n in CASES],
)
def test_imported_qarray_through_the_cpu_kernel_within_bound(tmp_path, name: str) -> None:
    rng = np.random.default_rng(200 + CASES.index(name))
    q, w, _, _ = case(name, tmp_path, rng)
    k = w.shape[-2]
    x = rng.standard_normal((3, k)).astype(np.float32)

    def f(x):
        return emulate.matmul(x, q)

    with emulate.use_cpu_kernel(True):
        taken = "emulate_cpu_gemv_" in jax.jit(f).lower(x).as_text()
        assert taken == (
            name not in NOT_KERNEL
            and (name not in TABLE_BITS or emulate.cpu.table_lookups(TABLE_BITS[name]))
        )
        if not taken:
            return
        got = np.asarray(f(jnp.asarray(x)), np.float64)
    wf = w.astype(np.float64)
    segments = -(-k // q.block_shape[-2])
    n = k + segments + emulate.bounds.QARRAY_ROUTE_TERMS["xla"]
    plain = emulate.bounds.gamma(n) * (np.abs(x) @ np.abs(wf)) + n * 2.0**-125
    assert np.all(np.abs(got - x.astype(np.float64) @ wf) <= plain)


@pytest.mark.parametrize("name", MATMUL_CASES)
def test_imported_qarray_matmul_tiled_on_the_cpu_within_bound(tmp_path, name: str) -> None:
    # the CPU route that dequantizes the weight a tile of columns at a time
    # (emulate.engine.qtiled), forced onto these small weights
    rng = np.random.default_rng(100 + CASES.index(name))
    q, w, w0, _ = case(name, tmp_path, rng)
    k = w.shape[-2]
    x = rng.standard_normal((3, k)).astype(np.float32)
    unpermuted = dataclasses.replace(q, perm=None, perm_axis=None)
    dn = (((1,), (q.ndim - 2,)), ((), ()))
    # the narrowest tile of whole blocks (128 for FP8's 128 x 128 blocks)
    tile = next(
        (
            t
            for t in (8, 64, 128)
            if qtiled.qtiling_for(unpermuted, 1, 2, dn, tiled.Settings(min_bytes=0, tile=t))
        ),
        None,
    )
    # untiled: gpt_oss (stacked experts, a batched dot) and bnb_nested (its absmax's
    # blocks span all 32 columns)
    assert (tile is None) == (name in ("gpt_oss", "bnb_nested"))
    with tiled.settings(min_bytes=0, tile=tile):
        got = np.asarray(emulate.matmul(x, q, target="cpu"), np.float64)
    wf = w.astype(np.float64)
    mag = np.abs(wf) + (0 if w0 is None else np.abs(w0.astype(np.float64)))
    n = 2 * k + 4  # as test_imported_qarray_matmul_within_bound
    bound = (n * 2.0**-24 / (1 - n * 2.0**-24)) * (np.abs(x) @ mag) + 2.0**-126
    assert np.all(np.abs(got - x.astype(np.float64) @ wf) <= bound)


@pytest.mark.parametrize("quant_type", ["nf4", pytest.param("fp4", marks=pytest.mark.long)])
def test_double_quantized_bnb_through_the_pallas_kernel_bit_for_bit(tmp_path, quant_type) -> None:
    # K = 4096: bitsandbytes' nested blocks of 256 absmax codes are (64, 4) blocks of the
    # (K / 64, N) scale grid; N = 602 ends in a partial one, and the kernel reads the 151
    # nested scales in windows of 128 (the last one partial) over three output blocks
    rng = np.random.default_rng(31)
    n, k = 602, 4096
    t, oracle = bnb_tensors(rng, n, k, 64, nested=True, quant_type=quant_type, dtype="float32")
    q = S.load_bnb_4bit(write(tmp_path, t), "l", layout="in_out")
    p = emulate.pallas.prepare_weight(q)
    assert p.nbytes == q.nbytes
    # one power-of-two x per row, in groups 0, 1, 63 and in between: every product, the
    # group's scale and the sum are exact but one rounding, bnb's float32 weight times 2**e
    rows = [0, 64, 130, 2049, 4000, 4095]
    x = np.zeros((len(rows), k), ml_dtypes.bfloat16)
    x[np.arange(len(rows)), rows] = 2.0 ** np.arange(-3, len(rows) - 3)
    got = np.asarray(emulate.pallas.matmul(x, p, target="tpu_v5e", out_dtype=jnp.float32))
    want = oracle.T[rows] * (2.0 ** np.arange(-3, len(rows) - 3))[:, None].astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    same = emulate.dot_general(x, q, DN, preferred_element_type=jnp.float32, target="tpu_v5e")
    np.testing.assert_array_equal(np.asarray(same).view(np.uint32), want.view(np.uint32))
    # the gradient is that of the dequantized weight: d/dx sum(x @ W) = the row sums of W
    dx = jax.grad(
        lambda x: emulate.pallas.matmul(x, p, target="tpu_v5e", out_dtype=jnp.float32).sum()
    )(jnp.ones((1, k), jnp.float32))
    w64 = oracle.T.astype(np.float64)
    err = np.abs(np.asarray(dx[0], np.float64) - w64.sum(axis=1))
    assert np.all(err <= n * 2.0**-24 * np.abs(w64).sum(axis=1))
