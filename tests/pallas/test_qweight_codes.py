"""emulate.pallas.matmul with QArray weights of the 2- to 6-bit integer code formats
(``emulate.formats.CODE_FORMATS``: int2 ... uint6, GGUF Q2_K, Q3_K, Q5_K, Q6_K, 2/3-bit
GPTQ), in TPU interpret mode on the CPU:

* exact pairs (int8 activations, power-of-two per-column scales): bit for bit
  ``emulate.dot_general`` and an integer oracle, codes as uint8 or ``emulate.pack``ed,
  unprepared and prepared (no more bytes than stored), a ragged K;
* GGUF K-quants made by the importer from random blocks (finite float16 ``d``), bf16
  activations: within ``gamma_(K + S + 5) * sum|x| (|q s| + |z s| + |o|)`` of the float64
  sum over ``gguf.quants.dequantize``'s values (the magnitudes from the same oracle: the
  blocks with their code bytes zeroed give ``z s`` and ``o``);
* 2- and 3-bit GPTQ-like weights (zero points of the codes' width, packed): bit for bit;
  2- and 3-bit GPTQ v1 checkpoints read by ``load_gptq`` (act-order too): within the bound
  of the numpy port of GPTQ's dequantization;
* compile-only, the real TPU compiler on prepared Q6_K / Q5_K / Q2_K / Q3_K and 3-bit
  GPTQ weights, Mosaic's compatibility mode on and off (Q6_K on v5e by default; every
  scheme on v2, v3, v4, v5e, v5p, v6e, 7x long).
"""

from __future__ import annotations

import functools
import pathlib
import sys

import _compile_only as compile_only
import gguf as gguf_py
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate import bounds
from emulate.importers import ggml, gguf
from emulate.importers import safetensors as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "importers"))
import _st_oracles as st_oracles  # noqa: E402
from _st_cases import gptq_tensors, write  # noqa: E402

DN = (((1,), (0,)), ((), ()))


def _bits(a) -> np.ndarray:
    a = np.asarray(a, np.float32)
    return a.view(np.uint32)


