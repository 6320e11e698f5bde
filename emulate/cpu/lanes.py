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

from emulate.cpu.form import LANES, group_geometry

__all__ = ["LANES", "code_values", "column_lanes", "group_lanes", "half_values"]

_FAST = ("reassoc", "contract", "nsz", "arcp")
_F32, _I32, _I64, _I8 = ir.FloatType(), ir.IntType(32), ir.IntType(64), ir.IntType(8)
_VF, _VI = ir.VectorType(_F32, LANES), ir.VectorType(_I32, LANES)


def _splat_int(v: int) -> ir.Constant:
    return ir.Constant(_VI, [v] * LANES)


def _index(builder: Any, v: Any) -> Any:
    """An integer argument as an i64 index."""
    return builder.zext(v, _I64) if v.type.width < 64 else v


def _load_groups(context: Any, builder: Any, aty: Any, codes: Any, start: Any, nb: int) -> Any:
    """The bytes of :data:`LANES` groups of ``nb`` bytes from group ``start`` on."""
    at = _at(context, builder, aty, codes, builder.mul(start, ir.Constant(_I64, nb)))
    return builder.load(builder.bitcast(at, ir.VectorType(_I8, LANES * nb).as_pointer()), align=1)


def _dot(builder: Any, xs: list[Any], values: list[Any]) -> Any:
    """``sum_q xs[q] * values[q]``, lane by lane, float32."""
    total = None
    for xq, v in zip(xs, values):
        prod = builder.fmul(xq, v, flags=_FAST)
        total = prod if total is None else builder.fadd(total, prod, flags=_FAST)
    return total


def _add_into(context: Any, builder: Any, aty: Any, lanes: Any, v: Any) -> None:
    """``lanes += v``: the :data:`LANES` float32s of the array ``lanes``."""
    into = builder.bitcast(context.make_array(aty)(context, builder, lanes).data, _VF.as_pointer())
    builder.store(builder.fadd(builder.load(into, align=4), v, flags=_FAST), into, align=4)


def _literals(name: str, args: tuple, lookup_at: int | None = None) -> tuple | None:
    """The values of ``args`` (numba literals), None until numba gives literals; the
    value at ``lookup_at`` (a table lookup) asks for 4- or 8-bit codes (the first)."""
    if not all(isinstance(a, types.IntegerLiteral) for a in args):
        return None
    values = tuple(a.literal_value for a in args)
    if lookup_at is not None and values[lookup_at] and values[0] not in (4, 8):
        raise ValueError(f"{name}: table lookups take 4- or 8-bit codes, got {values[0]}")
    return values


def _at(context: Any, builder: Any, aty: Any, array: Any, index: Any) -> Any:
    """A pointer to element ``index`` (i64) of the 1-D ``array``."""
    data = context.make_array(aty)(context, builder, array).data
    return builder.gep(data, [index])


def _load_floats(context: Any, builder: Any, aty: Any, array: Any, index: Any) -> Any:
    p = _at(context, builder, aty, array, index)
    return builder.load(builder.bitcast(p, _VF.as_pointer()), align=4)


