"""Storage of low-precision values: raw codes, and packed sub-byte arrays.

**Codes.** Every codec works on codes, never on XLA's own conversion of a low-precision
type (older TPUs cannot convert those, and XLA on the CPU cannot hold float6 arrays). A
code is the format's bit pattern in the low ``bits`` bits of a ``uint8`` (``uint16`` /
``uint32`` for the wide types; ``uint16`` for the P3109 formats of 9 to 16 bits, which
have no packed form). :func:`to_codes` and :func:`from_codes` convert.

**Packed arrays.** :class:`Packed` holds codes of any format narrower than a byte (2 to 7
bits) densely, and the codes of an 8-bit format without a numpy dtype (the P3109 formats,
yours: :func:`emulate.formats.register`) one a byte, so that the array names its format.
Layout along the packed axis (a little-endian bit stream):
element ``i`` occupies bits ``[bits*i, bits*(i+1))`` of the stream, byte ``j`` holds
stream bits ``[8j, 8j+8)`` with the least significant bit first. So for 4-bit formats
element ``2j`` is the LOW nibble of byte ``j`` and element ``2j+1`` the HIGH nibble; for
6-bit formats elements ``4g..4g+3`` fill bytes ``3g..3g+2`` as ``c0 | c1 << 6 | c2 << 12 |
c3 << 18``; 2-bit codes go four a byte, lowest first; 3- and 5-bit codes eight to 3 and 5
bytes. A row of ``n`` elements takes ``ceil(bits * n / 8)`` bytes; unused high bits of
the last byte are zero.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.formats import Format, FormatLike
from emulate.numerics.pytree import PytreeRecord

__all__ = [
    "Packed",
    "code_dtype",
    "code_planes",
    "from_codes",
    "group_bytes",
    "group_shape",
    "is_array",
    "pack",
    "split_group_bytes",
    "to_codes",
    "unpack",
    "unpack_codes",
]


def code_dtype(fmt: Format) -> np.dtype:
    """The unsigned dtype that holds one code of ``fmt`` (uint8 for 4-, 6- and 8-bit formats)."""
    return formats.unsigned_dtype(fmt.bits)


def _wide_codes_not_packed(f: Format) -> str:
    """Why a format of 9 to 16 bits without a dtype (a wide P3109 format) has no packed
    form: the message of every packed path (``pack``, :class:`Packed`, the Pallas
    kernels), after the argument's name."""
    return (
        f"{f.name} is a {f.bits}-bit format, whose codes are uint16: packed storage of "
        "codes wider than a byte is not built (pack, Packed and the Pallas kernels take "
        "codes of at most 8 bits); pass its uint16 codes with the format instead"
    )


def is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) or isinstance(x, jax.core.Tracer)


def _dtype_of(x: jax.Array | np.ndarray) -> np.dtype:
    return np.dtype(x.dtype)


def to_codes(
    x: jax.Array | np.ndarray, fmt: FormatLike | None = None, *, arg: str = "x"
) -> tuple[jax.Array, Format]:
    """Return ``(codes, format)`` for an array of a registered dtype, or codes plus a format.

    Args:
      x: a jax or numpy array whose dtype is a registered format (float6 numpy arrays
        included), or an unsigned integer array of raw codes when ``fmt`` is given.
      fmt: the format of ``x``'s codes. Required for raw codes; when ``x`` already has a
        low-precision dtype it must agree with it.
      arg: the argument name used in error messages.

    Returns:
      A jax array of codes (``code_dtype(format)``) with ``x``'s shape, and the Format.

    Raises:
      TypeError: ``x`` is not an array, or its dtype is not a format.
      ValueError: ``fmt`` disagrees with ``x``'s dtype, or concrete codes exceed the
        format's width (traced codes have their high bits masked off instead).
    """
    if isinstance(x, Packed):
        raise TypeError(f"{arg}: got a Packed array; unpack it first or pass it to decode")
    if not is_array(x):
        raise TypeError(
            f"{arg}: expected a jax or numpy array, got {type(x).__name__}; "
            "accepted: arrays of a format dtype, or uint8 codes with fmt="
        )
    dt = _dtype_of(x)
    if fmt is not None:
        # name the argument: fmt=, or lhs_format= ...
        f = formats.get(fmt, arg="fmt" if arg == "x" else f"{arg}_format")
        if dt.name == f.name:
            return _bits_of(x, f), f
        if dt.kind == "u" and dt.itemsize * 8 >= f.bits and dt.name not in ("uint4",):
            if dt.itemsize * 8 > f.bits:
                x = _checked_codes(x, f, arg)
            codes = jnp.asarray(x)
            if codes.dtype != code_dtype(f):
                codes = codes.astype(code_dtype(f))
            return codes, f
        raise ValueError(
            f"{arg}: dtype {dt.name} does not match fmt={f.name}; accepted: an array of dtype "
            f"{f.name}, or unsigned integer codes ({code_dtype(f).name})"
        )
    try:
        f = formats.get(dt)
    except ValueError:
        raise TypeError(
            f"{arg}: dtype {dt.name} is not a supported format; pass uint8 codes with fmt=, "
            f"or an array of one of: {', '.join(formats.names())}"
        ) from None
    return _bits_of(x, f), f


