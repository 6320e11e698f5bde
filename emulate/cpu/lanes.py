"""numba: the CPU kernel's vector steps, written as LLVM vector IR (numba's loops do not
vectorize a dot product whose codes are a few bits each: measured 7-10 G elements/s a
core against 15-20 G/s here): :func:`group_lanes` (layout ROWS), :func:`column_lanes`
(layout COLUMNS), and the factors' decoders :func:`code_values` and :func:`half_values`.

:func:`group_lanes` takes :data:`LANES` consecutive groups of a row of integer codes (a
group is the smallest run of whole bytes that holds whole codes,
:func:`emulate.numerics.storage.group_shape`: 1 byte for 8- and 4-bit and 2-bit codes, 3
for 6- and 3-bit, 5 for 5-bit), lane ``t`` holding group ``g0 + t``, and adds
``s_t * sum_q x_(q, t) (v_(q, t) - z_t)`` into :data:`LANES` float32 accumulators: ``v``
the codes' integer values (exact in float32), ``x`` the activations in planes (plane
``q`` holds element ``q`` of every group), ``s`` and ``z`` the groups' scale and zero
point (one value for every lane, or a vector). Generic LLVM vectors: LLVM picks the
host's instructions (AVX-512, AVX2, NEON), and splits 16 lanes where registers are
narrower.

Numerics: ``v - z`` is exact (integers in int32, or a table value less an integer); each
product ``x (v - z)`` is rounded once or fused into an addition (exact where ``x`` is
bfloat16 and ``v - z`` an integer), the group's ``g`` products are added in float32, times
``s`` (one rounding), added into the lane: the segment route of docs/numerics.md, within
its bound. No ``nnan`` / ``ninf``: NaN and Inf propagate.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from emulate import cpu
from emulate.cpu.form import LANES, group_geometry
from emulate.cpu.vectors import (
    F32,
    I32,
    I64,
    VF,
    VI,
    add_at,
    add_into,
    as_index,
    block_floats,
    dot,
    load_at,
    load_floats,
    load_groups,
    pointer_at,
    row_at,
    row_count,
    splat_float,
    splat_int,
)

__all__ = [
    "LANES",
    "code_values",
    "column_dot",
    "column_lanes",
    "column_values",
    "group_lanes",
    "half_values",
]


def _literals(name: str, args: tuple, lookup_at: int | None = None) -> tuple | None:
    """The values of ``args`` (numba literals), None until numba gives literals; the
    value at ``lookup_at`` (a table lookup) asks for 4- or 8-bit codes (the first)."""
    if not all(isinstance(a, types.IntegerLiteral) for a in args):
        return None
    values = tuple(a.literal_value for a in args)
    if lookup_at is not None and values[lookup_at] and values[0] not in (4, 8):
        raise ValueError(f"{name}: table lookups take 4- or 8-bit codes, got {values[0]}")
    return values


def _words(builder: Any, raw: Any, nb: int) -> tuple[Any, Any]:
    """Each lane's group as integers: bytes 0 to 2 (``lo``) and bytes 3 and 4 (``hi``),
    little-endian; the bytes of lane ``t`` are ``raw[nb t : nb (t + 1)]``."""
    planes = []
    for p in range(nb):
        pick = ir.Constant(VI, [p + nb * t for t in range(LANES)])
        planes.append(builder.zext(builder.shuffle_vector(raw, raw, pick), VI))
    lo = planes[0]
    for p in range(1, min(nb, 3)):
        lo = builder.or_(lo, builder.shl(planes[p], splat_int(8 * p)))
    hi = None
    if nb > 3:
        hi = planes[3]
        for p in range(4, nb):
            hi = builder.or_(hi, builder.shl(planes[p], splat_int(8 * (p - 3))))
    return lo, hi


def _byte_code(builder: Any, byte: Any, bits: int, signed: bool) -> Any:
    """A code held alone in a byte, as :func:`emulate.cpu.parts.reader` reads it: the byte,
    less ``2**bits`` where signed and at least ``2**(bits - 1)``."""
    if not signed:
        return byte
    wrapped = builder.sub(byte, splat_int(1 << bits))
    return builder.select(
        builder.icmp_unsigned(">=", byte, splat_int(1 << (bits - 1))), wrapped, byte
    )


def _codes(builder: Any, raw: Any, bits: int, packed: bool, signed: bool) -> list[Any]:
    """The codes of each lane's group, one i32 vector per code of a group."""
    g, nb = group_geometry(bits, packed)
    lo, hi = _words(builder, raw, nb)
    if not packed:
        return [_byte_code(builder, lo, bits, signed)]
    return [_code(builder, lo, hi, bits, q, signed) for q in range(g)]