def _block_floats(context: Any, builder: Any, aty: Any, v: Any, start: Any, per: int) -> Any:
    """Each lane's block value: ``v`` itself (a scalar), or ``v[(start + t) // per]`` of
    the array ``v`` (``per`` groups a block: a multiple of :data:`LANES` or a divisor)."""
    if not isinstance(aty, types.Array):
        return _splat_float(builder, v)
    first = builder.udiv(start, ir.Constant(_I64, per))
    if per % LANES == 0:
        return _splat_float(builder, builder.load(_at(context, builder, aty, v, first)))
    blocks = ir.VectorType(_F32, LANES // per)
    p = _at(context, builder, aty, v, first)
    few = builder.load(builder.bitcast(p, blocks.as_pointer()), align=4)
    return builder.shuffle_vector(few, few, ir.Constant(_VI, [t // per for t in range(LANES)]))


def _splat_float(builder: Any, v: Any) -> Any:
    one = builder.insert_element(ir.Constant(_VF, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, one, _splat_int(0))


def _words(builder: Any, raw: Any, nb: int) -> tuple[Any, Any]:
    """Each lane's group as integers: bytes 0 to 2 (``lo``) and bytes 3 and 4 (``hi``),
    little-endian; the bytes of lane ``t`` are ``raw[nb t : nb (t + 1)]``."""
    planes = []
    for p in range(nb):
        pick = ir.Constant(_VI, [p + nb * t for t in range(LANES)])
        planes.append(builder.zext(builder.shuffle_vector(raw, raw, pick), _VI))
    lo = planes[0]
    for p in range(1, min(nb, 3)):
        lo = builder.or_(lo, builder.shl(planes[p], _splat_int(8 * p)))
    hi = None
    if nb > 3:
        hi = planes[3]
        for p in range(4, nb):
            hi = builder.or_(hi, builder.shl(planes[p], _splat_int(8 * (p - 3))))
    return lo, hi


def _byte_code(builder: Any, byte: Any, bits: int, signed: bool) -> Any:
    """A code held alone in a byte, as :func:`emulate.cpu.parts.reader` reads it: the byte,
    less ``2**bits`` where signed and at least ``2**(bits - 1)``."""
    if not signed:
        return byte
    wrapped = builder.sub(byte, _splat_int(1 << bits))
    return builder.select(
        builder.icmp_unsigned(">=", byte, _splat_int(1 << (bits - 1))), wrapped, byte
    )


def _codes(builder: Any, raw: Any, bits: int, packed: bool, signed: bool) -> list[Any]:
    """The codes of each lane's group, one i32 vector per code of a group."""
    g, nb = group_geometry(bits, packed)
    lo, hi = _words(builder, raw, nb)
    if not packed:
        return [_byte_code(builder, lo, bits, signed)]
    return [_code(builder, lo, hi, bits, q, signed) for q in range(g)]


def _looked_up(builder: Any, table: list[Any], code: Any) -> Any:
    """``table[code]`` in each lane, on AVX-512 (only where :func:`emulate.cpu.table_lookups`
    holds): a 16-entry table (4-bit codes) by one ``vpermps``; a 256-entry one (8-bit
    codes) by eight 32-entry ``vpermi2ps`` and a choice among them on the code's top three
    bits. ``table``: the table as vectors of :data:`LANES`."""
    if len(table) == 1:
        fnty = ir.FunctionType(_VF, [_VF, _VI])
        name = "llvm.x86.avx512.permvar.sf.512"
        return builder.call(
            cgutils.get_or_insert_function(builder.module, fnty, name), [table[0], code]
        )
    fnty = ir.FunctionType(_VF, [_VF, _VI, _VF])
    pair = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpermi2var.ps.512")
    low = builder.and_(code, _splat_int(31))
    picks = [builder.call(pair, [table[2 * j], low, table[2 * j + 1]]) for j in range(8)]
    for bit in (5, 6, 7):  # halve the candidates on each of the code's top bits
        set_ = builder.icmp_unsigned("!=", builder.and_(code, _splat_int(1 << bit)), _splat_int(0))
        picks = [builder.select(set_, b, a) for a, b in zip(picks[::2], picks[1::2])]
    return picks[0]


def _values(builder: Any, table: list[Any] | None, codes: list[Any], zv: Any) -> list[Any]:
    """Each code's value less its zero point, float32: ``table[c] - z`` where the codes
    index a table, else ``c - z`` in int32 (zero points are integers) converted once."""
    if table is not None:
        return [builder.fsub(_looked_up(builder, table, c), zv, flags=_FAST) for c in codes]
    zi = builder.fptosi(zv, _VI)
    return [builder.sitofp(builder.sub(c, zi), _VF) for c in codes]


def _table(context: Any, builder: Any, aty: Any, table: Any, lookup: int, bits: int) -> Any:
    """The float32 table of ``2**bits`` entries (4 or 8 bits) as vectors of :data:`LANES`,
    None where the codes are integers."""
    if not lookup:
        return None
    return [
        _load_floats(context, builder, aty, table, ir.Constant(_I64, LANES * i))
        for i in range((1 << bits) // LANES)
    ]


def _code(builder: Any, lo: Any, hi: Any, bits: int, q: int, signed: bool) -> Any:
    """Code ``q`` of each lane's group (stream bits ``[bits q, bits (q + 1))``) as i32."""
    o, mask = bits * q, _splat_int((1 << bits) - 1)
    if o + bits <= 24:
        c = builder.lshr(lo, _splat_int(o)) if o else lo
    elif o >= 24:
        c = builder.lshr(hi, _splat_int(o - 24)) if o > 24 else hi
    else:  # across bytes 2 and 3
        c = builder.or_(builder.lshr(lo, _splat_int(o)), builder.shl(hi, _splat_int(24 - o)))
    c = builder.and_(c, mask)
    if signed:
        c = builder.ashr(builder.shl(c, _splat_int(32 - bits)), _splat_int(32 - bits))
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
    """``lanes[t] += s_t * sum_q x[q * plane + g0 + t] * (v_(q, g0 + t) - z_t)`` for ``t <
    LANES``: ``lanes`` a float32 array of :data:`LANES` (keep it on the stack:
    :func:`emulate.cpu.parts.stack_floats`), ``codes`` a uint8 row (group ``i`` at bytes
    ``[nb i, nb (i + 1))``), ``table`` the float32 value of each code where ``lookup``
    (16 or 256 entries: 4- or 8-bit codes), ``g0`` the first group (uint64, a multiple of
    :data:`LANES`), ``x`` float32 planes of ``plane`` (uint64) elements each, ``s`` and
    ``z`` the blocks' float32 scales and zero points (arrays indexed by block: group ``i``
    is in block ``i // per_block``; or one scalar for every block). Compile-time
    constants: ``bits`` (2 to 8), ``packed`` (1: a bit stream; 0: one code a byte),
    ``signed`` (0 or 1), ``lookup`` (1: values from ``table``, only where
    :func:`emulate.cpu.table_lookups` holds), ``per_block`` (groups a block: a multiple or
    a divisor of :data:`LANES`). No bounds checks: the caller keeps ``g0 + LANES`` within
    the row."""
    checked = _literals("group_lanes", (bits, packed, signed, lookup, per_block), 3)
    if checked is None:
        return None
    width, is_packed, is_signed, is_lookup, per = checked
    if not (per % LANES == 0 or LANES % per == 0):
        raise ValueError(f"group_lanes: per_block={per} is not a multiple or divisor of {LANES}")
    nb = group_geometry(width, is_packed)[1]

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        lanes_v, codes_v, table_v, g0_v, x_v, plane_v, s_v, z_v = args[:8]
        start, stride = _index(builder, g0_v), _index(builder, plane_v)
        raw = _load_groups(context, builder, sig.args[1], codes_v, start, nb)
        zv = _block_floats(context, builder, sig.args[7], z_v, start, per)
        table_vec = _table(context, builder, sig.args[2], table_v, is_lookup, width)
        values = _values(builder, table_vec, _codes(builder, raw, width, is_packed, is_signed), zv)
        xs = [
            _load_floats(
                context,
                builder,
                sig.args[4],
                x_v,
                builder.add(start, builder.mul(stride, ir.Constant(_I64, q))),
            )
            for q in range(len(values))
        ]
        sv = _block_floats(context, builder, sig.args[6], s_v, start, per)
        _add_into(
            context,
            builder,
            sig.args[0],
            lanes_v,
            builder.fmul(sv, _dot(builder, xs, values), flags=_FAST),
        )
        return context.get_dummy_value()

    args = (lanes, codes, table, g0, x, plane, s, z, bits, packed, signed, lookup, per_block)
    return types.none(*args), codegen


def _interleave(builder: Any, planes: list[Any]) -> Any:
    """One vector of ``len(planes) * LANES`` lanes, lane ``g t + q`` = ``planes[q][t]``."""
    joined = list(planes)
    while len(joined) > 1:  # concatenate pairs: g is 1, 2, 4 or 8
        n = joined[0].type.count
        pick = ir.Constant(ir.VectorType(_I32, 2 * n), list(range(2 * n)))
        joined = [builder.shuffle_vector(a, b, pick) for a, b in zip(joined[::2], joined[1::2])]
    g = len(planes)
    whole = joined[0]
    order = [q * LANES + t for t in range(LANES) for q in range(g)]
    return builder.shuffle_vector(whole, whole, ir.Constant(ir.VectorType(_I32, g * LANES), order))


@intrinsic
def code_values(
    typingctx: Any, out: Any, codes: Any, g0: Any, bits: Any, packed: Any, signed: Any
) -> Any:
    """``out[g (g0 + t) + q] = v_(q, g0 + t)`` for ``t <`` :data:`LANES` and each of a
    group's ``g`` codes: the codes' integer values as float32 (exact), in the codes'
    order. ``codes`` and ``g0`` as for :func:`group_lanes`; ``out`` float32, indexed by
    code. No bounds checks."""
    checked = _literals("code_values", (bits, packed, signed))
    if checked is None:
        return None
    width, is_packed, is_signed = checked
    g, nb = group_geometry(width, is_packed)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        out_v, codes_v, g0_v = args[:3]
        start = _index(builder, g0_v)
        raw = _load_groups(context, builder, sig.args[1], codes_v, start, nb)
        planes = [builder.sitofp(c, _VF) for c in _codes(builder, raw, width, is_packed, is_signed)]
        values = _interleave(builder, planes)
        into = _at(context, builder, sig.args[0], out_v, builder.mul(start, ir.Constant(_I64, g)))
        builder.store(values, builder.bitcast(into, values.type.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(out, codes, g0, bits, packed, signed), codegen


def _half_bits_to_float(builder: Any, h: Any) -> Any:
    """float32 values of float16 bits ``h`` (an i32 vector), as
    :func:`emulate.cpu.parts.float16_value` gives them: subnormals as ``m * 2**-24``,
    NaN made quiet with its payload kept."""
    sign = builder.shl(builder.and_(h, _splat_int(0x8000)), _splat_int(16))
    e = builder.and_(builder.lshr(h, _splat_int(10)), _splat_int(31))
    m = builder.and_(h, _splat_int(1023))
    low = builder.shl(m, _splat_int(13))
    normal = builder.or_(builder.shl(builder.add(e, _splat_int(112)), _splat_int(23)), low)
    quiet = builder.select(
        builder.icmp_unsigned("!=", m, _splat_int(0)), _splat_int(0x00400000), _splat_int(0)
    )
    special = builder.or_(builder.or_(_splat_int(0x7F800000), quiet), low)
    tiny = builder.fmul(builder.sitofp(m, _VF), ir.Constant(_VF, [2.0**-24] * LANES))
    tiny = builder.bitcast(tiny, _VI)
    bits = builder.select(builder.icmp_unsigned("==", e, _splat_int(31)), special, normal)
    bits = builder.select(builder.icmp_unsigned("==", e, _splat_int(0)), tiny, bits)
    return builder.bitcast(builder.or_(bits, sign), _VF)


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
        start = _index(builder, j0_v)
        at = _at(context, builder, sig.args[1], data_v, builder.mul(start, ir.Constant(_I64, 2)))
        halves = ir.VectorType(ir.IntType(16), LANES)
        h = builder.zext(builder.load(builder.bitcast(at, halves.as_pointer()), align=1), _VI)
        if is_brain:
            values = builder.bitcast(builder.shl(h, _splat_int(16)), _VF)
        else:
            values = _half_bits_to_float(builder, h)
        into = _at(context, builder, sig.args[0], out_v, start)
        builder.store(values, builder.bitcast(into, _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(out, data, j0, brain), codegen


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
    index 0) or one scalar; ``table`` and ``lookup`` as for :func:`group_lanes`. No bounds
    checks."""
    checked = _literals("column_lanes", (bits, packed, signed, lookup), 3)
    if checked is None:
        return None
    width, is_packed, is_signed, is_lookup = checked
    if group_geometry(width, is_packed)[1] != 1:
        raise ValueError(f"column_lanes: {width}-bit codes packed along K span bytes")

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        lanes_v, row_v, table_v, n0_v, x_v, k0_v, z_v = args[:7]
        k_first = _index(builder, k0_v)
        raw = _load_groups(context, builder, sig.args[1], row_v, _index(builder, n0_v), 1)
        if isinstance(sig.args[6], types.Array):
            zv = _load_floats(context, builder, sig.args[6], z_v, ir.Constant(_I64, 0))
        else:
            zv = _splat_float(builder, z_v)
        table_vec = _table(context, builder, sig.args[2], table_v, is_lookup, width)
        values = _values(builder, table_vec, _codes(builder, raw, width, is_packed, is_signed), zv)
        xs = [
            _splat_float(
                builder,
                builder.load(
                    _at(
                        context,
                        builder,
                        sig.args[4],
                        x_v,
                        builder.add(k_first, ir.Constant(_I64, q)),
                    )
                ),
            )
            for q in range(len(values))
        ]
        _add_into(context, builder, sig.args[0], lanes_v, _dot(builder, xs, values))
        return context.get_dummy_value()

    return types.none(lanes, row, table, n0, x, k0, z, bits, packed, signed, lookup), codegen
