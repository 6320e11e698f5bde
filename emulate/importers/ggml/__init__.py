"""GGML tensors from their raw block bytes: :func:`parse_blocks` returns a
:class:`~emulate.importers.stored.StoredParts` in logical element order, with scales,
offsets and tables as stored.

Types read: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (``ggml.legacy``), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
(``ggml.kquants``), IQ4_NL, IQ4_XS and MXFP4 (``ggml.iq``); the modules' docstrings give
each block layout and formula. Pure numpy; nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from emulate.importers.ggml.blocks import BLOCKS
from emulate.importers.ggml.iq import KVALUES_IQ4NL, parse_iq4_nl, parse_iq4_xs, parse_mxfp4
from emulate.importers.ggml.kquants import (
    parse_q2_k,
    parse_q3_k,
    parse_q4_k,
    parse_q5_k,
    parse_q6_k,
)
from emulate.importers.ggml.legacy import parse_q4_0, parse_q4_1, parse_q5_0, parse_q5_1, parse_q8_0
from emulate.importers.stored import StoredParts

__all__ = [
    "BLOCKS",
    "KVALUES_IQ4NL",
    "TYPES",
    "check_layout",
    "parse_blocks",
    "stored_bits_per_element",
]

_PARSERS: dict[str, Callable[[np.ndarray, str], StoredParts]] = {
    "Q4_0": parse_q4_0,
    "Q4_1": parse_q4_1,
    "Q5_0": parse_q5_0,
    "Q5_1": parse_q5_1,
    "Q8_0": parse_q8_0,
    "Q2_K": parse_q2_k,
    "Q3_K": parse_q3_k,
    "Q4_K": parse_q4_k,
    "Q5_K": parse_q5_k,
    "Q6_K": parse_q6_k,
    "IQ4_NL": parse_iq4_nl,
    "IQ4_XS": parse_iq4_xs,
    "MXFP4": parse_mxfp4,
}

#: The GGML type names emulate reads, in ggml's order.
TYPES: tuple[str, ...] = tuple(_PARSERS)


def stored_bits_per_element(ggml_type: str) -> float:
    """Bits an element of ``ggml_type`` as GGML stores it (block bytes * 8 / block size)."""
    block_size, type_size = BLOCKS[ggml_type]
    return 8 * type_size / block_size


def check_layout(ggml_type: str, shape: Sequence[int], *, name: str = "tensor") -> tuple[int, ...]:
    """Check that emulate reads ``ggml_type`` and that ``shape``'s rows are whole blocks.

    Returns:
      ``shape`` as a tuple of ints.

    Raises:
      ValueError: naming the tensor and the field (``type`` or ``shape``) and what is
        accepted.
    """
    if ggml_type not in _PARSERS:
        raise ValueError(
            f"tensor {name!r}: type {ggml_type!r} is not a GGML type emulate reads; "
            f"expected one of {', '.join(TYPES)}"
        )
    dims = _checked_shape(shape, name)
    block_size = BLOCKS[ggml_type][0]
    if dims[-1] % block_size:
        raise ValueError(
            f"tensor {name!r}: shape {dims} has rows of {dims[-1]} elements; {ggml_type} "
            f"rows must be a multiple of its block of {block_size} elements"
        )
    return dims


def parse_blocks(
    data: np.ndarray | bytes, ggml_type: str, shape: Sequence[int], *, name: str = "tensor"
) -> StoredParts:
    """The parts of one GGML tensor, from its block bytes.

    Args:
      data: the tensor's bytes as stored (a uint8 array of any shape, or ``bytes``): its
        rows one after another, each row ``shape[-1] / block_size`` blocks.
      ggml_type: a name in :data:`TYPES` (``"Q4_K"``, ...).
      shape: the logical numpy shape (GGUF's dims reversed): rows along the last axis.
      name: the tensor's name, for error messages and the parts.

    Returns:
      A :class:`~emulate.importers.stored.StoredParts` of shape ``shape``: codes one per
      element in logical order, per-block arrays of shape ``(*shape[:-1], shape[-1] //
      block)``, blocks along the last axis (``k_axis = -1``), ``dtype`` float32.

    Raises:
      TypeError: ``data`` is not uint8 bytes.
      ValueError: naming the tensor and the field: an unknown type, a shape whose rows are
        not whole blocks, or a byte count that does not match the shape.
    """
    shape = check_layout(ggml_type, shape, name=name)
    block_size, type_size = BLOCKS[ggml_type]
    raw = _as_bytes(data, name)
    n_blocks = math.prod(shape) // block_size
    if raw.size != n_blocks * type_size:
        raise ValueError(
            f"tensor {name!r}: data holds {raw.size} bytes; a {ggml_type} tensor of shape "
            f"{shape} needs {n_blocks * type_size} ({n_blocks} blocks of {type_size} bytes)"
        )
    parts = _PARSERS[ggml_type](raw.reshape(n_blocks, type_size), name)
    return _to_rows(parts, shape)


def _checked_shape(shape: Sequence[int], name: str) -> tuple[int, ...]:
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else ()
    if not dims or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in dims
    ):
        raise ValueError(
            f"tensor {name!r}: shape {shape!r} is not a shape; expected a tuple of one or "
            "more positive ints (the logical numpy shape, rows along the last axis)"
        )
    return tuple(int(d) for d in dims)


def _as_bytes(data: np.ndarray | bytes, name: str) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, np.uint8)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        what = f"dtype {data.dtype}" if isinstance(data, np.ndarray) else type(data).__name__
        raise TypeError(
            f"tensor {name!r}: data is {what}; expected the block bytes as a uint8 array or bytes"
        )
    return np.ascontiguousarray(data).reshape(-1)


def _rows(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return x.reshape(*shape[:-1], -1)


def _row_blocks(block_shape: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (len(shape) - 1) + block_shape[-1:]


def _per_row(part: object, shape: tuple[int, ...]) -> np.ndarray | StoredParts:
    """A block-major scale or offset part (an array or a two-level record) reshaped to
    the tensor's rows."""
    if isinstance(part, StoredParts):
        return dataclasses.replace(
            part,
            codes=_rows(part.codes, shape),
            scales=_rows(np.asarray(part.scales), shape),
            block_shape=_row_blocks(part.block_shape, shape),
        )
    return _rows(np.asarray(part), shape)


def _to_rows(parts: StoredParts, shape: tuple[int, ...]) -> StoredParts:
    """``parts`` with its block-major arrays reshaped to the tensor's rows."""
    return dataclasses.replace(
        parts,
        codes=parts.codes.reshape(shape),
        block_shape=_row_blocks(parts.block_shape, shape),
        scales=_per_row(parts.scales, shape),
        offsets=None if parts.offsets is None else _per_row(parts.offsets, shape),
    )
