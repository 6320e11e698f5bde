"""GGUF files, read as stored: :func:`read_gguf` returns each tensor by name, a quantized
one as :class:`~emulate.importers.stored.StoredParts` (its blocks parsed by emulate, not
dequantized), a plain one (F32, F16, BF16, F64, I8 ... I64) as a numpy array;
:func:`to_qarray` turns parts into an :class:`emulate.QArray`, and :func:`load_gguf` does
both in one call.

The file is read with the ``gguf`` package's ``GGUFReader`` (the optional extra:
``pip install "emulate[gguf]"``); the decoding is emulate's own. GGUF lists a tensor's dims
fastest first (``ne0`` is the row length): the shapes here are numpy's, the dims reversed,
so a linear layer's weight of ``in_features`` columns has shape ``(out_features,
in_features)`` with blocks along its last axis.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.typing import DTypeLike

from emulate.importers import as_qarray
from emulate.importers.ggml import TYPES, check_layout, parse_blocks
from emulate.importers.stored import StoredParts
from emulate.quantized.array import QArray

__all__ = ["GGUFFile", "load_gguf", "read_gguf", "to_qarray"]

#: GGML types read as plain arrays, with the numpy dtype of their elements.
PLAIN_TYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
}
_EXTRA = 'reading GGUF files needs the gguf package: pip install "emulate[gguf]"'


@dataclasses.dataclass(frozen=True, eq=False)
class GGUFFile:
    """What :func:`read_gguf` read from one file.

    Attributes:
      path: the file.
      tensors: name -> :class:`StoredParts` (quantized) or numpy array (plain), in file order.
      types: name -> GGML type name (``"Q4_K"``, ``"F32"``, ...).
      metadata: the key-value fields (``"general.architecture"``, ``"llama.block_count"``,
        ...): strings, numbers, and lists of them.
    """

    path: str
    tensors: dict[str, StoredParts | np.ndarray]
    types: dict[str, str]
    metadata: dict[str, Any]

    def summary(self) -> str:
        """One line per tensor: name, GGML type, numpy shape and bits an element."""
        lines = []
        for name, t in self.tensors.items():
            bits = t.bits_per_element if isinstance(t, StoredParts) else 8 * t.dtype.itemsize
            lines.append(f"{name}: {self.types[name]} {tuple(t.shape)} {bits:g} bits/element")
        return "\n".join(lines)

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {t}" for t, n in Counter(self.types.values()).items())
        return f"GGUFFile({self.path!r}, {len(self.tensors)} tensors: {counts})"


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise ImportError(_EXTRA) from e


def _tensor_info(field: Any) -> tuple[str, list[int], int]:
    """(name, GGUF dims, raw type) of a tensor-info field of GGUFReader."""
    _, name, _, dims, raw_type = field.parts[:5]
    return bytes(name).decode("utf-8", "replace"), [int(d) for d in dims], int(raw_type[0])


def _check_tensor_info(field: Any, known: dict[int, str]) -> None:
    name, dims, raw_type = _tensor_info(field)
    if raw_type not in known:
        raise ValueError(
            f"tensor {name!r}: type {raw_type} is not a GGML type; expected one of "
            f"{', '.join(TYPES + tuple(PLAIN_TYPES))}"
        )
    type_name = known[raw_type]
    if type_name not in PLAIN_TYPES:
        check_layout(type_name, tuple(reversed(dims)), name=name)


def _open(path: str) -> Any:
    """A GGUFReader of ``path`` that checks each tensor's type and shape before gguf reads
    its data (gguf's own errors do not name the tensor)."""
    _require_gguf()
    from gguf import GGMLQuantizationType, GGUFReader

    known = {t.value: t.name for t in GGMLQuantizationType}

    class CheckedReader(GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            for field in fields:
                _check_tensor_info(field, known)
            super()._build_tensors(start_offs, fields)

    try:
        return CheckedReader(path)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _metadata(reader: Any) -> dict[str, Any]:
    return {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }


def _read_tensor(tensor: Any) -> tuple[str, StoredParts | np.ndarray]:
    type_name = tensor.tensor_type.name
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    if type_name in PLAIN_TYPES:
        raw = np.ascontiguousarray(tensor.data).reshape(-1).view(np.uint8)
        return type_name, raw.view(PLAIN_TYPES[type_name]).reshape(shape).copy()
    return type_name, parse_blocks(np.array(tensor.data), type_name, shape, name=tensor.name)


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Read every tensor of a GGUF file as stored.

    Args:
      path: a GGUF file (little-endian, as llama.cpp writes them).

    Returns:
      A :class:`GGUFFile`: quantized tensors as :class:`StoredParts` (types Q4_0, Q4_1,
      Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4), plain ones
      (F32, F16, BF16, F64, I8, I16, I32, I64) as numpy arrays, shapes in numpy order.

    Raises:
      ImportError: the ``gguf`` package is missing (``pip install "emulate[gguf]"``).
      ValueError: starting with the path and naming the tensor and the field: a type
        emulate does not read (IQ2_XXS, TQ1_0, ...) or no GGML type at all, rows that are
        not whole blocks; also a big-endian file or one gguf cannot parse.
    """
    path = os.fspath(path)
    reader = _open(path)
    if reader.byte_order != "I":
        raise ValueError(f"{path}: a big-endian GGUF file; emulate reads little-endian ones")
    tensors: dict[str, StoredParts | np.ndarray] = {}
    types: dict[str, str] = {}
    for tensor in reader.tensors:
        try:
            types[tensor.name], tensors[tensor.name] = _read_tensor(tensor)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return GGUFFile(path, tensors, types, _metadata(reader))


def to_qarray(parts: StoredParts, *, dtype: DTypeLike = jnp.float32) -> QArray:
    """A QArray holding ``parts`` as stored (:func:`emulate.importers.as_qarray.to_qarray`,
    the one conversion every importer uses): codes packed at their own width, scales and
    offsets per block along the last axis (two-level ones as QArrays of their integer
    codes with the super-block f16 as block scale), the implicit zero point and the
    codebook. The QArray has the parts' shape: for a linear layer's weight, GGUF's
    ``(out_features, in_features)`` with blocks along ``in_features``, so ``x @ q.T``.

    Args:
      parts: what :func:`read_gguf` or ``ggml.parse_blocks`` returned.
      dtype: the QArray's logical dtype (what dequantize returns; float32 by default, in
        which dequantizing reproduces ggml's float32 decode).

    Raises:
      ValueError: an MXFP4 tensor with a scale byte 255 (see above).
    """
    scales = parts.scales
    if isinstance(scales, np.ndarray) and scales.dtype == ml_dtypes.float8_e8m0fnu:
        if (scales.view(np.uint8) == 255).any():
            raise ValueError(
                f"tensor {parts.name!r}: scales hold the e8m0 byte 255, which ggml reads as "
                "2**128 and an OCP scale as NaN; emulate does not guess between them"
            )
    return as_qarray.to_qarray(dataclasses.replace(parts, dtype=np.dtype(dtype).name))


def load_gguf(path: str | os.PathLike[str], *, dtype: DTypeLike = jnp.float32) -> dict[str, Any]:
    """Every tensor of a GGUF file in one call: quantized ones as :class:`emulate.QArray`
    (:func:`to_qarray`, logical dtype ``dtype``), plain ones as JAX arrays of their stored
    dtype; names and order as in the file.

    Raises:
      ImportError, ValueError: as :func:`read_gguf` and :func:`to_qarray`.
    """
    read = read_gguf(path)
    return {
        name: to_qarray(t, dtype=dtype) if isinstance(t, StoredParts) else jnp.asarray(t)
        for name, t in read.tensors.items()
    }