def _looked_up(builder: Any, table: list[Any], code: Any) -> Any:
    """``table[code]`` in each lane (only where :func:`emulate.cpu.table_lookups` holds;
    ``table``: the table as vectors of :data:`LANES`). A 16-entry table (4-bit codes): on
    AVX-512 one ``vpermps``; on AVX2, per 8 lanes, one ``vpermps`` into each half of the
    table and a choice on the code's bit 3. A 256-entry one (8-bit codes, AVX-512): eight
    32-entry ``vpermi2ps`` and a choice among them on the code's top three bits."""
    if len(table) == 1 and cpu.vector_isa() == "avx2":
        return _looked_up_avx2(builder, table[0], code)
    if len(table) == 1:
        fnty = ir.FunctionType(VF, [VF, VI])
        name = "llvm.x86.avx512.permvar.sf.512"
        return builder.call(
            cgutils.get_or_insert_function(builder.module, fnty, name), [table[0], code]
        )
    fnty = ir.FunctionType(VF, [VF, VI, VF])
    pair = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpermi2var.ps.512")
    low = builder.and_(code, splat_int(31))
    picks = [builder.call(pair, [table[2 * j], low, table[2 * j + 1]]) for j in range(8)]
    for bit in (5, 6, 7):  # halve the candidates on each of the code's top bits
        set_ = builder.icmp_unsigned("!=", builder.and_(code, splat_int(1 << bit)), splat_int(0))
        picks = [builder.select(set_, b, a) for a, b in zip(picks[::2], picks[1::2])]
    return picks[0]


def _halves(builder: Any, v: Any) -> tuple[Any, Any]:
    """The low and high 8 lanes of a vector of :data:`LANES`."""
    lo = ir.Constant(ir.VectorType(I32, 8), list(range(8)))
    hi = ir.Constant(ir.VectorType(I32, 8), list(range(8, 16)))
    return builder.shuffle_vector(v, v, lo), builder.shuffle_vector(v, v, hi)


def _looked_up_avx2(builder: Any, table: Any, code: Any) -> Any:
    """``table[code]`` (16 float32 entries, 4-bit codes) with AVX2's 8-lane ``vpermps``."""
    vf8, vi8 = ir.VectorType(F32, 8), ir.VectorType(I32, 8)
    permute = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vf8, [vf8, vi8]), "llvm.x86.avx2.permps"
    )
    low_table, high_table = _halves(builder, table)
    eight = ir.Constant(vi8, [8] * 8)
    picked = []
    for c in _halves(builder, code):
        upper = builder.icmp_unsigned("!=", builder.and_(c, eight), ir.Constant(vi8, [0] * 8))
        low = builder.call(permute, [low_table, c])  # vpermps reads the low 3 bits
        high = builder.call(permute, [high_table, c])
        picked.append(builder.select(upper, high, low))
    return builder.shuffle_vector(picked[0], picked[1], ir.Constant(VI, list(range(LANES))))


