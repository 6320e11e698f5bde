"""emulate.cpu.lanes: the vector steps against brute force over the documented layout
(codes a bit stream, least significant bit first, or one a byte as
emulate.cpu.parts.reader reads them) and exact integer sums."""

from __future__ import annotations

import functools

import ml_dtypes
import numba
import numpy as np
import pytest

from emulate import cpu
from emulate.cpu.lanes import (
    LANES,
    code_values,
    column_dot,
    column_lanes,
    column_values,
    group_lanes,
    half_values,
)
from emulate.numerics.storage import group_shape

WIDTHS = (2, 3, 4, 5, 6, 8)
_NO_TABLE = np.zeros(16, np.float32)


def _code(row: np.ndarray, i: int, bits: int, packed: bool, signed: bool) -> int:
    """Code ``i`` of a byte row, brute force: bits ``[bits i, bits (i + 1))`` of the
    little-endian stream, two's complement where signed; or byte ``i`` as the reader
    reads it (less ``2**bits`` where signed and at least ``2**(bits - 1)``)."""
    if packed:
        c = sum(
            ((int(row[(bits * i + b) // 8]) >> ((bits * i + b) % 8)) & 1) << b for b in range(bits)
        )
    else:
        c = int(row[i])
    return c - (1 << bits) if signed and c >= 1 << (bits - 1) else c


@functools.cache
def _values(bits: int, packed: int, signed: int):
    g = group_shape(bits)[0] if packed else 1

    @numba.njit
    def run(out, codes, steps):
        for c in range(steps):
            at = np.uint64(c * LANES * g)
            code_values(out, at, codes, _NO_TABLE, np.uint64(c * LANES), bits, packed, signed, 0)

    return run


@functools.cache
def _lanes(bits: int, packed: int, signed: int, per_block: int, lookup: int = 0):
    @numba.njit
    def run(codes, steps, x, plane, s, z, table=_NO_TABLE):
        acc = np.zeros((x.shape[0], LANES), np.float32)  # x: (rows, g * plane)
        for c in range(steps):
            at = np.uint64(c * LANES)
            p = np.uint64(plane)
            group_lanes(acc, codes, table, at, x, p, s, z, bits, packed, signed, lookup, per_block)
        return acc

    return run


def _values_cases() -> list:
    """Every width, layout and sign; by default each width and layout with one sign, in
    turn (each case compiles a kernel of its own), the other sign under
    EMULATE_LONG_TESTS=1."""
    return [
        pytest.param(
            bits, packed, signed, marks=() if (w + packed) % 2 == signed else pytest.mark.long
        )
        for w, bits in enumerate(WIDTHS)
        for packed in (1, 0)
        for signed in (1, 0)
    ]


@pytest.mark.parametrize(("bits", "packed", "signed"), _values_cases())
def test_code_values_are_the_codes_in_order(bits: int, packed: int, signed: int) -> None:
    g, nb = group_shape(bits) if packed else (1, 1)
    steps = 3
    codes = np.random.default_rng(bits).integers(0, 256, steps * LANES * nb, dtype=np.uint8)
    out = np.full(steps * LANES * g + 1, -0.5, np.float32)
    _values(bits, packed, signed)(out, codes, steps)
    want = [_code(codes, i, bits, packed, signed) for i in range(steps * LANES * g)]
    assert out[:-1].tolist() == want
    assert out[-1] == -0.5  # nothing written past the steps


PER_BLOCK = (1, 2, 4, 8, 16, 32)


def _sums_cases() -> list:
    """Every width, sign and block size (groups a block); by default one case per width:
    the signs in turn and each block size once (each case compiles two kernels, some 3 s
    of numba), the others under EMULATE_LONG_TESTS=1."""
    cases = []
    for i, bits in enumerate(WIDTHS):
        for signed in (1, 0):
            for j, per_block in enumerate(PER_BLOCK):
                default = j == i % len(PER_BLOCK) and signed == (i + 1) % 2
                long = () if default else pytest.mark.long
                cases.append(pytest.param(bits, signed, per_block, marks=long))
    return cases


@pytest.mark.parametrize(("bits", "signed", "per_block"), _sums_cases())
def test_group_lanes_are_exact_integer_sums(bits: int, signed: int, per_block: int) -> None:
    # integer x and zero points, power-of-two scales: every float32 step is exact, so each
    # lane equals the float64 sum over its groups (block factors as arrays, or as one
    # scalar where the blocks hold 16 groups), for each of three rows of x at once
    rng = np.random.default_rng(10 + bits)
    for packed in (1, 0):
        g, nb = group_shape(bits) if packed else (1, 1)
        steps = 4
        groups = steps * LANES
        codes = rng.integers(0, 256, groups * nb, dtype=np.uint8)
        x = rng.integers(-64, 64, (3, g * groups)).astype(np.float32)  # plane q: [q groups + t]
        v = np.array([_code(codes, i, bits, packed, signed) for i in range(g * groups)])
        v = v.reshape(groups, g)  # group t, code q
        xs = x.reshape(3, g, groups).swapaxes(1, 2).astype(np.float64)  # row, group, code
        nblocks = groups // per_block
        s = (2.0 ** rng.integers(-4, 4, nblocks)).astype(np.float32)
        z = rng.integers(-8, 8, nblocks).astype(np.float32)
        run = _lanes(bits, packed, signed, per_block)
        b = np.arange(groups) // per_block
        terms = s[b] * ((v - z[b][:, None]) * xs).sum(axis=2)
        want = terms.reshape(3, steps, LANES).sum(1)
        assert run(codes, steps, x, groups, s, z).tolist() == want.tolist()
        if per_block == 16:
            got = run(codes, steps, x[1:], groups, np.float32(0.25), np.float32(3))
            want = 0.25 * ((v - 3) * xs[1:]).sum(axis=2)
            assert got.tolist() == want.reshape(2, steps, LANES).sum(axis=1).tolist()


@functools.cache
def _halves(brain: int):
    @numba.njit
    def run(out, data):
        for c in range(out.shape[0] // LANES):
            half_values(out, data, np.uint64(c * LANES), brain)

    return run


@pytest.mark.parametrize("brain", [0, 1])
def test_every_half_is_its_float32(brain: int) -> None:
    # every float16 (bfloat16) code against numpy's (ml_dtypes') float32; a float16 NaN
    # made quiet with its payload kept, a bfloat16 NaN's bits kept
    codes = np.arange(1 << 16, dtype=np.uint16)
    out = np.zeros(1 << 16, np.float32)
    _halves(brain)(out, codes.view(np.uint8))
    want = codes.view(ml_dtypes.bfloat16 if brain else np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))
    c = codes[nan].astype(np.uint32)
    if brain:
        nan_bits = c << 16
    else:
        nan_bits = ((c & 0x8000) << 16) | 0x7FC00000 | ((c & 0x3FF) << 13)
    assert np.array_equal(out[nan].view(np.uint32), nan_bits)


@functools.cache
def _columns_once(bits: int, packed: int, signed: int):
    g = 8 // bits if packed else 1

    @numba.njit
    def run(rows, x, z):
        acc = np.zeros((x.shape[0], LANES), np.float32)
        values = np.empty(g * LANES, np.float32)
        for r in range(rows.shape[0]):
            column_values(values, rows[r], _NO_TABLE, np.uint64(0), z, bits, packed, signed, 0)
            for m in range(x.shape[0]):
                column_dot(acc[m], values, x[m], np.uint64(r * g), g)
        return acc

    return run


@pytest.mark.parametrize(("bits", "packed", "signed"), [(4, 1, 1), (8, 0, 0), (2, 1, 0)])
def test_columns_decoded_once_are_the_columns_decoded_per_row(bits, packed, signed) -> None:
    # float x and zero points: the same bits, row by row, as the one-row step
    rng = np.random.default_rng(30 + bits)
    g = 8 // bits if packed else 1
    rows = rng.integers(0, 256, (24, LANES), dtype=np.uint8)
    x = rng.normal(size=(3, 24 * g)).astype(np.float32)
    z = rng.normal(size=LANES).astype(np.float32)
    once = _columns_once(bits, packed, signed)(rows, x, z)
    for m in range(3):
        alone = _columns(bits, packed, signed, 0)(rows, _NO_TABLE, x[m], z)
        assert np.array_equal(once[m].view(np.uint32), alone.view(np.uint32))


@functools.cache
def _columns(bits: int, packed: int, signed: int, lookup: int):
    @numba.njit
    def run(rows, table, x, z):
        acc = np.zeros(LANES, np.float32)
        g = 8 // bits if packed else 1
        for r in range(rows.shape[0]):
            column_lanes(
                acc,
                rows[r],
                table,
                np.uint64(0),
                x,
                np.uint64(r * g),
                z,
                bits,
                packed,
                signed,
                lookup,
            )
        return acc

    return run


@pytest.mark.parametrize(
    ("bits", "packed"),
    [
        (4, 1),
        (4, 0),
        pytest.param(
            8,
            0,
            marks=pytest.mark.skipif(
                not cpu.table_lookups(8), reason="no AVX-512: 8-bit tables take XLA's route"
            ),
        ),
    ],
)
def test_tables_are_looked_up_exactly(bits: int, packed: int) -> None:
    # table values and x of few significant bits, block zero points: every float32 step
    # is exact; codes of every value (8-bit: all 256 entries, a top bit of each kind)
    rng = np.random.default_rng(20 + bits + packed)
    table = (rng.integers(-32, 32, 1 << bits) / 8).astype(np.float32)
    g = 8 // bits if packed else 1
    steps = 32 if bits == 8 else 2
    groups = steps * LANES
    codes = rng.permutation(np.arange(groups) % 256).astype(np.uint8)
    if bits == 4:
        codes = rng.integers(0, 256 if packed else 16, groups, dtype=np.uint8)
    x = rng.integers(-64, 64, g * groups).astype(np.float32)
    v = table[[_code(codes, i, bits, packed, 0) for i in range(g * groups)]].reshape(groups, g)
    s = (2.0 ** rng.integers(-4, 4, groups)).astype(np.float32)
    z = rng.integers(-2, 2, groups).astype(np.float32)
    got = _lanes(bits, packed, 0, 1, lookup=1)(codes, steps, x[None], groups, s, z, table)
    terms = s * ((v - z[:, None]) * x.reshape(g, groups).T).sum(axis=1)
    assert got[0].tolist() == terms.reshape(steps, LANES).sum(axis=0).tolist()
    # columns: rows of 16 bytes, each byte g codes along K
    rows = codes.reshape(-1, LANES)
    zc = rng.integers(-2, 2, LANES).astype(np.float32)
    got = _columns(bits, packed, 0, 1)(rows, table, x, zc)
    vals = np.array([[_code(r, i, bits, packed, 0) for i in range(g * LANES)] for r in rows])
    vals = table[vals].reshape(len(rows), LANES, g)  # row, column, code along K
    xk = x[: len(rows) * g].reshape(len(rows), g)
    want = ((vals - zc[None, :, None]) * xk[:, None, :]).sum(axis=(0, 2))
    assert got.tolist() == want.tolist()