def _checked_codes(x: jax.Array | np.ndarray, f: Format, arg: str) -> jax.Array | np.ndarray:
    """Raw codes with nothing above the format's ``bits`` bits: a concrete array (numpy, or
    jax outside a trace) is checked and refused with ValueError; a traced one cannot be
    checked without a host round trip, so its high bits are masked off (ignored)."""
    if isinstance(x, jax.core.Tracer):
        return jnp.asarray(x) & jnp.asarray(f.code_mask, x.dtype)
    bad = np.asarray(x) > f.code_mask
    if bad.any():
        first = int(np.asarray(x)[bad].ravel()[0])
        raise ValueError(
            f"{arg}: {int(bad.sum())} code(s) exceed {f.name}'s {f.bits} bits (e.g. {first:#x}; "
            f"codes must lie in [0, {f.code_mask:#x}])"
        )
    return x


def _bits_of(x: jax.Array | np.ndarray, f: Format) -> jax.Array:
    if isinstance(x, np.ndarray):
        # numpy (ml_dtypes) holds a code of under 8 bits in the low bits of a byte: a view,
        # no XLA program to compile per shape (of the bytes in this machine's order)
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        bits = x.view(np.dtype(f"u{x.dtype.itemsize}"))
        if f.bits < 8:
            bits = bits & np.uint8(f.code_mask)
        return jnp.asarray(bits.astype(code_dtype(f), copy=False))
    return _jax_bits(x, f.name)


@functools.partial(jax.jit, static_argnames=("name",))
def _jax_bits(x: jax.Array, name: str) -> jax.Array:
    """:func:`_bits_of` of a jax array: one program (per shape) outside a trace."""
    f = formats.get(name)
    if f.bits == 2:  # jax int2 / uint2 arrays: widen, then keep the code bits
        wide = x.astype(jnp.int8 if f.signed else jnp.uint8)
        return lax.bitcast_convert_type(wide, jnp.uint8) & jnp.uint8(f.code_mask)
    if f.bits == 4:
        # uint4 -> uint8 is an integer widening, which every backend has.
        return lax.bitcast_convert_type(x, jnp.uint4).astype(jnp.uint8)
    return lax.bitcast_convert_type(x, code_dtype(f))


def from_codes(codes: jax.Array, fmt: FormatLike) -> jax.Array:
    """Turn codes into an array of ``fmt``'s dtype (codes stay codes for float6).

    XLA cannot hold float6 arrays, so for ``float6_*`` the uint8 codes are returned as they
    are. Bits above the format's width must be zero.
    """
    f = formats.get(fmt)
    if not f.xla_storable:
        return codes.astype(code_dtype(f))  # numpy codes stay numpy
    return _as_format(codes, f.name)