def _values(builder: Any, table: list[Any] | None, codes: list[Any], zv: Any) -> list[Any]:
    """Each code's value less its zero point, float32: ``table[c] - z`` where the codes
    index a table, else ``c - z`` in int32 (zero points are integers) converted once."""
    if table is not None:
        return [builder.fsub(_looked_up(builder, table, c), zv) for c in codes]
    zi = builder.fptosi(zv, VI)
    return [builder.sitofp(builder.sub(c, zi), VF) for c in codes]


def _table(context: Any, builder: Any, aty: Any, table: Any, lookup: int, bits: int) -> Any:
    """The float32 table of ``2**bits`` entries (4 or 8 bits) as vectors of :data:`LANES`,
    None where the codes are integers."""
    if not lookup:
        return None
    return [
        load_floats(context, builder, aty, table, ir.Constant(I64, LANES * i))
        for i in range((1 << bits) // LANES)
    ]


def _code(builder: Any, lo: Any, hi: Any, bits: int, q: int, signed: bool) -> Any:
    """Code ``q`` of each lane's group (stream bits ``[bits q, bits (q + 1))``) as i32."""
    o, mask = bits * q, splat_int((1 << bits) - 1)
    if o + bits <= 24:
        c = builder.lshr(lo, splat_int(o)) if o else lo
    elif o >= 24:
        c = builder.lshr(hi, splat_int(o - 24)) if o > 24 else hi
    else:  # across bytes 2 and 3
        c = builder.or_(builder.lshr(lo, splat_int(o)), builder.shl(hi, splat_int(24 - o)))
    c = builder.and_(c, mask)
    if signed:
        c = builder.ashr(builder.shl(c, splat_int(32 - bits)), splat_int(32 - bits))
    return c


@intrinsic
def group_lanes(
    typingctx: Any,
    lanes: Any,
    codes: Any,
    table: Any,
    g0: Any,
    x: Any,
    plane: Any,
    s: Any,
    z: Any,
    bits: Any,
    packed: Any,
    signed: Any,
    lookup: Any,
    per_block: Any,
) -> Any:
    """``lanes[m, t] += s_t * sum_q x[m, q * plane + g0 + t] * (v_(q, g0 + t) - z_t)`` for
    ``t < LANES`` and every row ``m`` of ``lanes``: the codes decoded once for all rows.
    ``lanes`` a float32 (rows, :data:`LANES`) array (keep it on the stack:
    :func:`emulate.cpu.parts.stack_floats`), ``codes`` a uint8 row (group ``i`` at bytes
    ``[nb i, nb (i + 1))``), ``table`` the float32 value of each code where ``lookup`` (16
    or 256 entries: 4- or 8-bit codes), ``g0`` the first group (uint64, a multiple of
    :data:`LANES`), ``x`` float32 (rows, K): each row in planes of ``plane`` (uint64)
    elements, ``s`` and ``z`` the blocks' float32 scales and zero points (arrays indexed by
    block: group ``i`` is in block ``i // per_block``; or one scalar for every block).
    Compile-time constants: ``bits`` (2 to 8), ``packed`` (1: a bit stream; 0: one code a
    byte), ``signed`` (0 or 1), ``lookup`` (1: values from ``table``, only where
    :func:`emulate.cpu.table_lookups` holds), ``per_block`` (groups a block: a multiple or
    a divisor of :data:`LANES`). Each row's arithmetic is the same whatever the number of
    rows (:func:`dot`, then ``* s``, then ``+``). No bounds checks: the caller keeps ``g0 +
    LANES`` within the row and ``x`` as many rows as ``lanes``."""
    checked = _literals("group_lanes", (bits, packed, signed, lookup, per_block), 3)
    if checked is None:
        return None
    width, is_packed, is_signed, is_lookup, per = checked
    if not (per % LANES == 0 or LANES % per == 0):
        raise ValueError(f"group_lanes: per_block={per} is not a multiple or divisor of {LANES}")
    nb = group_geometry(width, is_packed)[1]

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        lanes_v, codes_v, table_v, g0_v, x_v, plane_v, s_v, z_v = args[:8]
        start, stride = as_index(builder, g0_v), as_index(builder, plane_v)
        raw = load_groups(context, builder, sig.args[1], codes_v, start, nb)
        zv = block_floats(context, builder, sig.args[7], z_v, start, per)
        table_vec = _table(context, builder, sig.args[2], table_v, is_lookup, width)
        values = _values(builder, table_vec, _codes(builder, raw, width, is_packed, is_signed), zv)
        sv = block_floats(context, builder, sig.args[6], s_v, start, per)
        offsets = [
            builder.add(start, builder.mul(stride, ir.Constant(I64, q))) for q in range(len(values))
        ]
        with cgutils.for_range(builder, row_count(context, builder, sig.args[0], lanes_v)) as loop:
            m = loop.index
            xs = [
                load_at(builder, row_at(context, builder, sig.args[4], x_v, m, o)) for o in offsets
            ]
            at = row_at(context, builder, sig.args[0], lanes_v, m, ir.Constant(I64, 0))
            add_at(builder, at, builder.fmul(sv, dot(builder, xs, values)))
        return context.get_dummy_value()

    args = (lanes, codes, table, g0, x, plane, s, z, bits, packed, signed, lookup, per_block)
    return types.none(*args), codegen


def _interleave(builder: Any, planes: list[Any]) -> Any:
    """One vector of ``len(planes) * LANES`` lanes, lane ``g t + q`` = ``planes[q][t]``."""
    joined = list(planes)
    while len(joined) > 1:  # concatenate pairs: g is 1, 2, 4 or 8
        n = joined[0].type.count
        pick = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
        joined = [builder.shuffle_vector(a, b, pick) for a, b in zip(joined[::2], joined[1::2])]
    g = len(planes)
    whole = joined[0]
    order = [q * LANES + t for t in range(LANES) for q in range(g)]
    return builder.shuffle_vector(whole, whole, ir.Constant(ir.VectorType(I32, g * LANES), order))


@intrinsic
def code_values(
    typingctx: Any,
    out: Any,
    at: Any,
    codes: Any,
    table: Any,
    g0: Any,
    bits: Any,
    packed: Any,
    signed: Any,
    lookup: Any,
) -> Any:
    """``out[at + g t + q] = v_(q, g0 + t)`` for ``t <`` :data:`LANES` and each of a
    group's ``g`` codes: the codes' values as float32 (integers exactly; ``table[c]`` where
    ``lookup``), in the codes' order. ``codes``, ``table``, ``g0`` and the compile-time
    constants as for :func:`group_lanes`; ``out`` float32, ``at`` (uint64) where the
    first value goes. No bounds checks."""
    checked = _literals("code_values", (bits, packed, signed, lookup), 3)
    if checked is None:
        return None
    width, is_packed, is_signed, is_lookup = checked
    g, nb = group_geometry(width, is_packed)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        out_v, at_v, codes_v, table_v, g0_v = args[:5]
        start = as_index(builder, g0_v)
        raw = load_groups(context, builder, sig.args[2], codes_v, start, nb)
        codes = _codes(builder, raw, width, is_packed, is_signed)
        table_vec = _table(context, builder, sig.args[3], table_v, is_lookup, width)
        if table_vec is None:
            planes = [builder.sitofp(c, VF) for c in codes]
        else:
            planes = [_looked_up(builder, table_vec, c) for c in codes]
        values = _interleave(builder, planes)
        into = pointer_at(context, builder, sig.args[0], out_v, as_index(builder, at_v))
        builder.store(values, builder.bitcast(into, values.type.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(out, at, codes, table, g0, bits, packed, signed, lookup), codegen


def _half_bits_to_float(builder: Any, h: Any) -> Any:
    """float32 values of float16 bits ``h`` (an i32 vector), as
    :func:`emulate.cpu.parts.float16_value` gives them: subnormals as ``m * 2**-24``,
    NaN made quiet with its payload kept."""
    sign = builder.shl(builder.and_(h, splat_int(0x8000)), splat_int(16))
    e = builder.and_(builder.lshr(h, splat_int(10)), splat_int(31))
    m = builder.and_(h, splat_int(1023))
    low = builder.shl(m, splat_int(13))
    normal = builder.or_(builder.shl(builder.add(e, splat_int(112)), splat_int(23)), low)
    quiet = builder.select(
        builder.icmp_unsigned("!=", m, splat_int(0)), splat_int(0x00400000), splat_int(0)
    )
    special = builder.or_(builder.or_(splat_int(0x7F800000), quiet), low)
    tiny = builder.fmul(builder.sitofp(m, VF), ir.Constant(VF, [2.0**-24] * LANES))
    tiny = builder.bitcast(tiny, VI)
    bits = builder.select(builder.icmp_unsigned("==", e, splat_int(31)), special, normal)
    bits = builder.select(builder.icmp_unsigned("==", e, splat_int(0)), tiny, bits)
    return builder.bitcast(builder.or_(bits, sign), VF)


@intrinsic
def half_values(typingctx: Any, out: Any, data: Any, j0: Any, brain: Any) -> Any:
    """``out[j0 + t]`` = the float32 value of the float16 (``brain`` 0) or bfloat16
    (``brain`` 1, a compile-time constant) at bytes ``[2 (j0 + t), 2 (j0 + t) + 2)`` of
    ``data`` (uint8, little-endian), for ``t <`` :data:`LANES`. Exact. No bounds checks."""
    checked = _literals("half_values", (brain,))
    if checked is None:
        return None
    is_brain = bool(checked[0])

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        out_v, data_v, j0_v = args[:3]
        start = as_index(builder, j0_v)
        at = pointer_at(
            context, builder, sig.args[1], data_v, builder.mul(start, ir.Constant(I64, 2))
        )
        halves = ir.VectorType(ir.IntType(16), LANES)
        h = builder.zext(builder.load(builder.bitcast(at, halves.as_pointer()), align=1), VI)
        if is_brain:
            values = builder.bitcast(builder.shl(h, splat_int(16)), VF)
        else:
            values = _half_bits_to_float(builder, h)
        into = pointer_at(context, builder, sig.args[0], out_v, start)
        builder.store(values, builder.bitcast(into, VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(out, data, j0, brain), codegen


def _column_values(context: Any, builder: Any, typed: tuple, consts: tuple) -> list[Any]:
    """The values less the zero points of :data:`LANES` columns of one row of codes:
    ``typed`` holds ``row``, ``table``, ``n0``, ``z`` as (numba type, LLVM value) pairs
    (as :func:`column_lanes` takes them)."""
    width, is_packed, is_signed, is_lookup = consts
    (row_t, row_v), (table_t, table_v), (_, n0_v), (z_t, z_v) = typed
    raw = load_groups(context, builder, row_t, row_v, as_index(builder, n0_v), 1)
    if isinstance(z_t, types.Array):
        zv = load_floats(context, builder, z_t, z_v, ir.Constant(I64, 0))
    else:
        zv = splat_float(builder, z_v)
    table_vec = _table(context, builder, table_t, table_v, is_lookup, width)
    return _values(builder, table_vec, _codes(builder, raw, width, is_packed, is_signed), zv)


def _column_checks(name: str, bits: Any, packed: Any, signed: Any, lookup: Any) -> tuple | None:
    checked = _literals(name, (bits, packed, signed, lookup), 3)
    if checked is not None and group_geometry(checked[0], checked[1])[1] != 1:
        raise ValueError(f"{name}: {checked[0]}-bit codes packed along K span bytes")
    return checked


def _splat_x(context: Any, builder: Any, aty: Any, x: Any, k0: Any, count: int) -> list[Any]:
    """``x[k0 + q]`` in every lane, for ``q < count``."""
    first = as_index(builder, k0)
    return [
        splat_float(
            builder,
            builder.load(
                pointer_at(context, builder, aty, x, builder.add(first, ir.Constant(I64, q)))
            ),
        )
        for q in range(count)
    ]


@intrinsic
def column_lanes(
    typingctx: Any,
    lanes: Any,
    row: Any,
    table: Any,
    n0: Any,
    x: Any,
    k0: Any,
    z: Any,
    bits: Any,
    packed: Any,
    signed: Any,
    lookup: Any,
) -> Any:
    """Layout COLUMNS: ``lanes[t] += sum_q x[k0 + q] (v_q(row[n0 + t]) - z_t)`` for ``t <``
    :data:`LANES`: ``row`` one stored row of uint8 codes, each byte ``g`` codes packed
    along K (``bits`` 1, 2, 4 or 8; ``packed`` 1) or one code (``packed`` 0); ``x`` float32
    activations; ``z`` float32 zero points of the :data:`LANES` columns (an array from
    index 0) or one scalar; ``table`` and ``lookup`` as for :func:`group_lanes`. The same
    arithmetic as :func:`column_values` then :func:`column_dot`. No bounds checks."""
    checked = _column_checks("column_lanes", bits, packed, signed, lookup)
    if checked is None:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        typed = tuple(zip(sig.args, args))
        values = _column_values(context, builder, typed[1:4] + typed[6:7], checked)
        xs = _splat_x(context, builder, sig.args[4], args[4], args[5], len(values))
        add_into(context, builder, sig.args[0], args[0], dot(builder, xs, values))
        return context.get_dummy_value()

    return types.none(lanes, row, table, n0, x, k0, z, bits, packed, signed, lookup), codegen


@intrinsic
def column_values(
    typingctx: Any,
    out: Any,
    row: Any,
    table: Any,
    n0: Any,
    z: Any,
    bits: Any,
    packed: Any,
    signed: Any,
    lookup: Any,
) -> Any:
    """Layout COLUMNS, many rows of ``x``: ``out[q * LANES + t] = v_q(row[n0 + t]) - z_t``,
    the values of :data:`LANES` columns of one row of codes decoded once (arguments as for
    :func:`column_lanes`; ``out`` float32, ``g`` vectors of :data:`LANES`: keep it on the
    stack). No bounds checks."""
    checked = _column_checks("column_values", bits, packed, signed, lookup)
    if checked is None:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        values = _column_values(context, builder, tuple(zip(sig.args, args))[1:5], checked)
        for q, v in enumerate(values):
            at = pointer_at(context, builder, sig.args[0], args[0], ir.Constant(I64, q * LANES))
            builder.store(v, builder.bitcast(at, VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(out, row, table, n0, z, bits, packed, signed, lookup), codegen


@intrinsic
def column_dot(typingctx: Any, lanes: Any, values: Any, x: Any, k0: Any, count: Any) -> Any:
    """``lanes[t] += sum_q x[k0 + q] * values[q * LANES + t]`` for ``t <`` :data:`LANES` and
    ``q < count`` (a compile-time constant): :func:`column_lanes`' arithmetic on values
    :func:`column_values` decoded. No bounds checks."""
    checked = _literals("column_dot", (count,))
    if checked is None:
        return None
    g = checked[0]

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        lanes_v, values_v, x_v, k0_v = args[:4]
        values = [
            load_floats(context, builder, sig.args[1], values_v, ir.Constant(I64, q * LANES))
            for q in range(g)
        ]
        xs = _splat_x(context, builder, sig.args[2], x_v, k0_v, g)
        add_into(context, builder, sig.args[0], lanes_v, dot(builder, xs, values))
        return context.get_dummy_value()

    return types.none(lanes, values, x, k0, count), codegen
