"""What the safetensors conventions share: reading a checkpoint's tensors checked for
presence, dtype and rank, the error for metadata an importer does not understand, and the
bit-level readers (a little-endian bit stream of any width, nibble pairs in either order,
bitsandbytes' flat blocks, GPTQ's act-order permutation). The parsers (the sibling
modules) return :class:`~emulate.importers.stored.StoredParts`, in the logical shape a flax
``Dense`` kernel has, ``(..., K, N)`` (the torch checkpoints' ``(N, K)`` weights
transposed). Pure numpy: nothing here needs JAX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "bad",
    "tensor",
    "unpack_stream",
    "nibbles",
    "flat_block",
    "group_permutation",
]


def bad(name: str, field: str, got: object, expected: str) -> ValueError:
    """The error for metadata the importer does not understand: names the tensor (or
    config entry), the field, what it got and what it expected."""
    return ValueError(f"{name}: {field} is {got}; expected {expected}")


def tensor(
    tensors: Mapping[str, np.ndarray],
    name: str,
    dtypes: Sequence[np.dtype | type],
    ndim: int | Sequence[int],
) -> np.ndarray:
    """``tensors[name]``, checked for presence, dtype and rank (a ValueError naming it)."""
    if name not in tensors:
        raise ValueError(f"{name}: tensor is missing; the checkpoint has no tensor of that name")
    t = np.asarray(tensors[name])
    allowed = [np.dtype(d) for d in dtypes]
    if t.dtype not in allowed:
        raise bad(name, "dtype", t.dtype.name, " or ".join(d.name for d in allowed))
    ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if t.ndim not in ranks:
        raise bad(name, "rank", f"{t.ndim} (shape {t.shape})", " or ".join(map(str, ranks)))
    return t


def unpack_stream(words: np.ndarray, bits: int, count: int, axis: int) -> np.ndarray:
    """Codes of ``bits`` bits read from a little-endian, least-significant-bit-first bit
    stream along ``axis`` of ``words`` (any unsigned or signed integer dtype; each word's
    bytes in little-endian order): code ``j`` is stream bits ``[bits*j, bits*(j+1))``.
    Returns ``count`` uint8 codes along ``axis``. This is GPTQ's and compressed-tensors'
    int32 packing (also for 3 bits, where codes straddle words) and gguf's nibble order."""
    w = np.moveaxis(np.asarray(words), axis, -1)
    width = w.dtype.itemsize * 8
    u = np.ascontiguousarray(w).view(np.dtype(f"<u{w.dtype.itemsize}"))
    if width % bits == 0:  # whole codes per word: shifts and a mask
        shifts = np.arange(0, width, bits, dtype=u.dtype)
        mask = u.dtype.type((1 << bits) - 1)
        codes = ((u[..., None] >> shifts) & mask).reshape(*u.shape[:-1], -1)
    else:
        stream = np.unpackbits(u.view(np.uint8), axis=-1, bitorder="little")
        n = stream.shape[-1] // bits
        planes = stream[..., : n * bits].reshape(*stream.shape[:-1], n, bits)
        codes = (planes.astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(-1)
    if codes.shape[-1] < count:
        raise ValueError(
            f"words: {codes.shape[-1]} codes of {bits} bits along axis {axis}; expected at "
            f"least {count}"
        )
    return np.moveaxis(codes[..., :count].astype(np.uint8), -1, axis)


def nibbles(data: np.ndarray, *, high_first: bool) -> np.ndarray:
    """The two 4-bit codes of each byte along the last axis, in element order: low nibble
    first (gpt-oss, NVFP4, compressed-tensors) or high nibble first (bitsandbytes)."""
    lo, hi = data & 0x0F, data >> 4
    pair = (hi, lo) if high_first else (lo, hi)
    return np.stack(pair, axis=-1).reshape(*data.shape[:-1], -1).astype(np.uint8)


def flat_block(rows: int, cols: int, size: int, name: str) -> tuple[int, int]:
    """The rectangular block of a ``(rows, cols)`` row-major tensor cut into consecutive
    runs of ``size`` elements (bitsandbytes' blocks): ``(1, size)`` when ``size`` divides
    ``cols``, ``(size // cols, cols)`` when ``cols`` divides ``size``; other cases are not
    rectangular and are refused (naming ``name``)."""
    if cols % size == 0:
        return (1, size)
    if size % cols == 0:
        return (size // cols, cols)
    raise bad(
        name,
        "blocksize",
        f"{size} over rows of {cols} elements",
        "a blocksize that divides the row length or a multiple of it (blocks spanning "
        "part of a row are not rectangular)",
    )


def group_permutation(g_idx: np.ndarray, group: int, name: str) -> np.ndarray | None:
    """The act-order permutation for a group index ``g_idx`` (the group of each of the K
    input rows): None when the groups are already contiguous (``g_idx[k] == k // group``),
    else the stable argsort that makes them so. Refuses an index whose groups do not each
    hold ``group`` rows (the last one may hold fewer)."""
    k = g_idx.shape[0]
    expected = np.arange(k) // group
    if np.array_equal(g_idx, expected):
        return None
    perm = np.argsort(g_idx, kind="stable").astype(np.int32)
    if not np.array_equal(g_idx[perm], expected):
        raise bad(
            name,
            "groups",
            f"of sizes {np.bincount(g_idx.astype(np.int64)).tolist()}",
            f"each group to hold {group} rows (the last one may hold fewer)",
        )
    return perm
