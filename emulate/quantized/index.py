"""Indexing a QArray along its leading, unblocked axes: one expert of stacked experts, one
layer of stacked layers.

``q[i]`` on a QArray of shape ``(E, K, N)`` whose block length along axis 0 is 1 (every
stacked QArray: ``jax.tree.map(jnp.stack, ...)`` and ``vmap`` make it so) is the ``(K, N)``
QArray of index ``i``: its codes, scales, zero points, offsets and a QArray of scales
indexed alike, nothing decoded. Keys: ints and slices (any step) of the leading axes,
optionally closed by ``...``; a full slice ``:`` leaves an axis as it is, blocked or not,
so ``q[0, :, :]`` works and ``q[...]`` is ``q``. Any axis of block length 1 may be
indexed so, also one after a packed axis (``q[:, 1]``: one column of per-column int4
scales packed along K). The record is read without importing
:class:`emulate.QArray` (``dataclasses.replace`` builds the result; it validates it).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from emulate.numerics.storage import Packed
from emulate.quantized.checks import is_int, is_record

__all__ = ["index_leading"]

_KEYS = "ints and slices of leading axes whose block length is 1, optionally ending in ..."


def _entries(key: Any, ndim: int) -> tuple[int | slice, ...]:
    """``key`` as one int or slice per indexed leading axis (trailing ``...`` and full slices
    dropped)."""
    parts = key if isinstance(key, tuple) else (key,)
    if parts and parts[-1] is Ellipsis:
        parts = parts[:-1]
    out: list[int | slice] = []
    for k in parts:
        if isinstance(k, slice):
            out.append(k)
            continue
        if isinstance(k, bool) or k is None or k is Ellipsis:
            raise TypeError(f"key: a QArray takes {_KEYS}; got {key!r}")
        try:
            out.append(operator.index(k))
        except TypeError:
            raise TypeError(
                f"key: a QArray takes {_KEYS}; got {key!r} (index q.dequantize() for other "
                "indexing)"
            ) from None
    if len(out) > ndim:
        raise IndexError(f"key: {len(out)} indices for a QArray of {ndim} dimensions")
    while out and out[-1] == slice(None):
        out.pop()
    return tuple(out)


def _checked(entries: tuple[int | slice, ...], q: Any) -> tuple[int | slice, ...]:
    """The entries with negative ints counted from the end; refuses a blocked axis, an
    act-order or packed axis, and an int out of range (IndexError, as numpy)."""
    nd = len(q.shape)
    packed_axis = q.codes.axis % nd if isinstance(q.codes, Packed) else None
    perm_axis = q.perm_axis % nd if q.perm_axis is not None else None
    out: list[int | slice] = []
    for d, k in enumerate(entries):
        if k == slice(None):
            out.append(k)
            continue
        if q.block_shape[d] != 1:
            raise ValueError(
                f"key: axis {d} of this QArray is blocked (block length {q.block_shape[d]} of "
                f"shape {q.shape}): indexing it would cut a scale block; a QArray takes {_KEYS}"
            )
        if d in (packed_axis, perm_axis):
            what = "packed" if d == packed_axis else "act-order permuted"
            raise ValueError(f"key: axis {d} of this QArray is {what}; it cannot be indexed")
        if isinstance(k, int):
            n = q.shape[d]
            if not -n <= k < n:
                raise IndexError(f"key: index {k} is out of range for axis {d} of size {n}")
            k %= n
        out.append(k)
    return tuple(out)


def _take(x: Any, entries: tuple[int | slice, ...]) -> Any:
    """One part of the record indexed (static parts and the tensor scale as they are)."""
    if x is None or is_int(x) or isinstance(x, float):
        return x
    if is_record(x):
        return index_leading(x, entries)
    if isinstance(x, Packed):
        # the packed axis is counted from the end: an int taking an axis after it away
        # moves it one closer to the end
        packed = x.data.ndim + x.axis
        gone = sum(isinstance(k, int) for d, k in enumerate(entries) if d > packed)
        return Packed(x.data[entries], x.format_name, x.axis + gone, x.length)
    return x[entries]


def index_leading(q: Any, key: Any) -> Any:
    """``q[key]`` for a QArray ``q``: see the module docstring.

    Raises:
      TypeError: a key that is not ints, slices and a closing ``...`` (arrays, None, bool).
      ValueError: an int or a partial slice on an axis whose block length is not 1, or on a
        packed or act-order permuted axis.
      IndexError: more indices than dimensions, an int out of range.
    """
    entries = _checked(_entries(key, len(q.shape)), q)
    if not entries:
        return q
    kept = [d for d in range(len(q.shape)) if d >= len(entries) or isinstance(entries[d], slice)]
    shape = [
        len(range(*entries[d].indices(q.shape[d]))) if d < len(entries) else q.shape[d]  # type: ignore[union-attr]
        for d in kept
    ]
    return dataclasses.replace(
        q,
        codes=_take(q.codes, entries),
        scales=_take(q.scales, entries),
        zero_points=_take(q.zero_points, entries),
        offsets=_take(q.offsets, entries),
        block_shape=tuple(q.block_shape[d] for d in kept),
        shape=tuple(shape),
    )
