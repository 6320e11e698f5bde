"""Raw codes: the bridge between arrays of a low-precision dtype and unsigned integer codes.

Every codec works on codes, never on XLA's own conversion of a low-precision type
(older TPUs cannot convert those, and XLA on CPU cannot even hold float6 arrays). A code
is the format's bit pattern in the low ``bits`` bits of a ``uint8`` (``uint16`` /
``uint32`` for the wide types).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.formats import Format

__all__ = ["to_codes", "from_codes", "code_dtype", "is_array"]

_UINT = {4: jnp.uint8, 6: jnp.uint8, 8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}
_SUB_BYTE_CONTAINER = {4: jnp.uint4}


def code_dtype(fmt: Format) -> np.dtype:
    """The unsigned dtype that holds one code of ``fmt`` (uint8 for 4-, 6- and 8-bit formats)."""
    return np.dtype(_UINT[fmt.bits])


def is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) or isinstance(x, jax.core.Tracer)


def _dtype_of(x: Any) -> np.dtype:
    return np.dtype(x.dtype)


def to_codes(x: Any, fmt: Any = None, *, arg: str = "x") -> tuple[jax.Array, Format]:
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
      ValueError: ``fmt`` disagrees with ``x``'s dtype, or codes exceed the format's width.
    """
    from emulate.packing import Packed  # packing imports this module

    if isinstance(x, Packed):
        raise TypeError(f"{arg}: got a Packed array; unpack it first or pass it to decode")
    if not is_array(x):
        raise TypeError(
            f"{arg}: expected a jax or numpy array, got {type(x).__name__}; "
            "accepted: arrays of a format dtype, or uint8 codes with fmt="
        )
    dt = _dtype_of(x)
    if fmt is not None:
        f = formats.get(fmt)
        if dt.name == f.name:
            return _bits_of(x, f), f
        if dt.kind == "u" and dt.itemsize * 8 >= f.bits and dt.name not in ("uint4",):
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


def _bits_of(x: Any, f: Format) -> jax.Array:
    if isinstance(x, np.ndarray) and not f.xla_storable:
        return jnp.asarray(x.view(np.uint8))
    x = jnp.asarray(x)
    if f.bits == 4:
        # uint4 -> uint8 is an integer widening, which every backend has.
        return lax.bitcast_convert_type(x, jnp.uint4).astype(jnp.uint8)
    return lax.bitcast_convert_type(x, code_dtype(f))


def from_codes(codes: jax.Array, fmt: Any) -> jax.Array:
    """Turn codes into an array of ``fmt``'s dtype (codes stay codes for float6).

    XLA cannot hold float6 arrays, so for ``float6_*`` the uint8 codes are returned as they
    are. Bits above the format's width must be zero.
    """
    f = formats.get(fmt)
    if not f.xla_storable:
        return codes.astype(jnp.uint8)
    if f.bits == 4:
        return lax.bitcast_convert_type(codes.astype(jnp.uint4), f.dtype)
    return lax.bitcast_convert_type(codes.astype(code_dtype(f)), f.dtype)
