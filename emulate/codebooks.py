"""Codebook element formats: a table of ``2**bits`` values that unsigned codes index.

A :class:`emulate.QArray` with a ``codebook`` reads element ``i`` as ``codebook[codes[i]]``
(instead of the element format's own decoding), then applies its zero points, scales and
offsets as usual. Built in:

- :data:`NF4`: bitsandbytes' 4-bit NormalFloat table (16 float32 values in [-1, 1];
  the values of ``nf4_dequantization_lut`` in bitsandbytes ``csrc/kernels.cu``).
- :data:`IQ4_NL`: ggml's non-linear 4-bit table (16 int8 values, ``kvalues_iq4nl`` in
  ggml ``ggml-common.h``), used by GGUF IQ4_NL and IQ4_XS.

A user table is any 1-D array of 2, 4, ..., 256 entries of an integer dtype (int8, uint8,
int16, int32) or a float dtype (float32, bfloat16, float16): :func:`codebook` turns it into
a hashable :class:`Codebook`, which a QArray keeps as static data (the table is a
constant of every program that reads it: it is not split by ``vmap`` over experts, nor
sliced by a sharding, and a checkpoint stores it once per tensor as its metadata).
Nothing here needs JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["CODEBOOK_DTYPES", "IQ4_NL", "NF4", "Codebook", "codebook"]

#: The dtypes a codebook's entries may have.
CODEBOOK_DTYPES = ("int8", "uint8", "int16", "int32", "float32", "bfloat16", "float16")

#: The built-in tables (filled below), whose name a table of equal entries takes.
_BUILT_IN: list[Codebook] = []


@dataclasses.dataclass(frozen=True, eq=False)
class Codebook:
    """A table of ``2**bits`` values, hashable (a QArray's static part).

    Two codebooks are equal when their tables are: the same dtype and the same entries,
    bit for bit (a NaN entry equals a NaN of the same bits; 0.0 and -0.0 differ); the
    ``name`` is a label, not compared. The hash agrees with that equality.

    Attributes:
      values: the entries as Python numbers (ints for an integer table; floats holding
        the exact values of a float table's dtype).
      dtype_name: the entries' dtype, one of ``CODEBOOK_DTYPES``.
      name: a label shown by ``repr`` and ``emulate.inspect`` ("NF4", "IQ4_NL", or
        "table" for a user table).
    """

    values: tuple[float, ...] | tuple[int, ...]
    dtype_name: str
    name: str = "table"

    @property
    def bits(self) -> int:
        """The code width: ``log2(len(values))``."""
        return int(math.log2(len(self.values)))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(getattr(ml_dtypes, self.dtype_name, None) or self.dtype_name)

    @property
    def is_integer(self) -> bool:
        return self.dtype.kind in "iu"

    def array(self) -> np.ndarray:
        """The table as a numpy array of its dtype."""
        return np.asarray(self.values, np.float64 if not self.is_integer else np.int64).astype(
            self.dtype
        )

    @property
    def shape(self) -> tuple[int]:
        return (len(self.values),)

    def __len__(self) -> int:
        return len(self.values)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.array()
        return a if dtype is None else a.astype(dtype)

    @property
    def max_abs(self) -> float:
        """The largest magnitude in the table (NaN entries ignored)."""
        finite = [abs(float(v)) for v in self.values if not math.isnan(float(v))]
        return max(finite, default=0.0)

    @property
    def nbytes(self) -> int:
        return len(self.values) * self.dtype.itemsize

    def _key(self) -> tuple[str, bytes]:
        return self.dtype_name, self.array().tobytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Codebook):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Codebook({self.name}, {len(self.values)} x {self.dtype_name})"


def codebook(table: Any, *, name: str = "table", arg: str = "codebook") -> Codebook:
    """A :class:`Codebook` from a Codebook (returned as it is) or a 1-D array of ``2**b``
    entries (``1 <= b <= 8``) of one of ``CODEBOOK_DTYPES``.

    Raises:
      TypeError: ``table`` is not an array or Codebook, or of another dtype.
      ValueError: not 1-D, or its length is not a power of two from 2 to 256.
    """
    if isinstance(table, Codebook):
        return table
    if not hasattr(table, "shape") or not hasattr(table, "dtype"):
        raise TypeError(
            f"{arg}: expected a 1-D array of 2**bits entries or an emulate.codebooks.Codebook, "
            f"got {type(table).__name__}"
        )
    dt = np.dtype(table.dtype)
    if dt.name not in CODEBOOK_DTYPES:
        raise TypeError(f"{arg}: dtype {dt.name} is not accepted; accepted: {CODEBOOK_DTYPES}")
    arr = np.asarray(table)
    n = arr.shape[0] if arr.ndim == 1 else -1
    if arr.ndim != 1 or n < 2 or n > 256 or n & (n - 1):
        raise ValueError(
            f"{arg}: expected a 1-D table of 2, 4, ..., 256 entries (2**bits), got shape "
            f"{arr.shape}"
        )
    if dt.kind in "iu":
        values: tuple[Any, ...] = tuple(int(v) for v in arr.astype(np.int64))
    else:
        values = tuple(float(v) for v in arr.astype(np.float64))
    out = Codebook(values, dt.name, name)
    # the table of a built-in keeps the built-in's name (NF4's values read as "NF4")
    return next((b for b in _BUILT_IN if b == out), out) if name == "table" else out


NF4 = codebook(
    np.array(
        [
            -1.0,
            -0.6961928009986877,
            -0.5250730514526367,
            -0.39491748809814453,
            -0.28444138169288635,
            -0.18477343022823334,
            -0.09105003625154495,
            0.0,
            0.07958029955625534,
            0.16093020141124725,
            0.24611230194568634,
            0.33791524171829224,
            0.44070982933044434,
            0.5626170039176941,
            0.7229568362236023,
            1.0,
        ],
        np.float32,
    ),
    name="NF4",
)

IQ4_NL = codebook(
    np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8),
    name="IQ4_NL",
)

_BUILT_IN.extend([NF4, IQ4_NL])
