"""The weight layout :func:`emulate.pallas.matmul` reads without a copy: :class:`KernelWeight`.

A sub-byte weight packed by :func:`emulate.pack` along K holds rows ``g*j .. g*j + g - 1``
in byte group ``j`` (``g`` codes per group of ``b`` bytes: 2 per byte for 4-bit formats,
4 per 3 bytes for 6-bit ones). Contracting that in a kernel needs the activations split
into ``g`` column planes ``x[:, t::g]`` (a strided copy of the activations on every call;
Mosaic has no lane-strided load of 16-bit data) or, for ``b > 1``, the byte planes of the
weight side by side (a relayout copy of the weight on every call).

:func:`planar_weight` stores the same codes once in a *K-planar* layout, the same
number of bytes: K is cut into tiles of ``T = 128 * g`` rows (zero codes pad the last
one); tile ``s`` takes ``128 * b`` byte rows, byte ``p`` of every group in rows
``[s*128*b + p*128, s*128*b + (p+1)*128)``, and group ``r`` of the tile holds the codes of
rows ``s*T + t*128 + r`` for ``t = 0 .. g-1``, code ``t`` at the bit position
:func:`emulate.pack` gives element ``t`` of a group. Decoded in VMEM, the ``g`` codes of a
tile's groups are ``g`` runs of 128 consecutive rows, which stacked give the tile's rows in
order: the kernel multiplies the activations as they are.

4-bit codes (two a byte, ``T = 256``) are in *word order* within their tile instead
(:func:`word_order_rows`): the tile's 128 byte rows are read as 32 little-endian 32-bit
words per column (bytes ``4i .. 4i + 3`` form word ``i``), and nibble ``p`` of word ``i``
(bits ``4p .. 4p + 3``) holds tile row ``64 * (p % 4) + 2 * i + p // 4``. A kernel then
cuts rows in order out of whole words: ``(word >> 4q) & 0x000F000F`` holds rows
``64q + 2i`` and ``64q + 2i + 1`` in its two 16-bit halves, the halves of a pair of
bfloat16 rows (:mod:`emulate.pallas.words`).

6-bit codes (four a 3-byte group, ``T = 512``) are in word order too, each 512-row tile
as two *word tiles* of 256 rows and 192 byte rows (:func:`word_fields`): the codes' low
four bits in the 128 byte rows of a 4-bit word-order tile, then their high two bits in 64
byte rows, 16 words of 16 two-bit *crumbs*: crumb ``p`` (bits ``2p .. 2p + 1``) of word
``j`` holds row ``64 * (r % 4) + 2 * (j + 16 * (r // 4)) + p // 8`` with ``r = p % 8``. So
``(crumbs >> (2r - 4)) & 0x00300030`` puts the high bits of a pair of rows at bits 4-5 of
the two halves of the pair's nibble word (``r = q`` for words 0-15 of run ``q``, ``r = q +
4`` for words 16-31): the same bytes as :func:`emulate.pack`'s, cut as GGUF Q6_K cuts its
codes (low nibbles and high two bits apart).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from emulate import formats
from emulate.formats import Format, FormatLike
from emulate.numerics.pytree import PytreeRecord
from emulate.numerics.storage import Packed, group_shape, is_array, to_codes, unpack_codes

__all__ = [
    "KernelWeight",
    "TILE_GROUPS",
    "kernel_codes",
    "kernel_layout",
    "planar_weight",
    "tiles",
    "WORD_TILE_ROWS",
    "word_fields",
    "word_order_rows",
    "word_tile_bytes",
]

#: Byte groups per tile along K: one lane-width of rows per code position.
TILE_GROUPS = 128
#: The narrowest lane slice of an x column plane a scale group's rows may take (Mosaic
#: compiles it).
_HALF_LANES = 64


@dataclasses.dataclass(frozen=True, eq=False)
class KernelWeight(PytreeRecord, data=("data",), static=("format_name", "length")):
    """A (K, N) sub-byte weight in the K-planar layout (module docstring); make it with
    :func:`emulate.pallas.prepare_weight` and keep it: :func:`emulate.pallas.matmul` reads
    it as stored.

    Attributes:
      data: uint8, ``(ceil(K / tile) * 128 * nbytes, N)``.
      format_name: the element format (4- or 6-bit, or another width below 8).
      length: K, the logical rows (the padding rows hold code 0, value +0).
    """

    data: Any
    format_name: str
    length: int

    def __post_init__(self) -> None:
        f = formats.get(self.format_name, arg="format_name")
        if not f.packable:
            raise ValueError(
                f"format_name: {f.name} is {f.bits}-bit; a KernelWeight holds a format "
                "narrower than a byte"
            )
        shape = getattr(self.data, "shape", None)
        if not isinstance(shape, tuple) or len(shape) != 2:
            raise TypeError(f"data: expected a 2-D uint8 array, got {type(self.data).__name__}")
        if np.dtype(self.data.dtype) != np.uint8:
            raise TypeError(f"data: expected a uint8 array, got dtype {self.data.dtype}")
        object.__setattr__(self, "format_name", f.name)
        want = tiles(f, self.length) * TILE_GROUPS * group_shape(f.bits)[1]
        if shape[0] != want:
            raise ValueError(
                f"length: {self.length} {f.name} rows in the K-planar layout need {want} "
                f"byte rows, the data has {shape[0]}"
            )

    @property
    def format(self) -> Format:
        return formats.get(self.format_name)

    @property
    def dtype(self) -> np.dtype:
        """The logical element dtype (the format's ml_dtypes dtype), as :class:`Packed`'s."""
        return self.format.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical (K, N); stacked experts (:func:`emulate.pallas.prepare_experts`,
        whose data has a leading expert axis): (G, K, N)."""
        return (*(int(d) for d in self.data.shape[:-2]), self.length, int(self.data.shape[-1]))

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def size(self) -> int:
        """Logical elements (the padding rows of the last tile not counted)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of storage as held (the padding rows of the last tile counted)."""
        return math.prod(self.data.shape)

    @property
    def tile(self) -> int:
        """Rows of K per tile: 128 times the codes per byte group."""
        return TILE_GROUPS * group_shape(self.format.bits)[0]

    def read_back(self) -> jax.Array:
        """The (K, N) uint8 codes, one a byte (:func:`kernel_codes`): how the XLA route reads
        it (:class:`emulate.engine.prepared.Prepared`)."""
        return kernel_codes(self)

    def __repr__(self) -> str:
        return f"KernelWeight({self.format_name}{list(self.shape)})"


def tiles(f: Format, k: int) -> int:
    """The K-planar tiles that hold ``k`` rows of ``f``."""
    return -(-k // (TILE_GROUPS * group_shape(f.bits)[0]))


def planar_weight(
    w: Packed | jax.Array | np.ndarray, w_format: FormatLike | None = None
) -> KernelWeight:
    """A sub-byte (K, N) weight in the layout :func:`emulate.pallas.matmul` reads as stored
    (what :func:`emulate.pallas.prepare_weight` does with a weight that is not a QArray).

    It takes the same bytes as ``emulate.pack(w, axis=0)`` (plus zero codes up to a whole
    tile of ``128 * g`` rows).

    Args:
      w: an :class:`emulate.Packed` 2-D weight packed along K (axis 0), an int4 / uint4 /
        float4_e2m1fn array, or uint8 codes of a sub-byte format with ``w_format``.
      w_format: the format of raw codes.

    Raises:
      TypeError: ``w`` is not an array or Packed.
      ValueError: not 2-D, packed along N, or a format a byte wide or wider (8-bit weights
        are read as stored: pass them to ``matmul`` directly).
    """
    if isinstance(w, KernelWeight):
        return w
    if isinstance(w, Packed):
        if w.ndim != 2 or w.axis != -2:
            raise ValueError(
                f"w: a Packed weight must be 2-D (K, N) and packed along K (axis 0); got "
                f"shape {w.shape} packed along axis {w.axis + w.ndim}"
            )
        if w_format is not None and formats.get(w_format) != w.format:
            raise ValueError(
                f"w_format: {formats.get(w_format).name} disagrees with the Packed w's format "
                f"{w.format.name}"
            )
        codes, f = unpack_codes(w), w.format
    elif is_array(w):
        codes, f = to_codes(w, w_format, arg="w")
    else:
        raise TypeError(
            f"w: expected a Packed weight, a sub-byte array or uint8 codes with w_format; "
            f"got {type(w).__name__}"
        )
    if not f.packable:
        raise ValueError(
            f"w: {f.name} is {f.bits}-bit; matmul reads 8-bit weights as stored, pass them "
            "directly (prepare_weight is for formats narrower than a byte)"
        )
    if codes.ndim != 2:
        raise ValueError(f"w: expected a 2-D (K, N) weight, got shape {tuple(codes.shape)}")
    data = _planar(codes, f.bits, tiles(f, codes.shape[0]))
    return KernelWeight(data, f.name, int(codes.shape[0]))


#: Code widths stored in word order (:func:`word_order_rows`); the others in byte planes.
WORD_ORDER_BITS = (4, 6)
#: Rows of K per word tile (a 4-bit tile; half a 6-bit one).
WORD_TILE_ROWS = 256


@functools.cache
def word_order_rows(bits: int = 4) -> np.ndarray:
    """The tile row of each nibble in a 4-bit word-order tile (module docstring), as an int
    array ``(128, 2)``: ``rows[b, h]`` is the row held by nibble ``h`` (0 low, 1 high) of the
    tile's byte row ``b`` (byte ``b % 4`` of word ``b // 4``). Rows ``64q + 2i + e`` come
    from nibble ``q + 4e`` of word ``i``. A 6-bit word tile's low nibbles are so too."""
    if bits not in WORD_ORDER_BITS:
        raise ValueError(f"bits: word order is built for {WORD_ORDER_BITS}-bit codes, got {bits}")
    rows = np.zeros((TILE_GROUPS, 2), np.int64)
    for b in range(TILE_GROUPS):
        i, j = divmod(b, 4)
        for h in range(2):
            p = 2 * j + h  # the nibble's position in its word
            rows[b, h] = 64 * (p % 4) + 2 * i + p // 4
    return rows


@functools.cache
def _crumb_rows() -> np.ndarray:
    """The word tile row of each crumb of a 6-bit word tile's 64 byte rows of high bits, as
    an int array ``(64, 4)``: ``rows[b, c]`` is held by bits ``2c .. 2c + 1`` of byte row
    ``b`` (crumb ``p = 4 (b % 4) + c`` of word ``j = b // 4``; module docstring)."""
    rows = np.zeros((TILE_GROUPS // 2, 4), np.int64)
    for b in range(TILE_GROUPS // 2):
        j, byte = divmod(b, 4)
        for c in range(4):
            p = 4 * byte + c
            r, e = p % 8, p // 8
            rows[b, c] = 64 * (r % 4) + 2 * (j + 16 * (r // 4)) + e
    return rows


@functools.cache
def word_fields(bits: int) -> tuple[tuple[int, int, np.ndarray, int, int], ...]:
    """Where a word tile (:data:`WORD_TILE_ROWS` rows of K) of ``bits``-bit codes keeps each
    code's bits: per field ``(first byte row, shift, tile rows, width, code shift)``,
    byte row ``first + b`` holds at bits ``shift .. shift + width - 1`` the bits ``code
    shift .. code shift + width - 1`` of the code of tile row ``tile_rows[b]``. 4-bit: two
    nibbles a byte (128 byte rows); 6-bit: those of the low four bits, then four crumbs a
    byte of the high two (64 byte rows more)."""
    rows = word_order_rows(bits)
    out = [(0, 4 * h, rows[:, h], 4, 0) for h in range(2)]
    if bits == 6:
        crumbs = _crumb_rows()
        out += [(TILE_GROUPS, 2 * c, crumbs[:, c], 2, 4) for c in range(4)]
    return tuple(out)


def word_tile_bytes(bits: int) -> int:
    """Byte rows of a word tile (:func:`word_fields`): 128 (4-bit), 192 (6-bit)."""
    return WORD_TILE_ROWS * bits // 8


def kernel_layout(
    codes: Any, *, group: int | None = None, planar: bool = False
) -> KernelWeight | jax.Array | Packed:
    """A (K, N) weight's codes in the layout :func:`emulate.pallas.matmul` reads them in:
    the one place that decides it (:func:`emulate.pallas.matmul_args.matmul_args` calls it
    once, after the route; :func:`emulate.pallas.prepare_weight` with ``planar``).

    - a :class:`KernelWeight` as it is;
    - a Packed array of one byte a group packed along K as stored, unless ``planar`` or a
      scale group of ``group`` rows of K (None: scales constant along K) takes less than a
      whole half-lane slice of each x column plane;
    - any other Packed array (3 or 5 bytes a group; packed along N, which
      :func:`planar_weight` refuses: ValueError) in the K-planar layout (a copy);
    - an array as it is (8-bit elements, ml_dtypes' int4 ... too: one a byte), but for
      elements of another width (K-planar).
    """
    if isinstance(codes, KernelWeight):
        return codes
    if isinstance(codes, Packed):
        g, nbytes = group_shape(codes.format.bits)
        split_groups = group is not None and (group // g) % _HALF_LANES != 0
        if planar or nbytes > 1 or codes.ndim != 2 or codes.axis != -2 or split_groups:
            return planar_weight(codes)
        return codes
    if np.dtype(codes.dtype).itemsize * 8 != 8:
        return planar_weight(codes)
    return codes


@functools.partial(jax.jit, static_argnames=("bits", "n_tiles"))
def _planar(codes: jax.Array, bits: int, n_tiles: int) -> jax.Array:
    g, nbytes = group_shape(bits)
    k, n = codes.shape
    c = jnp.pad(codes.astype(jnp.uint32), ((0, n_tiles * g * TILE_GROUPS - k), (0, 0)))
    if bits in WORD_ORDER_BITS:
        tile = c.reshape(-1, WORD_TILE_ROWS, n)
        out = jnp.zeros((tile.shape[0], word_tile_bytes(bits), n), jnp.uint32)
        for first, shift, rows, width, code_shift in word_fields(bits):
            part = ((tile[:, rows] >> code_shift) & ((1 << width) - 1)) << shift
            out = out.at[:, first : first + len(rows)].add(part)  # disjoint bits: an or
        return out.reshape(-1, n).astype(jnp.uint8)
    c = c.reshape(n_tiles, g, TILE_GROUPS, n)
    planes = []
    for p in range(nbytes):  # byte p of each group: the bits [8p, 8p + 8) of its stream
        byte = jnp.zeros((n_tiles, TILE_GROUPS, n), jnp.uint32)
        for t in range(g):
            lo = bits * t - 8 * p
            if lo >= 8 or lo + bits <= 0:
                continue
            byte = byte | (c[:, t] << lo if lo >= 0 else c[:, t] >> -lo)
        planes.append(byte & 0xFF)
    out = jnp.stack(planes, axis=1)  # (tiles, nbytes, 128, N)
    return out.reshape(n_tiles * nbytes * TILE_GROUPS, n).astype(jnp.uint8)


def kernel_codes(w: KernelWeight) -> jax.Array:
    """The (K, N) uint8 codes of a :class:`KernelWeight`, in K order (for the gradient and
    for tests; the kernel never unpacks)."""
    if not isinstance(w, KernelWeight):
        raise TypeError(f"w: expected a KernelWeight, got {type(w).__name__}")
    return _codes(jnp.asarray(w.data), w.format.bits, w.length)


@functools.partial(jax.jit, static_argnames=("bits", "length"))
def _codes(data: jax.Array, bits: int, length: int) -> jax.Array:
    g, nbytes = group_shape(bits)
    n = data.shape[1]
    if bits in WORD_ORDER_BITS:
        b = data.astype(jnp.uint32).reshape(-1, word_tile_bytes(bits), n)
        codes = jnp.zeros((b.shape[0], WORD_TILE_ROWS, n), jnp.uint32)
        for first, shift, rows, width, code_shift in word_fields(bits):
            part = (b[:, first : first + len(rows)] >> shift) & ((1 << width) - 1)
            codes = codes.at[:, rows].add(part << code_shift)
        return codes.reshape(-1, n)[:length].astype(jnp.uint8)
    b = data.astype(jnp.uint32).reshape(-1, nbytes, TILE_GROUPS, n)
    parts = [b[:, p] for p in range(nbytes)]
    mask = (1 << bits) - 1
    runs = []
    for t in range(g):  # code t of each group: the stream bits [bits*t, bits*(t+1))
        j, sh = divmod(bits * t, 8)
        c = parts[j] >> sh
        if sh + bits > 8:
            c = c | (parts[j + 1] << (8 - sh))
        runs.append(c & mask)
    codes = jnp.stack(runs, axis=1).reshape(-1, n)  # (tiles * g * 128, N) in K order
    return codes[:length].astype(jnp.uint8)