@functools.partial(jax.jit, static_argnames=("name",))
def _as_format(codes: jax.Array, name: str) -> jax.Array:
    """:func:`from_codes` for a format XLA holds: one program (per shape) outside a trace."""
    f = formats.get(name)
    if f.name == "int4":
        # A value convert of the sign-extended codes, not a uint4 -> int4 bitcast: XLA:TPU
        # (libtpu 0.0.42, v5e) drops that bitcast where it feeds a dot, which then reads
        # the codes as unsigned (code 8 as +8, not -8), int4 and bf16 x int4 dots alike.
        return ((codes.astype(jnp.int8) ^ jnp.int8(8)) - jnp.int8(8)).astype(jnp.int4)
    if f.bits == 4:
        return lax.bitcast_convert_type(codes.astype(jnp.uint4), f.dtype)
    return lax.bitcast_convert_type(codes.astype(code_dtype(f)), f.dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Packed(PytreeRecord, data=("data",), static=("format_name", "axis", "length")):
    """A sub-byte array stored densely: uint8 ``data`` plus static format, axis and length.

    ``data`` has the logical shape with the packed axis of length ``length`` replaced by
    ``ceil(bits * length / 8)`` bytes. ``axis`` is stored counted from the end (negative),
    so a leading batch axis added by ``vmap`` or by stacking keeps the record valid.
    Being a pytree with ``data`` as its only leaf, it passes through ``jit``, ``vmap``,
    ``device_put`` and shardings.
    """

    data: Any
    format_name: str
    axis: int
    length: int

    def __post_init__(self) -> None:
        # A record built by hand is checked here; JAX's own rebuilding (tree_unflatten)
        # skips this, as its leaves may be placeholders rather than arrays.
        f = formats.get(self.format_name, arg="format_name")
        if f.bits > 8 and not f.has_dtype:
            raise ValueError(f"format_name: {_wide_codes_not_packed(f)}")
        if not f.packable:
            raise ValueError(
                f"format_name: {f.name} is {f.bits}-bit; a Packed array holds a format "
                "narrower than a byte (2 to 7 bits: int4, uint4, float4_e2m1fn, float6_*, "
                "int2 ... uint6, formats you register) or an 8-bit format without a dtype "
                "(p3109_*, yours)"
            )
        for name in ("axis", "length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
        if self.length < 0:
            raise ValueError(f"length: expected a non-negative element count, got {self.length}")
        shape = getattr(self.data, "shape", None)  # an array, or a jax.ShapeDtypeStruct
        if not isinstance(shape, tuple) or not hasattr(self.data, "dtype"):
            raise TypeError(f"data: expected a uint8 array, got {type(self.data).__name__}")
        if np.dtype(self.data.dtype) != np.uint8:
            raise TypeError(f"data: expected a uint8 array, got dtype {self.data.dtype}")
        ndim = len(shape)
        if not -ndim <= self.axis < ndim:
            raise ValueError(
                f"axis: {self.axis} is out of range for data of shape {shape} (the packed "
                "axis, counted from the end: -1 for the last)"
            )
        object.__setattr__(self, "format_name", f.name)
        object.__setattr__(
            self, "axis", int(self.axis) - ndim if self.axis >= 0 else int(self.axis)
        )
        object.__setattr__(self, "length", int(self.length))
        want = _packed_len(f.bits, self.length)
        if shape[self.axis] != want:
            raise ValueError(
                f"length: {self.length} {f.name} elements need {want} bytes along axis "
                f"{self.axis}, the data has {shape[self.axis]}"
            )

    @property
    def format(self) -> Format:
        return formats.get(self.format_name)

    @property
    def dtype(self) -> np.dtype:
        """The logical element dtype (the format's ml_dtypes dtype)."""
        return self.format.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape: ``data.shape`` with the packed axis at its element length.

        Raises:
          ValueError: the data has lost the packed axis (``jax.vmap`` over an axis after it).
        """
        s = list(self.data.shape)
        _check_packed_axis(self.axis, self.length, self.format, tuple(s))
        s[self.axis] = self.length
        return tuple(s)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of storage: ``ceil(bits * length / 8)`` per packed row."""
        return math.prod(self.data.shape)

    def __repr__(self) -> str:
        return (
            f"Packed({self.format_name}, shape={self.shape}, axis={self.axis}, "
            f"nbytes={self.nbytes})"
        )


def _packed_len(bits: int, n: int) -> int:
    return -(-bits * n // 8)


def pack(x: jax.Array | np.ndarray, fmt: FormatLike | None = None, *, axis: int = -1) -> Packed:
    """Pack an array of a format narrower than a byte densely along ``axis``.

    Args:
      x: an array of int4, uint4, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, int2 or
        uint2 (jax or numpy), or uint8 codes with ``fmt`` (any of those, or int3, uint3,
        int5, uint5, int6, uint6, or a registered format without a dtype, 8-bit ones
        included: a p3109_* format, yours).
      fmt: the format of raw codes.
      axis: the axis to pack along; any length (odd lengths leave zero padding bits).
        The default is the last axis; for a matmul weight pack along its contracting
        axis (K: ``axis=0`` for a (K, N) weight), which the CPU route decodes plane by
        plane next to the dot: at M = 1 packing along N instead is about 15x slower
        (docs/performance.md, "The tiled CPU path"). :func:`emulate.quantize` packs
        along the first axis its blocks run along.

    Returns:
      A :class:`Packed` array (see the module docstring for the bit layout).

    Raises:
      TypeError: ``x`` is not an array, or ``axis`` is not an int.
      ValueError: the format is a byte wide or wider, or ``axis`` is out of range.
    """
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis: expected an int, got {type(axis).__name__} {axis!r}")
    codes, f = to_codes(x, fmt)
    if f.bits > 8 and not f.has_dtype:
        raise ValueError(f"x: {_wide_codes_not_packed(f)}")
    if not f.packable:
        raise ValueError(
            f"x: {f.name} is {f.bits}-bit, stored one a byte already; pack accepts formats "
            "of 2 to 7 bits (int4, uint4, float4_e2m1fn, float6_*, int2 ... uint6, formats "
            "you register) and 8-bit formats without a dtype (p3109_*, yours)"
        )
    ndim = codes.ndim
    if ndim == 0 or not -ndim <= axis < ndim:
        raise ValueError(f"axis: {axis} is out of range for an array of shape {codes.shape}")
    neg_axis = axis - ndim if axis >= 0 else axis
    return Packed(_pack_codes(codes, f.bits, neg_axis), f.name, neg_axis, codes.shape[neg_axis])


def group_shape(bits: int) -> tuple[int, int]:
    """``(elements, bytes)`` of the smallest run of whole bytes that holds whole codes:
    (2, 1) for 4-bit codes, (4, 3) for 6-bit, (4, 1) for 2-bit, (8, 3) for 3-bit and
    (8, 5) for 5-bit."""
    group = 8 // math.gcd(8, bits)
    return group, bits * group // 8


def _group_byte(c: jax.Array, bits: int, j: int) -> jax.Array:
    """Byte ``j`` of each group of codes ``c[..., i]`` (uint32): the OR of every code's
    bits that fall in stream bits ``[8j, 8j + 8)``."""
    byte = None
    for i in range(c.shape[-1]):
        lo = bits * i - 8 * j  # where code i starts, relative to the byte
        if lo >= 8 or lo + bits <= 0:
            continue
        part = c[..., i] << lo if lo >= 0 else c[..., i] >> -lo
        byte = part if byte is None else byte | part
    assert byte is not None
    return byte & 0xFF


@functools.partial(jax.jit, static_argnames=("bits", "neg_axis"))
def _pack_codes(codes: jax.Array, bits: int, neg_axis: int) -> jax.Array:
    c = jnp.moveaxis(codes, neg_axis, -1).astype(jnp.uint32)
    n = c.shape[-1]
    group, nbytes_group = group_shape(bits)
    pad = (-n) % group
    c = jnp.pad(c, [(0, 0)] * (c.ndim - 1) + [(0, pad)])
    # explicit sizes throughout: a -1 in a reshape divides by the other sizes (0 for an
    # empty axis before the packed one)
    c = c.reshape(c.shape[:-1] + ((n + pad) // group, group))
    byts = jnp.stack([_group_byte(c, bits, j) for j in range(nbytes_group)], axis=-1)
    byts = byts.reshape(byts.shape[:-2] + (byts.shape[-2] * byts.shape[-1],))
    byts = byts[..., : _packed_len(bits, n)]
    return jnp.moveaxis(byts.astype(jnp.uint8), -1, neg_axis)


def _check_packed_axis(axis: int, length: int, f: Format, shape: tuple[int, ...]) -> None:
    """That data of ``shape`` holds ``length`` elements of ``f`` along ``axis`` (counted from
    the end). A Packed rebuilt by JAX (``vmap``, ``tree_unflatten``) is not checked on
    construction; its first use is. ``vmap`` over an axis after the packed one moves the
    packed axis (or takes it away): the record cannot know, so it says so here."""
    expect = _packed_len(f.bits, length)
    if -len(shape) <= axis and shape[axis] == expect:
        return
    if -len(shape) <= axis:
        got = f"the data has {shape[axis]}"
    else:
        got = f"the data has {len(shape)} ax{'i' if len(shape) == 1 else 'e'}s"
    raise ValueError(
        f"p: {length} {f.name} elements need {expect} bytes along axis {axis} (counted from "
        f"the end), {got} (shape {shape}); jax.vmap and stacking may add or remove axes "
        "before the packed axis only: map over one of those, or pack along another axis "
        "(emulate.pack(x, axis=...))"
    )


def unpack_codes(p: Packed) -> jax.Array:
    """The uint8 codes of a :class:`Packed` array, in its logical shape."""
    if not isinstance(p, Packed):
        raise TypeError(f"p: expected a Packed array, got {type(p).__name__}")
    f = p.format
    data = jnp.asarray(p.data)
    if data.dtype != jnp.uint8:
        raise ValueError(f"p: Packed data must be uint8, got {data.dtype}")
    _check_packed_axis(p.axis, p.length, f, tuple(data.shape))
    return _unpack_codes(data, f.bits, p.axis, p.length)


@functools.partial(jax.jit, static_argnames=("bits", "axis", "length"))
def _unpack_codes(data: jax.Array, bits: int, axis: int, length: int) -> jax.Array:
    # The codes are interleaved in place, next to the packed axis, never by moving that
    # axis last (XLA would write a transposed copy and fuse less). Along a leading axis,
    # shifting a broadcast of each byte group by a constant pattern is the faster way on
    # XLA's CPU backend; along the last axis, stacking the codes is.
    ax = data.ndim + axis
    group = group_shape(bits)[0]
    mask = (1 << bits) - 1
    if ax < data.ndim - 1 and bits in (4, 6):
        parts = group_bytes(data, ax, bits)
        if bits == 4:
            word, shifts = parts[0], [0, 4]
        else:
            b0, b1, b2 = (q.astype(jnp.uint32) for q in parts)
            word, shifts = b0 | (b1 << 8) | (b2 << 16), [0, 6, 12, 18]
        pattern = jnp.asarray(shifts, word.dtype).reshape(
            (1,) * (ax + 1) + (group,) + (1,) * (word.ndim - ax - 1)
        )
        c = (jnp.expand_dims(word, ax + 1) >> pattern) & mask
    else:
        c = jnp.stack(split_group_bytes(group_bytes(data, ax, bits), bits), axis=ax + 1)
    c = c.reshape(c.shape[:ax] + (c.shape[ax] * c.shape[ax + 1],) + c.shape[ax + 2 :])
    return lax.slice_in_dim(c, 0, length, axis=ax).astype(jnp.uint8)


def group_bytes(data: jax.Array, axis: int, bits: int) -> list[jax.Array]:
    """The packed bytes along ``axis`` (non-negative) cut by position in their byte group
    (:func:`group_shape`): one array for 4- and 2-bit formats (every byte is a group),
    three for 6- and 3-bit ones, five for 5-bit ones (byte ``j`` of each group; the last
    group padded with zero bytes)."""
    n = group_shape(bits)[1]
    if n == 1:
        return [data]
    pad = (-data.shape[axis]) % n
    if pad:
        widths = [(0, 0)] * data.ndim
        widths[axis] = (0, pad)
        data = jnp.pad(data, widths)
    groups = data.reshape(data.shape[:axis] + (data.shape[axis] // n, n) + data.shape[axis + 1 :])
    return [lax.index_in_dim(groups, j, axis + 1, keepdims=False) for j in range(n)]


def split_group_bytes(parts: Sequence[jax.Array], bits: int) -> list[jax.Array]:
    """The codes of each byte group, lowest first, from its bytes (:func:`group_bytes`):
    the low and the high nibble of a byte for 4-bit formats; for 6-bit formats
    ``c0 = b0 & 0x3F``, ``c1 = b0 >> 6 | (b1 & 0xF) << 2``, ``c2 = b1 >> 4 | (b2 & 3) << 4``,
    ``c3 = b2 >> 2``; other widths likewise, code ``i`` from the one or two bytes its bits
    fall in. Works on any unsigned or int32 array of byte values."""
    if bits == 4:
        (b,) = parts
        return [b & 0xF, b >> 4]
    if bits == 6:
        b0, b1, b2 = parts
        return [b0 & 0x3F, (b0 >> 6) | ((b1 & 0xF) << 2), (b1 >> 4) | ((b2 & 0x3) << 4), b2 >> 2]
    mask = (1 << bits) - 1
    out = []
    for i in range(group_shape(bits)[0]):
        j, sh = divmod(bits * i, 8)
        c = parts[j] >> sh
        if sh + bits > 8:
            c = c | (parts[j + 1] << (8 - sh))
        out.append(c & mask)
    return out


def code_planes(p: Packed) -> list[jax.Array]:
    """The uint8 codes of ``p`` split by position in their byte group, without interleaving:
    plane ``j`` holds elements ``j, j + g, j + 2g, ...`` along the packed axis (``g`` = 2
    for 4-bit formats: the low and the high nibbles; 4 for 6- and 2-bit ones, 8 for 3- and
    5-bit ones), ``ceil((length -
    j) / g)`` of them. Empty planes (a length below ``g``) are left out."""
    axis = p.data.ndim + p.axis
    parts = split_group_bytes(group_bytes(p.data, axis, p.format.bits), p.format.bits)
    g = len(parts)
    return [
        lax.slice_in_dim(q, 0, -(-(p.length - j) // g), axis=axis)
        for j, q in enumerate(parts)
        if j < p.length
    ]


def unpack(p: Packed) -> jax.Array:
    """Unpack to an array of the format's dtype (uint8 codes for float6, which XLA cannot hold)."""
    return from_codes(unpack_codes(p), p.format)
