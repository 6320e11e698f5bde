"""The parts of a quantized array, each checked in one place.

A :class:`emulate.QArray` of logical shape ``S`` and block ``B`` has one entry per block of
its scale grid ``G = ceil(S / B)``; its optional parts follow the same grid:

- zero points: an int (one for the tensor: the implicit offset of unsigned codes, GGUF
  Q4_0's 8), an integer array of shape ``G``, or a :class:`emulate.Packed` array of an
  integer format whose logical shape is ``G`` (AWQ and GPTQ store 4-bit zeros packed);
- offsets: a float (one for the tensor), a float32 / bfloat16 / float16 array of shape
  ``G``, or a QArray of shape ``G`` (GGUF K-quant mins, two-level);
- perm: an int32 permutation of one axis (act-order), with the axis counted from the end;
- codebook: an :class:`emulate.codebooks.Codebook`.

The functions here check those parts (naming the argument, what it got and what is
accepted) and put them in the form the record stores (``stored_*``);
:mod:`emulate.quantized.values` reads their values.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from emulate import formats
from emulate.codebooks import Codebook, codebook
from emulate.formats import Format, FormatLike
from emulate.numerics import codecs
from emulate.numerics.scales import SCALE_FORMATS, is_scale_format, scale_format
from emulate.numerics.storage import Packed, is_array, to_codes

__all__ = [
    "OFFSET_DTYPES",
    "SCALE_FORMATS",
    "as_format_array",
    "check_codebook",
    "check_offsets",
    "check_perm",
    "check_zero_points",
    "full_block",
    "grid_shape",
    "is_int",
    "is_record",
    "leaf_shape",
    "logical_dtype",
    "packed_shape",
    "scale_format_of",
    "stored_codebook",
    "stored_codes",
    "stored_offsets",
    "stored_perm",
    "stored_tensor_scale",
    "stored_zero_points",
    "validate_qarray",
]


#: The dtypes of a per-block offsets array.
OFFSET_DTYPES = ("float32", "bfloat16", "float16")


def is_int(v: object) -> bool:
    """An int (Python or numpy), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def grid_shape(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    """The scale grid: ``ceil(shape / block)`` per dimension."""
    return tuple(-(-n // b) for n, b in zip(shape, block, strict=True))


def packed_shape(p: Packed) -> tuple[int, ...]:
    s = list(p.data.shape)
    s[p.axis] = p.length
    return tuple(s)


def leaf_shape(x: Any) -> tuple[int, ...] | None:
    """The logical shape of an array, Packed array or QArray-like record (anything with a
    tuple ``shape``), None for a placeholder."""
    if isinstance(x, Packed):
        data_shape = getattr(x.data, "shape", None)
        return packed_shape(x) if isinstance(data_shape, tuple) else None
    shape = getattr(x, "shape", None)
    return tuple(shape) if isinstance(shape, tuple) else None


def check_zero_points(zp: Any, grid: tuple[int, ...], arg: str) -> None:
    """Refuse zero points that are not None, an int, an integer array of shape ``grid`` or
    a Packed array of an integer format of logical shape ``grid``."""
    if zp is None or is_int(zp):
        return
    if isinstance(zp, Packed):
        if not zp.format.is_integer:
            raise TypeError(
                f"{arg}: a Packed zero point array must hold an integer format, got "
                f"{zp.format_name}"
            )
    elif not is_array(zp):
        raise TypeError(
            f"{arg}: expected None, an int, an integer array of the scales' shape or a Packed "
            f"integer array, got {type(zp).__name__}"
        )
    elif np.dtype(zp.dtype).kind not in "iu" and np.dtype(zp.dtype).name not in (
        "int4",
        "uint4",
        "int2",
        "uint2",
    ):
        raise TypeError(f"{arg}: expected an integer dtype, got {np.dtype(zp.dtype).name}")
    got = leaf_shape(zp)
    if got is not None and got != grid:
        raise ValueError(
            f"{arg}: expected shape {grid} (one zero point per scale block), got {got}"
        )


def check_offsets(offsets: Any, grid: tuple[int, ...], arg: str) -> None:
    """Refuse offsets that are not None, a float, a float array (``OFFSET_DTYPES``) of shape
    ``grid`` or a QArray-like record of shape ``grid`` (two-level mins)."""
    if offsets is None or isinstance(offsets, float):
        return
    if is_record(offsets):  # a QArray: two-level offsets
        if offsets.shape != grid:
            raise ValueError(
                f"{arg}: a QArray of offsets must have the scales' shape {grid}, got "
                f"{offsets.shape}"
            )
        return
    if not is_array(offsets):
        raise TypeError(
            f"{arg}: expected None, a float, a float array of the scales' shape or a QArray, "
            f"got {type(offsets).__name__}"
        )
    name = np.dtype(offsets.dtype).name
    if name not in OFFSET_DTYPES:
        raise TypeError(f"{arg}: dtype {name} is not accepted; accepted: {OFFSET_DTYPES}")
    got = leaf_shape(offsets)
    if got is not None and got != grid:
        raise ValueError(f"{arg}: expected shape {grid} (one offset per scale block), got {got}")


def check_codebook(cb: Any, f: formats.Format, arg: str) -> None:
    """Refuse a codebook that is not a Codebook, or whose size is not ``2**bits`` of the
    codes' unsigned integer format ``f``."""
    if cb is None:
        return
    if not isinstance(cb, Codebook):
        raise TypeError(f"{arg}: expected an emulate.codebooks.Codebook, got {type(cb).__name__}")
    if not f.is_integer or f.signed or f.bits != cb.bits:
        raise ValueError(
            f"{arg}: a table of {len(cb.values)} entries needs unsigned {cb.bits}-bit codes "
            f"(uint{cb.bits}), got {f.name} codes"
        )


def check_perm(perm: Any, axis: Any, shape: tuple[int, ...], arg: str) -> None:
    """Refuse a permutation that is not an integer array whose last axis has the length of
    ``shape[axis]`` (``axis`` counted from the end, negative)."""
    if perm is None:
        if axis is not None:
            raise ValueError(f"{arg}_axis: given ({axis}) without a perm")
        return
    if not is_int(axis) or not -len(shape) <= axis < 0:
        raise ValueError(
            f"{arg}_axis: expected the permuted axis counted from the end (-{len(shape)} to "
            f"-1), got {axis!r}"
        )
    if not is_array(perm) or np.dtype(perm.dtype).kind not in "iu":
        raise TypeError(f"{arg}: expected an integer array, got {type(perm).__name__}")
    got = leaf_shape(perm)
    if got is not None and (not got or got[-1] != shape[axis]):
        raise ValueError(
            f"{arg}: expected {shape[axis]} entries (axis {axis} of shape {shape}), got shape {got}"
        )


def is_record(x: Any) -> bool:
    """Whether ``x`` is a QArray (a record with codes and a block), without importing it."""
    return hasattr(x, "block_shape") and hasattr(x, "codes")


def validate_qarray(q: Any, arg: str = "QArray") -> None:
    """Refuse a QArray whose parts disagree (names ``arg``, the part, what it got and what
    is accepted): the one validator of the record, run when one is built by hand."""
    f = formats.get(q.format_name, arg=arg)
    sf = formats.get(q.scale_format, arg=arg)
    if f.name in formats.SCALE_ONLY:  # wide floats are allowed: scaled_matmul's f32 operands
        raise ValueError(f"{arg}: format_name {f.name} is a scale type, not an element format")
    if not is_scale_format(sf):
        raise ValueError(
            f"{arg}: scale_format {sf.name} is not a scale format (emulate.numerics.scales: "
            f"one of {SCALE_FORMATS}, a P3109 or a registered float format with a NaN code)"
        )
    shape, block = q.shape, q.block_shape
    if not isinstance(shape, tuple) or not all(map(is_int, shape)):
        raise TypeError(f"{arg}: shape must be a tuple of ints, got {shape!r}")
    if (
        not isinstance(block, tuple)
        or len(block) != len(shape)
        or not all(is_int(b) and b >= 1 for b in block)
    ):
        raise ValueError(
            f"{arg}: block_shape must be {len(shape)} positive ints for shape {shape}, got "
            f"{block!r}"
        )
    if not is_int(q.element_exponent):
        raise TypeError(f"{arg}: element_exponent must be an int, got {q.element_exponent!r}")
    _check_codes(q, f, arg)
    grid = grid_shape(shape, block)
    scales_shape = leaf_shape(q.scales)
    if scales_shape is None or scales_shape != grid:
        raise ValueError(
            f"{arg}: scales have shape {scales_shape}, expected {grid} for shape {shape} in "
            f"blocks of {block}"
        )
    if is_record(q.scales):
        if sf.name != "float32":
            raise ValueError(f"{arg}: a QArray of scales needs scale_format float32, got {sf.name}")
    elif np.dtype(q.scales.dtype) != sf.dtype:  # uint8 codes for a format without a dtype
        raise ValueError(
            f"{arg}: scales are {np.dtype(q.scales.dtype).name}, the record says {sf.name} "
            f"(held as {sf.dtype.name})"
        )
    ts = q.tensor_scale
    if ts is not None and not isinstance(ts, (int, float)) and np.shape(ts) != ():
        raise ValueError(f"{arg}: tensor_scale must be None or a scalar, got shape {np.shape(ts)}")
    check_zero_points(q.zero_points, grid, f"{arg}: zero_points")
    check_offsets(q.offsets, grid, f"{arg}: offsets")
    check_codebook(q.codebook, f, f"{arg}: codebook")
    check_perm(q.perm, q.perm_axis, shape, f"{arg}: perm")


def _check_codes(q: Any, f: Format, arg: str) -> None:
    codes_shape = leaf_shape(q.codes)
    if codes_shape is None:
        raise TypeError(f"{arg}: codes must be an array or Packed, got {type(q.codes).__name__}")
    if codes_shape != q.shape:
        raise ValueError(f"{arg}: codes have shape {codes_shape}, the record says {q.shape}")
    if isinstance(q.codes, Packed):
        codes_fmt = q.codes.format_name
    else:  # float6 and code-format codes are uint8 (XLA cannot hold those types), the wide
        # P3109 ones uint16
        codes_fmt = np.dtype(q.codes.dtype).name
        own = formats.unsigned_dtype(f.bits).name
        codes_fmt = f.name if codes_fmt == own and not f.xla_storable else codes_fmt
    if codes_fmt != f.name:
        raise ValueError(f"{arg}: codes are {codes_fmt}, the record says {f.name}")


# --- from stored parts (QArray.from_parts) --------------------------------------------


def stored_codes(codes: Any, fmt: FormatLike | None) -> tuple[Any, Format, tuple[int, ...]]:
    """``from_parts``' codes: (codes as a QArray keeps them, format, logical shape)."""
    if isinstance(codes, Packed):
        f = codes.format
        if fmt is not None and formats.get(fmt) != f:
            raise ValueError(f"fmt: {formats.get(fmt).name} disagrees with the Packed codes")
        return codes, f, packed_shape(codes)
    if not is_array(codes):
        raise TypeError(f"codes: expected an array or Packed, got {type(codes).__name__}")
    raw, f = to_codes(codes, fmt, arg="codes")
    if not f.is_low_precision:
        raise ValueError(f"codes: expected a low-precision format, got {f.name}")
    return as_format_array(raw, f), f, tuple(raw.shape)


def stored_codebook(table: Any) -> Codebook:
    return codebook(table, arg="codebook")


def stored_zero_points(zp: Any) -> Any:
    """An int for a scalar (static), else the array or Packed array as given (checked by
    the validator against the scale grid)."""
    if zp is None or is_int(zp) or isinstance(zp, Packed):
        return None if zp is None else (int(zp) if is_int(zp) else zp)
    if is_array(zp) and not isinstance(zp, jax.core.Tracer) and np.shape(zp) == ():
        if np.dtype(zp.dtype).kind not in "iu":
            raise TypeError(f"zero_points: expected an integer, got dtype {zp.dtype}")
        return int(np.asarray(zp))
    return jnp.asarray(zp) if isinstance(zp, np.ndarray) else zp


def stored_offsets(off: Any) -> Any:
    """A float (rounded to f32) for a scalar (static), else as given."""
    if off is None or is_record(off):
        return off
    if isinstance(off, (float, np.floating)) and not isinstance(off, bool):
        return float(np.float32(off))
    if is_array(off) and not isinstance(off, jax.core.Tracer) and np.shape(off) == ():
        return float(np.asarray(off, np.float32))
    return jnp.asarray(off) if isinstance(off, np.ndarray) else off


def stored_tensor_scale(value: Any) -> jax.Array:
    """``from_parts``'s ``tensor_scale`` as a float32 array (its shape checked by the caller)."""
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    number = isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
    if not (number or kind in ("f", "i", "u", "V")):
        raise TypeError(
            f"tensor_scale: expected None or a float32 scalar, got {type(value).__name__} {value!r}"
        )
    return jnp.asarray(value, jnp.float32)


def stored_perm(perm: Any, axis: Any, shape: tuple[int, ...]) -> tuple[Any, int]:
    nd = len(shape)
    if not is_int(axis) or not -nd <= axis < nd:
        raise ValueError(
            f"perm_axis: expected the permuted axis of codes of shape {shape} (an int from "
            f"{-nd} to {nd - 1}), got {axis!r}"
        )
    axis = int(axis) - nd if axis >= 0 else int(axis)
    if not is_array(perm) or np.dtype(perm.dtype).kind not in "iu" or np.ndim(perm) != 1:
        raise TypeError(f"perm: expected a 1-D integer array, got {perm!r:.80}")
    if not isinstance(perm, jax.core.Tracer):
        p = np.asarray(perm)
        if p.shape != (shape[axis],) or not np.array_equal(np.sort(p), np.arange(len(p))):
            raise ValueError(
                f"perm: expected a permutation of range({shape[axis]}) (axis {axis}), got "
                f"{len(p)} entries that are not one"
            )
    return jnp.asarray(perm, jnp.int32), axis


def as_format_array(raw: jax.Array, f: Format) -> jax.Array:
    return codecs.from_codes(jnp.asarray(raw), f)


def logical_dtype(dtype: DTypeLike) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dt.name}")
    return dt


def scale_format_of(
    scales: jax.Array | np.ndarray, arg: str, scale_fmt: FormatLike | None = None
) -> Format:
    """The scale format of ``from_parts``' ``scales``: ``scale_fmt`` when given (checked
    against the array: its dtype, or uint8 codes for a format without one), else the
    array's dtype, which must be one of ``SCALE_FORMATS``."""
    if not is_array(scales):
        raise TypeError(f"{arg}: expected an array or a QArray, got {type(scales).__name__}")
    name = np.dtype(scales.dtype).name
    if scale_fmt is not None:
        sf = scale_format(scale_fmt, "scale_fmt")
        if np.dtype(scales.dtype) != sf.dtype:
            raise ValueError(
                f"{arg}: dtype {name} does not hold {sf.name} scales; expected "
                f"{sf.dtype.name}" + ("" if sf.has_dtype else " codes")
            )
        return sf
    if name not in SCALE_FORMATS:
        hint = "; pass scale_fmt= for the codes of a scale format without a dtype"
        raise ValueError(
            f"{arg}: dtype {name} is not a scale format; accepted: {SCALE_FORMATS}"
            + (hint if name == "uint8" else "")
        )
    return formats.get(name)


def full_block(block: Iterable[int], shape: tuple[int, ...], arg: str) -> tuple[int, ...]:
    try:
        b = tuple(operator.index(v) for v in block)
    except TypeError:
        raise TypeError(f"{arg}: expected a sequence of ints, got {block!r}") from None
    if len(b) != len(shape) or any(v < 1 for v in b):
        raise ValueError(
            f"{arg}: expected {len(shape)} positive block lengths for shape {shape}, got {b}"
        )
    return tuple(min(v, n) if n else v for v, n in zip(b, shape, strict=True))
