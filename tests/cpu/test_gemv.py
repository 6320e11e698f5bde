"""emulate.cpu.gemv: the CPU kernel through emulate.dot_general, against the numpy oracle
(emulate.reference) and exact integer sums. Each checkpoint convention against its own
project's decoder: tests/importers/test_gguf_qarray.py and test_conventions_qarray.py
(``*cpu_kernel*``).

Each weight form costs a numba compile of some 20 s on CI's 2 cores: most tests share one
(int4 codes packed along K in blocks of 32 with e8m0 scales: columns, two codes a byte),
a second is rows as stored (N, K) through the vector steps of byte groups (uint3 codes, a
group of 8 in 3 bytes, zero point 4, float32 scales per 16: _rows_weight, shared with
tests/cpu/test_dequantized.py and the default case of the code widths), a third one code
a byte in columns (int8). Each other test adds a form that no shared one covers and is
long (EMULATE_LONG_TESTS=1), and so is the threaded kernel of the rows form: more
code widths, GGUF Q4_0's rows (uint4 codes, zero point 8: the rows' nibble loop, which runs
by default on Q4_K in tests/importers/test_gguf_qarray.py), an odd K's bit-stream reader in
the column loop, a table code, NVFP4's tensor scale, stored zero points.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _dequantized_product import as_dequantized

import emulate
import emulate.bounds
import emulate.cpu
from emulate import cpu
from emulate.cpu import route
from emulate.cpu.form import Loop, weight_form
from emulate.quantized.array import QArray

K, N = 64, 72  # N: one step of 64 columns and 8 after it (layout COLUMNS)
KN = (((1,), (0,)), ((), ()))


def _weight(k: int = K, seed: int = 0) -> tuple[QArray, np.ndarray]:
    """An int4 weight (k, N), blocks of 32 along K, e8m0 scales 2**-3 .. 2**2, and its
    values in float64 (emulate.reference)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-8, 8, (k, N)).astype(ml_dtypes.int4)
    nb = -(-k // 32)
    scales = (2.0 ** rng.integers(-3, 3, (nb, N))).astype(ml_dtypes.float8_e8m0fnu)
    q = QArray.from_parts(emulate.pack(codes, axis=0), scales, block_shape=(32, 1))
    w = emulate.reference.dequantize(codes, scales, (32, 1), exact=True)
    return q, w


def _dot(x, q, dn=KN):
    with emulate.use_cpu_kernel(True):
        f = jax.jit(lambda x: emulate.dot_general(x, q, dn, preferred_element_type=jnp.float32))
        assert "emulate_cpu_gemv_" in f.lower(x).as_text()
        return np.asarray(f(x))


# K = 63 (codes packed along K with a last block of 31: the bit-stream reader in the column
# loop) is a second weight form, a numba compile of some 20 s: long; K = 64's form is the
# file's shared one.
@pytest.mark.parametrize("k", [K, pytest.param(63, marks=pytest.mark.long)])
def test_within_the_bound_for_every_row_count(k: int) -> None:
    q, w = _weight(k)
    rng = np.random.default_rng(1)
    for rows in (1, 3, route.MAX_ROWS):
        x = rng.normal(size=(rows, k)).astype(np.float32)
        got = _dot(jnp.asarray(x), q)
        bound = emulate.bounds.qarray_bound(x, w, KN, segments=-(-k // 32))
        assert (np.abs(got - x.astype(np.float64) @ w) <= bound).all()


def test_rows_are_independent_of_the_batch_and_of_jit() -> None:
    # every result element is its own sum, in one order: the same bits for any rows
    q, _ = _weight()
    x = jnp.asarray(np.random.default_rng(2).normal(size=(route.MAX_ROWS, K)), jnp.bfloat16)
    whole = _dot(x, q)
    for i in range(route.MAX_ROWS):
        assert np.array_equal(_dot(x[i : i + 1], q), whole[i : i + 1])
    with emulate.use_cpu_kernel(True):
        eager = np.asarray(emulate.dot_general(x, q, KN, preferred_element_type=jnp.float32))
        mapped = jax.vmap(lambda r: emulate.dot_general(r, q, (((0,), (0,)), ((), ()))))(x)
    assert np.array_equal(eager, whole)
    assert np.array_equal(np.asarray(mapped, np.float32), whole)


def test_integers_with_power_of_two_scales_are_exact() -> None:
    q, w = _weight()
    x = np.random.default_rng(3).integers(-100, 100, (2, K)).astype(np.float32)
    exact = x.astype(np.int64) @ (w * 8).astype(np.int64)  # w * 8: integers (scales >= 2**-3)
    assert np.array_equal(_dot(jnp.asarray(x), q), (exact / 8).astype(np.float32))


def test_leading_dimensions_and_the_weight_on_the_left() -> None:
    q, w = _weight()
    x = np.random.default_rng(4).normal(size=(2, 2, K)).astype(np.float32)
    got = _dot(jnp.asarray(x), q, (((2,), (0,)), ((), ())))
    assert got.shape == (2, 2, N)
    bound = emulate.bounds.qarray_bound(x.reshape(4, K), w, KN, segments=2)
    assert (np.abs(got.reshape(4, N) - x.reshape(4, K).astype(np.float64) @ w) <= bound).all()
    with emulate.use_cpu_kernel(True):  # q (K, N) on the left: the result (N, 2)
        left = emulate.dot_general(q, x[0], (((0,), (1,)), ((), ())))
    assert np.array_equal(np.asarray(left), got[0].T)


def test_nan_and_inf_propagate_as_in_the_exact_sum() -> None:
    q, w = _weight()
    x = np.random.default_rng(5).normal(size=(4, K)).astype(np.float32)
    x[0, 3], x[1, 10], x[2, 40] = np.nan, np.inf, -np.inf
    got = _dot(jnp.asarray(x), q)
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float64) @ w
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isposinf(got), np.isposinf(want))
    assert np.array_equal(np.isneginf(got), np.isneginf(want))


def test_gradients_are_the_dequantized_weights() -> None:
    q, w = _weight()
    x = jnp.asarray(np.random.default_rng(6).normal(size=(2, K)), jnp.float32)
    with emulate.use_cpu_kernel(True):
        g = jax.grad(lambda x: emulate.dot_general(x, q, KN).sum())(x)
    assert np.array_equal(np.asarray(g), np.broadcast_to(w.sum(axis=1), (2, K)).astype(np.float32))


@pytest.mark.long  # a weight form of its own: a numba compile (module docstring)
def test_rows_as_stored_with_a_last_shorter_block() -> None:
    # GGUF-style rows (N, K) contracted along K: uint4 codes with zero point 8 and float16
    # scales per 32, K = 80 (two blocks and one of 16)
    rng = np.random.default_rng(7)
    k = 80
    codes = rng.integers(0, 16, (N, k), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (N, 3)).astype(np.float16)
    q = QArray.from_parts(
        emulate.pack(codes, "uint4", axis=-1), scales, block_shape=(1, 32), zero_points=8
    )
    w = (codes.astype(np.float64) - 8) * np.repeat(scales.astype(np.float64), 32, axis=1)[:, :k]
    x = rng.normal(size=(3, k)).astype(np.float32)
    nk = (((1,), (1,)), ((), ()))
    got = _dot(jnp.asarray(x), q, nk)
    bound = emulate.bounds.qarray_bound(x, w.T, KN, segments=3)
    assert (np.abs(got - x.astype(np.float64) @ w.T) <= bound).all()


def test_one_signed_byte_a_code_in_columns() -> None:
    # int8 codes (K, N), one a byte: the column loop reads the row of codes straight;
    # float32 scales per 32 rows, the weight form of test_dequantized.py's columns (one
    # numba compile for both; float16 scales: the rows tests here)
    rng = np.random.default_rng(8)
    codes = rng.integers(-128, 128, (K, N)).astype(np.int8)
    scales = rng.uniform(0.01, 0.1, (2, N)).astype(np.float32)
    q = QArray.from_parts(codes, scales, block_shape=(32, 1))
    w = codes.astype(np.float64) * np.repeat(scales.astype(np.float64), 32, axis=0)
    x = rng.normal(size=(2, K)).astype(np.float32)
    got = _dot(jnp.asarray(x), q)
    bound = emulate.bounds.qarray_bound(x, w, KN, segments=2)
    assert (np.abs(got - x.astype(np.float64) @ w) <= bound).all()


#: Rows as stored (N, K) through the vector steps (emulate.cpu.lanes) and the bit-stream
#: loop: (code format, packed, block along K, K, zero point, scale dtype). The K values
#: leave tails after the last whole step; a block of 24 groups (48 4-bit codes) fits no
#: step. The default case is the file's shared rows form (_rows_weight).
ROW_FORMS = [
    ("uint3", True, 16, 144, 4, np.float32),  # 2 groups a block; 18 groups: a step and a tail
    pytest.param("int5", False, 32, 80, None, np.float16, marks=pytest.mark.long),  # a last block
    pytest.param("uint4", True, 48, 96, 8, np.float16, marks=pytest.mark.long),  # bit stream
    pytest.param("uint2", True, 16, 320, None, np.float16, marks=pytest.mark.long),
    pytest.param("int6", True, 16, 256, None, np.float16, marks=pytest.mark.long),
    pytest.param("uint5", True, 32, 288, 16, np.float16, marks=pytest.mark.long),
    pytest.param("int8", False, 32, 100, None, np.float16, marks=pytest.mark.long),
    pytest.param("uint4", True, 16, 272, 8, np.float16, marks=pytest.mark.long),  # 8 groups a block
    pytest.param("uint3", True, 16, 144, 4, np.float16, marks=pytest.mark.long),
    pytest.param("int3", False, 40, 120, None, np.float16, marks=pytest.mark.long),  # 40 a block
]


@pytest.mark.parametrize(("fmt", "packed", "bk", "k", "zp", "sdt"), ROW_FORMS)
def test_rows_of_every_code_width_within_the_bound(fmt, packed, bk, k, zp, sdt) -> None:
    rng = np.random.default_rng(9)
    bits = int(fmt.lstrip("uint"))
    codes = rng.integers(0, 1 << bits, (N, k), dtype=np.uint8)
    values = codes.astype(np.int64)
    if fmt.startswith("int"):
        values = np.where(values >= 1 << (bits - 1), values - (1 << bits), values)
    nb = -(-k // bk)
    scales = rng.uniform(0.01, 0.1, (N, nb)).astype(sdt)
    stored = emulate.pack(codes, fmt, axis=-1) if packed else codes
    q = QArray.from_parts(stored, scales, block_shape=(1, bk), fmt=fmt, zero_points=zp)
    step = np.repeat(scales.astype(np.float64), bk, axis=1)[:, :k]
    w = (values - (zp or 0)) * step
    x = rng.normal(size=(2, k)).astype(np.float32)
    got = _dot(jnp.asarray(x), q, (((1,), (1,)), ((), ())))
    bound = emulate.bounds.qarray_bound(x, w.T, KN, segments=nb)
    assert (np.abs(got - x.astype(np.float64) @ w.T) <= bound).all()


@pytest.mark.long  # a weight form of its own: a numba compile (module docstring)
def test_one_table_code_a_byte_in_columns() -> None:
    # uint8 codes of a 4-bit format without a numpy dtype (P3109 k4p2, values from gfloat):
    # 64 columns a vector step, the 8 after it one at a time, both through the table
    from gfloat import decode_float
    from gfloat.formats import format_info_p3109

    from emulate.float_format import p3109

    fmt = emulate.formats.register(p3109(2, bits=4))
    table = np.array([decode_float(format_info_p3109(4, 2), c).fval for c in range(16)])
    rng = np.random.default_rng(10)
    codes = rng.choice([0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14], size=(K, N)).astype(np.uint8)
    scales = rng.uniform(0.5, 2, (2, N)).astype(np.float32)
    q = QArray.from_parts(codes, scales, block_shape=(32, 1), fmt=fmt.name)
    w = table[codes] * np.repeat(scales.astype(np.float64), 32, axis=0)
    x = rng.normal(size=(2, K)).astype(np.float32)
    with emulate.use_cpu_kernel(True):
        f = jax.jit(lambda x: emulate.dot_general(x, q, KN, preferred_element_type=jnp.float32))
        taken = "emulate_cpu_gemv_" in f.lower(x).as_text()
        got = np.asarray(f(jnp.asarray(x)))
    assert taken == cpu.table_lookups()
    bound = emulate.bounds.qarray_bound(x, w, KN, segments=2)
    assert (np.abs(got - x.astype(np.float64) @ w) <= bound).all()


#: The rows tests' K: 18 groups of 8 3-bit codes, one vector step of 16 and a tail.
KR = 144


def _rows_weight(rng: np.random.Generator) -> QArray:
    """The shared rows form: (N, KR) rows of uint3 codes packed along K (a group of 8 in 3
    bytes), zero point 4, float32 scales per 16 (tests/cpu/test_dequantized.py's too)."""
    codes = rng.integers(0, 8, (N, KR), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (N, KR // 16)).astype(np.float32)
    return QArray.from_parts(
        emulate.pack(codes, "uint3", axis=-1), scales, block_shape=(1, 16), zero_points=4
    )


# long (EMULATE_LONG_TESTS=1): the threaded kernel is a numba compile of its own (some 20 s;
# the suite's kernels are compiled for one thread, tests/conftest.py)
@pytest.mark.long
def test_threads_give_the_one_thread_bits(monkeypatch) -> None:
    # the suite compiles kernels for one thread (tests/conftest.py); here numba's threads
    # take the rows in tasks of 16 (five tasks): the same bits. The shared rows form (one
    # numba compile for the one-thread kernel; the threaded kernel is a compile of its own).
    # The threaded call has a batch of its own (11 rows, rows independent of the batch:
    # the tests below): a program traced before for this weight keeps the one-thread
    # kernel's custom call whatever emulate.cpu.parallel says now.
    rng = np.random.default_rng(11)
    rows = _rows_weight(rng)
    x = jnp.asarray(rng.normal(size=(11, KR)), jnp.float32)
    nk = (((1,), (1,)), ((), ()))
    assert not emulate.cpu.parallel()
    one = _dot(x[:3], rows, nk)
    monkeypatch.setattr(emulate.cpu, "parallel", lambda: True)
    with emulate.use_cpu_kernel(True):
        f = jax.jit(lambda x: emulate.dot_general(x, rows, nk, preferred_element_type=jnp.float32))
        assert f"{weight_form(rows, 1).name}_p" in f.lower(x).as_text()  # the threaded kernel
        threaded = np.asarray(f(x))
    assert np.array_equal(one.view(np.uint32), threaded[:3].view(np.uint32))


def test_rows_as_stored_are_independent_of_the_batch() -> None:
    # rows (N, K): every row of x through the same steps, its 16 lanes summed in one order
    rng = np.random.default_rng(12)
    q = _rows_weight(rng)
    x = jnp.asarray(rng.normal(size=(route.MAX_ROWS, KR)), jnp.float32)
    nk = (((1,), (1,)), ((), ()))
    whole = _dot(x, q, nk)
    for i in (0, 5, route.MAX_ROWS - 1):
        assert np.array_equal(
            _dot(x[i : i + 1], q, nk).view(np.uint32), whole[i : i + 1].view(np.uint32)
        )
    for rows in (2, 7):
        assert np.array_equal(_dot(x[:rows], q, nk).view(np.uint32), whole[:rows].view(np.uint32))


@pytest.mark.long  # a weight form of its own: a numba compile (module docstring)
def test_nvfp4_takes_its_tensor_scale_as_dequantize_does() -> None:
    # e2m1 codes, e4m3 scales per 16, an f32 tensor scale: the product of the two scales
    # rounded once (reference.dequantize); a tensor scale that sends the product below
    # float32's normal range (the dequantized values flush) and one past it (Inf)
    rng = np.random.default_rng(15)
    wf = rng.normal(size=(K, N)).astype(np.float32)
    q = emulate.quantize(wf, emulate.mx.NVFP4, axis=0)
    x = rng.normal(size=(2, K)).astype(np.float32)
    codes = np.asarray(emulate.unpack(q.codes))
    for ts in (None, 2.0**-135, 2.0**125):
        if ts is not None:
            q = dataclasses.replace(q, tensor_scale=jnp.float32(ts))
        w = emulate.reference.dequantize(
            codes, np.asarray(q.scales), (16, 1), tensor_scale=float(np.asarray(q.tensor_scale))
        ).astype(np.float64)
        with emulate.use_cpu_kernel(True):
            f = jax.jit(
                lambda x, q: emulate.dot_general(x, q, KN, preferred_element_type=jnp.float32)
            )
            taken = "emulate_cpu_gemv_" in f.lower(x, q).as_text()
            got = np.asarray(f(jnp.asarray(x), q))
        assert taken == cpu.table_lookups(4)
        as_dequantized(got, x, w, K // 16)


@pytest.mark.long  # a weight form of its own: a numba compile (module docstring)
def test_groups_with_stored_zero_points_and_a_last_shorter_block() -> None:
    # 3-bit codes a group of 8 in 3 bytes, blocks of 16 (2 groups), K = 88 (5 blocks and
    # one of 8), uint8 zero points per block
    rng = np.random.default_rng(16)
    k, bk = 88, 16
    nb = -(-k // bk)
    codes = rng.integers(0, 8, (N, k), dtype=np.uint8)
    zps = rng.integers(0, 8, (N, nb), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (N, nb)).astype(np.float16)
    q = QArray.from_parts(
        emulate.pack(codes, "uint3", axis=-1), scales, block_shape=(1, bk), zero_points=zps
    )
    assert weight_form(q, 1).loop == Loop.GROUPS
    step = np.repeat(scales.astype(np.float64), bk, axis=1)[:, :k]
    w = (codes.astype(np.float64) - np.repeat(zps, bk, axis=1)[:, :k]) * step
    x = rng.normal(size=(3, k)).astype(np.float32)
    got = _dot(jnp.asarray(x), q, (((1,), (1,)), ((), ())))
    bound = emulate.bounds.qarray_bound(x, w.T, KN, segments=nb)
    assert (np.abs(got - x.astype(np.float64) @ w.T) <= bound).all()