def _codes(fmt: str, shape, rng) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes, int64 values) of an integer code format, every code drawn."""
    bits = int(fmt.removeprefix("u").removeprefix("int"))
    c = rng.integers(0, 1 << bits, shape).astype(np.uint8)
    c.flat[: 1 << bits] = np.arange(1 << bits)  # every code at least once
    v = c.astype(np.int64)
    if not fmt.startswith("u"):
        v = np.where(v >= 1 << (bits - 1), v - (1 << bits), v)
    return c, v


@pytest.mark.parametrize(
    "fmt, packed",
    [
        ("int6", True),
        pytest.param("int3", True, marks=pytest.mark.long),
        pytest.param("uint5", False, marks=pytest.mark.long),
        pytest.param("uint2", True, marks=pytest.mark.long),
        pytest.param("uint6", False, marks=pytest.mark.long),
        pytest.param("int5", True, marks=pytest.mark.long),
        pytest.param("int2", False, marks=pytest.mark.long),
        pytest.param("uint3", False, marks=pytest.mark.long),
    ],
)
def test_exact_codes_match_dot_general_and_the_integer_oracle_bit_for_bit(fmt, packed):
    rng = np.random.default_rng(hash(fmt) % 2**32)
    k, n, m = 300, 128, 8  # a ragged K: not a whole K-planar tile of any width
    c, v = _codes(fmt, (k, n), rng)
    e = rng.integers(-3, 4, (1, n))
    scales = np.ldexp(1.0, e).astype(np.float32)
    codes = emulate.pack(c, fmt, axis=0) if packed else jnp.asarray(c)
    q = emulate.QArray.from_parts(codes, scales, block_shape=(k, 1), fmt=fmt)
    xi = rng.integers(-128, 128, (m, k))
    x = xi.astype(np.int8)
    want = (xi @ v * np.ldexp(1.0, e)).astype(np.float32)  # |sum| < 2**24: exact in f32
    same = emulate.dot_general(x, q, DN, preferred_element_type="float32", target="tpu_v5e")
    np.testing.assert_array_equal(_bits(same), _bits(want))
    p = emulate.pallas.prepare_weight(q)  # K-planar: zero codes up to a whole tile
    for w in (q, p):
        got = emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype="float32")
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize(
    "fmt, group",
    [("uint3", 128), pytest.param("uint2", 64, marks=pytest.mark.long)],
)
def test_gptq_zero_points_of_their_width_match_dot_general_bit_for_bit(fmt, group):
    """2- and 3-bit GPTQ: codes and zero points of the same width (the zero points
    packed along N as the importer stores them), power-of-two float16 scales per group."""
    rng = np.random.default_rng(len(fmt) + group)
    bits = int(fmt[4:])
    k, n, m = 640, 128, 8  # five groups of 128, or ten of 64
    c, v = _codes(fmt, (k, n), rng)
    zc = rng.integers(0, 1 << bits, (k // group, n)).astype(np.uint8)
    e = rng.integers(-2, 3, (k // group, n))
    q = emulate.QArray.from_parts(
        emulate.pack(c, fmt, axis=0),
        np.ldexp(1.0, e).astype(np.float16),
        block_shape=(group, 1),
        fmt=fmt,
        zero_points=emulate.pack(zc, fmt, axis=1),
    )
    xi = rng.integers(-128, 128, (m, k))
    x = xi.astype(np.int8)
    wv = (v - np.repeat(zc.astype(np.int64), group, axis=0)) * np.repeat(np.ldexp(1.0, e), group, 0)
    want = (xi @ wv).astype(np.float32)  # every partial sum a multiple of 2**-2 below 2**22
    same = emulate.dot_general(x, q, DN, preferred_element_type="float32", target="tpu_v5e")
    np.testing.assert_array_equal(_bits(same), _bits(want))
    p = emulate.pallas.prepare_weight(q)
    for w in (q, p):
        got = emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype="float32")
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize(
    "bits, act_order",
    [pytest.param(3, True, marks=pytest.mark.long), pytest.param(2, False, marks=pytest.mark.long)],
)
def test_gptq_checkpoints_from_the_importer_are_within_the_bound(tmp_path, bits, act_order):
    """2- and 3-bit GPTQ v1 tensors read by ``load_gptq``, against the numpy port of
    GPTQ's dequantization (tests/importers/_st_oracles.py); the magnitudes ``|q s| +
    |z s|`` from the same oracle (``z s``: every code 0)."""
    rng = np.random.default_rng(bits)
    k, n, m, group = 512, 128, 8, 128
    t = gptq_tensors(rng, k, n, group, bits, True, act_order=act_order)
    t["l.scales"] = (rng.random(t["l.scales"].shape) * 0.01 + 1e-3).astype(np.float16)
    cfg = {"bits": bits, "group_size": group, "checkpoint_format": "gptq"}
    q = st.load_gptq(write(tmp_path, t, cfg), "l", layout="in_out")
    assert q.format_name == f"uint{bits}"
    args = (t["l.qzeros"], t["l.scales"], t["l.g_idx"], bits, True)
    w = st_oracles.gptq_dequantize(t["l.qweight"], *args).astype(np.float64)
    w0 = st_oracles.gptq_dequantize(np.zeros_like(t["l.qweight"]), *args).astype(np.float64)
    mag = np.abs(w - w0) + np.abs(w0)
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    want = np.asarray(x, np.float64) @ w
    bound = bounds.dot_general_bound(np.asarray(x, np.float32), mag, DN, extra_terms=k // group + 5)
    got = np.asarray(emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32"))
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), float(np.max(err - bound))
    assert np.count_nonzero(got) > got.size // 2


# --- GGUF K-quants from the importer, against gguf-py's dequantize ------------------------

#: type: (byte ranges of its element codes in a block, the float16 fields, group rows)
_K_QUANTS = {
    "Q6_K": (((0, 192),), (208,), 16),
    "Q5_K": (((16, 176),), (0, 2), 32),
    "Q2_K": (((16, 80),), (80, 82), 16),
    "Q3_K": (((0, 96),), (108,), 16),
}


def _blocks(name: str, n: int, k: int, rng) -> np.ndarray:
    """Random blocks for an (n, k) tensor with finite float16 fields in [1e-3, 1.1e-2)."""
    block, size = ggml.BLOCKS[name]
    nb = n * k // block
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    for off in _K_QUANTS[name][1]:
        d = (rng.random(nb) * 0.01 + 0.001).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw


def _oracle(raw: np.ndarray, name: str, n: int) -> np.ndarray:
    kind = getattr(gguf_py.GGMLQuantizationType, name)
    return gguf_py.quants.dequantize(raw.reshape(n, -1), kind).astype(np.float64).T


def _weight(name: str, n: int, k: int, seed: int):
    raw = _blocks(name, n, k, np.random.default_rng(seed))
    return raw, gguf.to_qarray(ggml.parse_blocks(raw, name, (n, k), name="test." + name)).T


@pytest.mark.parametrize(
    "name", [pytest.param(s, marks=[] if s == "Q6_K" else [pytest.mark.long]) for s in _K_QUANTS]
)
def test_gguf_k_quants_are_within_the_bound(name):
    n, k, m = 128, 512, 8
    raw, q = _weight(name, n, k, seed=len(name) + ord(name[1]))
    w = _oracle(raw, name, n)
    zeroed = raw.copy()
    for lo, hi in _K_QUANTS[name][0]:
        zeroed[:, lo:hi] = 0
    w0 = _oracle(zeroed, name, n)  # every code 0: -z s + o per element
    mag = np.abs(w - w0) + np.abs(w0)  # |q s| + |z s| + |o|
    x = np.random.default_rng(5).standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    want = np.asarray(x, np.float64) @ w
    groups = k // _K_QUANTS[name][2]
    bound = bounds.dot_general_bound(np.asarray(x, np.float32), mag, DN, extra_terms=groups + 5)
    p = emulate.pallas.prepare_weight(q)
    if k % p.codes.tile == 0:  # 3- and 5-bit tiles are 1024 rows: K = 512 pads to one
        assert p.nbytes <= q.nbytes
    for wq in (q, p):
        got = np.asarray(emulate.pallas.matmul(x, wq, target="tpu_v5e", out_dtype="float32"))
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= bound), (name, float(np.max(err - bound)))
        assert np.count_nonzero(got) > got.size // 2


# --- compile-only: the real TPU compiler -------------------------------------------------

_CN, _CK, _CM = 256, 1024, 64


def _gptq3(k: int, n: int, rng) -> emulate.QArray:
    """A 3-bit GPTQ-like weight: uint3 codes and zero points, float16 scales per 128 rows."""
    return emulate.QArray.from_parts(
        emulate.pack(rng.integers(0, 8, (k, n)).astype(np.uint8), "uint3", axis=0),
        (rng.random((k // 128, n)) * 0.01 + 1e-3).astype(np.float16),
        block_shape=(128, 1),
        fmt="uint3",
        zero_points=emulate.pack(
            rng.integers(0, 8, (k // 128, n)).astype(np.uint8), "uint3", axis=1
        ),
    )


@functools.cache
def _prepared(name: str):
    if name == "GPTQ3":
        q = _gptq3(_CK, _CN, np.random.default_rng(1))
    else:
        _, q = _weight(name, _CN, _CK, seed=1)
    return jax.tree_util.tree_flatten(emulate.pallas.prepare_weight(q))


def compiled_program(x, *leaves, name: str, target: str):
    """emulate.pallas.matmul of bf16 activations and a prepared GGUF weight."""
    w = jax.tree_util.tree_unflatten(_prepared(name)[1], leaves)
    return emulate.pallas.matmul(x, w, target=target, out_dtype="bfloat16", interpret=False)


def _specs(name: str) -> tuple:
    leaves = _prepared(name)[0]
    x = jax.ShapeDtypeStruct((_CM, _CK), jnp.bfloat16)
    return (x, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in leaves))


RUNS = compile_only.runs(
    (*_K_QUANTS, "GPTQ3"),
    ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x"),
    {("Q6_K", "tpu_v5e")},
)


verdicts = compile_only.fixture("name", compiled_program, _specs)


@pytest.mark.parametrize("name, target", RUNS)
def test_the_tpu_compiler_compiles_it(verdicts, name, target):
    compile_only.assert_compiles(verdicts, name, target)
