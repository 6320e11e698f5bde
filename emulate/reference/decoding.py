"""Decoding in the oracle: values of a format, or raw codes of one, into float32, bfloat16
or float64 with ml_dtypes' own casts."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from emulate import formats
from emulate.formats import FormatLike
from emulate.reference.codes import decode_codes

__all__ = ["astype_quiet", "decode"]


_DECODE_TARGETS: dict[str, Any] = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float64": np.float64,
}


_CODE_DTYPES: dict[int, np.dtype] = {
    8: np.dtype(np.uint8),
    16: np.dtype(np.uint16),
    32: np.dtype(np.uint32),
}


def decode(
    x: npt.ArrayLike, fmt: FormatLike | None = None, *, to: npt.DTypeLike = np.float32
) -> np.ndarray:
    """Decode values of a format, or raw codes of one, into ``to``.

    Args:
      x: an array of a registered format's dtype (any ml_dtypes type, including float6,
        float4 and int4, or a wide type), or, with ``fmt``, an unsigned integer array of raw
        codes: uint8 for formats of at most 8 bits (4-bit codes in the low nibble, 6-bit
        codes in the low 6 bits, higher bits zero), uint16 for 16-bit formats and the
        P3109 formats of 9 to 16 bits, uint32 for 32-bit formats. JAX arrays are accepted
        through ``np.asarray``.
      fmt: the format (name, alias, dtype or :class:`emulate.formats.Format`). Optional when
        ``x`` already has the format's dtype; then it must agree with it.
      to: ``np.float32``, ``ml_dtypes.bfloat16`` or ``np.float64``.

    Returns:
      An array of dtype ``to`` and the shape of ``x``: ``codes.view(fmt.dtype).astype(to)``.
      Exact when ``to`` is float64 or is listed in ``fmt.exact_in``; otherwise (int32 or
      float32 into a narrower ``to``) it is ml_dtypes' round-to-nearest-even cast. NaN codes
      give NaN and Inf codes give Inf; negative zero stays negative zero.

    Raises:
      TypeError: ``x`` is neither of a format's dtype nor of the code dtype of ``fmt``.
      ValueError: an unknown ``fmt`` or ``to``, ``fmt`` disagreeing with ``x``'s format, or
        codes with bits set above the format's width.
    """
    arr = np.asarray(x)
    target = _decode_target(to)
    if fmt is None:
        try:
            f = formats.get(arr.dtype)
        except ValueError:
            raise TypeError(
                f"x: got an array of dtype {arr.dtype.name} and no fmt; pass an array of a "
                f"format's dtype ({', '.join(formats.names())}) or raw unsigned codes with fmt"
            ) from None
        return astype_quiet(arr, target)
    f = formats.get(fmt)
    if arr.dtype == f.dtype and f.has_dtype:
        return astype_quiet(arr, target)
    code_dtype = _CODE_DTYPES[max(8, f.bits)] if f.has_dtype else f.dtype
    if arr.dtype != code_dtype:
        raise TypeError(
            f"x: got dtype {arr.dtype.name} with fmt={f.name}; accepted: {f.dtype.name} values "
            f"or {code_dtype.name} raw codes"
        )
    if arr.size and int(arr.max()) > f.code_mask:
        raise ValueError(
            f"x: code {int(arr.max()):#x} does not fit the {f.bits}-bit format {f.name}; codes "
            f"must lie in [0, {f.code_mask:#x}]"
        )
    return astype_quiet(arr.view(f.dtype) if f.has_dtype else decode_codes(arr, f), target)


def _decode_target(to: npt.DTypeLike) -> type[np.generic]:
    try:
        name = np.dtype(to).name
    except TypeError:
        name = None
    if name not in _DECODE_TARGETS:
        raise ValueError(f"to: got {to!r}; accepted: np.float32, ml_dtypes.bfloat16, np.float64")
    return _DECODE_TARGETS[name]


def astype_quiet(arr: np.ndarray, target: npt.DTypeLike) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return arr.astype(target)
