"""emulate.cpu.form: which weights the CPU kernel reads, and how (plain JAX: no compile)."""

from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp
import ml_dtypes
import numpy as np

import emulate
import emulate.cpu
from emulate.cpu.form import CONSTANT, Form, Kind, LevelSlots, Loop, Orientation, Slot, weight_form
from emulate.quantized.array import QArray


def _q4_0(n: int = 8, k: int = 64, axis: int = -1) -> QArray:
    """GGUF Q4_0's parts: (N, K) uint4 codes, zero point 8, float16 scales per 32 of K."""
    rng = np.random.default_rng(0)
    codes = emulate.pack(rng.integers(0, 16, (n, k), dtype=np.uint8), "uint4", axis=axis)
    scales = np.full((n, k // 32), 0.5, np.float16)
    return QArray.from_parts(codes, scales, block_shape=(1, 32), zero_points=8)


def test_ggml_rows_are_read_as_stored() -> None:
    form = weight_form(_q4_0(), 1)
    codes, scales = Slot(Kind.UNSIGNED, 4, 1, 1), Slot(Kind.FLOAT16, 16, -1, 2)
    assert form == Form(Orientation.ROWS, Loop.NIBBLES, codes, (1, 32), CONSTANT, scales, None)
    assert repr(form) == (
        "Form(orientation=Orientation.ROWS, loop=Loop.NIBBLES, codes=Slot(kind=Kind.UNSIGNED,"
        " bits=4, axis=1, width=1), block=(1, 32), zero_point=ConstantFactor(),"
        " scale=Slot(kind=Kind.FLOAT16, bits=16, axis=-1, width=2), offset=None,"
        " tensor=False, exponent=0)"
    )
    assert re.fullmatch("emulate_cpu_gemv_[0-9a-f]{16}", form.name)
    assert form.name == weight_form(_q4_0(16, 128), 1).name  # shapes are not in the form


def test_codes_packed_across_k_are_not_a_form() -> None:
    assert weight_form(_q4_0(axis=0), 1) is None  # packed along N
    assert weight_form(_q4_0(), 0) is None  # contracted along N: packed across K
    assert weight_form(_q4_0(), 1) is not None


def test_quantize_gives_the_column_layout() -> None:
    w = np.random.default_rng(1).normal(size=(64, 16)).astype(np.float32)
    q = emulate.quantize(w, "int4", block_shape=32, axis=0)
    form = weight_form(q, 0)
    want = (Orientation.COLUMNS, Loop.NIBBLES, Slot(Kind.SIGNED, 4, 0, 1))
    assert (form.orientation, form.loop, form.codes) == want
    assert weight_form(emulate.quantize(w, "int8", block_shape=32, axis=0), 0).loop == Loop.BYTES


def test_tables_only_where_the_host_holds_them_in_registers(monkeypatch) -> None:
    w = np.random.default_rng(1).normal(size=(64, 16)).astype(np.float32)
    mx = emulate.quantize(w, emulate.mx.MXFP4, axis=0)
    fp8 = emulate.quantize(w, "float8_e4m3fn", block_shape=32, axis=0)
    monkeypatch.setattr(emulate.cpu, "table_lookups", lambda bits=4: True)
    assert weight_form(mx, 0).codes == Slot(Kind.TABLE, 4, 0, 1)
    assert weight_form(fp8, 0).codes == Slot(Kind.TABLE, 8, -1, 1)
    # an odd K: the bit-stream loop, a table lookup an element: left to XLA's route
    assert weight_form(emulate.quantize(w[:63], emulate.mx.MXFP4, axis=0, ragged=True), 0) is None
    monkeypatch.setattr(emulate.cpu, "table_lookups", lambda bits=4: False)
    assert weight_form(mx, 0) is None
    assert weight_form(fp8, 0) is None
    # an odd K leaves no whole nibble pairs: the bit-stream loop
    odd = emulate.quantize(w[:63], "int4", block_shape=32, axis=0, ragged=True)
    assert weight_form(odd, 0).loop == Loop.BITS


def test_two_level_scales_are_a_level() -> None:
    rng = np.random.default_rng(2)
    sub = QArray.from_parts(
        emulate.pack(rng.integers(0, 64, (4, 8), dtype=np.uint8), "uint6", axis=-1),
        np.ones((4, 1), np.float16),
        block_shape=(1, 8),
    )
    codes = emulate.pack(rng.integers(0, 16, (4, 256), dtype=np.uint8), "uint4", axis=-1)
    q = QArray.from_parts(codes, sub, block_shape=(1, 32), offsets=sub)
    form = weight_form(q, 1)
    codes6, scales16 = Slot(Kind.UNSIGNED, 6, 1, 1), Slot(Kind.FLOAT16, 16, -1, 2)
    level = LevelSlots(codes6, scales16, (1, 8), False, False)
    assert (form.scale, form.offset, form.zero_point) == (level, level, None)


def test_what_the_kernel_leaves_to_xla() -> None:
    q = _q4_0()
    # codes of a sub-byte numpy dtype: XLA:CPU holds them two a byte
    unpacked = QArray.from_parts(
        np.ones((8, 64), ml_dtypes.uint4), np.ones((8, 2), np.float16), block_shape=(1, 32)
    )
    assert weight_form(unpacked, 1) is None
    # a tensor scale and an element exponent over stored scales: their product is taken
    # as dequantize takes it; over two-level scales (flushed first there): not built
    assert weight_form(dataclasses.replace(q, tensor_scale=jnp.float32(2.0)), 1).tensor
    assert weight_form(dataclasses.replace(q, element_exponent=-6), 1).exponent == -6
    assert weight_form(dataclasses.replace(q, perm=jnp.arange(64), perm_axis=-1), 1) is None
    stacked = emulate.quantize(np.ones((2, 64, 8), np.float32), "int4", block_shape=32, axis=1)
    assert weight_form(stacked, 1) is None
    wide = emulate.quantize(np.ones((64, 8), np.float32), "p3109_k12p4se", block_shape=32, axis=0)
    assert weight_form(wide, 0) is None  # uint16 codes
    f32_scales = QArray.from_parts(
        np.ones((64, 8), np.int8), np.ones((2, 8), np.float32), block_shape=(32, 1)
    )
    assert weight_form(f32_scales, 0).scale == Slot(Kind.FLOAT32, 32, -1, 4)
    e4m3_scales = QArray.from_parts(
        np.ones((64, 8), np.int8), np.ones((2, 8), ml_dtypes.float8_e4m3fn), block_shape=(32, 1)
    )
    assert weight_form(e4m3_scales, 0).scale == Slot(Kind.TABLE, 8, -1, 1)
    # uint8 codes of a scale format without a numpy dtype: its table, not the integer
    p3109 = QArray.from_parts(
        np.ones((64, 8), np.int8),
        np.full((2, 8), 120, np.uint8),
        block_shape=(32, 1),
        scale_fmt="p3109_k8p4ue",
    )
    assert weight_form(p3109, 0).scale == Slot(Kind.TABLE, 8, -1, 1)


def test_table_lookups_follow_what_numba_compiles_with(monkeypatch) -> None:
    import numba
    from numba.core import codegen

    def features(text):
        def get():
            if text is None:
                raise RuntimeError("no features")
            return text

        return get

    cases = [
        ("+avx2,+avx512f,+fma", None, "avx512", (True, True)),
        ("+avx2,-avx512f,+fma", None, "avx2", (True, False)),  # 4-bit tables only
        ("-avx2,-avx512f", None, None, (False, False)),  # NUMBA_ENABLE_AVX=0 turns both off
        (None, None, None, (False, False)),  # LLVM cannot tell
        ("+avx512f", "generic", None, (False, False)),  # NUMBA_CPU_NAME: not this host's code
    ]
    for text, name, isa, lookups in cases:
        monkeypatch.setattr(codegen, "get_host_cpu_features", features(text))
        monkeypatch.setattr(numba.config, "CPU_NAME", name, raising=False)
        emulate.cpu.vector_isa.cache_clear()
        assert emulate.cpu.vector_isa() == isa
        assert (emulate.cpu.table_lookups(4), emulate.cpu.table_lookups(8)) == lookups
    monkeypatch.undo()
    emulate.cpu.vector_isa.cache_clear()
