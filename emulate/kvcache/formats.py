"""How a KV cache stores K and V: :class:`CacheFormat`, the named formats (:data:`FORMATS`)
and :func:`cache_format`, the one resolver of a format argument.

A cache format names the element format of the stored codes and where their scales live:

- ``"token"``: one float scale per (token, KV head), computed when the token is written
  (``absmax``: the head's largest magnitude over the element format's largest value);
- ``"head"``: one float32 scale per (layer, KV head), fixed when the cache is made (a
  calibrated scale, as vLLM's per-tensor and per-head fp8 caches keep): writing divides by
  it and saturates;
- ``"block"``: one scale per block of ``block`` elements along ``head_dim`` of each token
  (llama.cpp's q4_0 / q8_0 blocks, OCP MX blocks);
- None: no scale (bfloat16 values, the baseline).

The element values are rounded to nearest even and saturate at the format's largest
finite value: the rules of :func:`emulate.quantize` (docs/numerics.md, "Quantized KV
caches"), which :mod:`emulate.kvcache.writing` calls.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emulate import formats
from emulate.formats import Format

__all__ = ["FORMATS", "GRANULARITIES", "CacheFormat", "cache_format"]

#: Where a cache format's scales live (module docstring); None: no scales.
GRANULARITIES = ("token", "head", "block", None)

#: The scale formats a cache format may name, and the dtype each is stored in: float16
#: scales are kept as their bits (uint16), because Mosaic cannot load float16 arrays on
#: any TPU generation ("Invalid vector type for load"); e8m0 ones as their uint8 codes.
_SCALE_STORAGE = {"float32": np.float32, "float16": np.uint16, "float8_e8m0fnu": np.uint8}
#: The element formats the kernels decode: 8-bit codes one a byte, 4-bit codes two a byte.
_ELEMENTS = (
    "bfloat16",
    "int8",
    "float8_e4m3fn",
    "float8_e5m2",
    "int4",
    "float4_e2m1fn",
)


@dataclasses.dataclass(frozen=True)
class CacheFormat:
    """A KV cache's storage: element format, scale granularity and scale format.

    Attributes:
      name: the format's name (a key of :data:`FORMATS` for the named ones).
      element: the element format: ``"bfloat16"`` (no scales), ``"int8"``,
        ``"float8_e4m3fn"``, ``"float8_e5m2"`` (one code a byte), ``"int4"`` or
        ``"float4_e2m1fn"`` (two codes a byte, packed along tokens).
      granularity: ``"token"``, ``"head"``, ``"block"`` or None (module docstring).
      block: the block length along ``head_dim`` for ``"block"`` (it must divide
        ``head_dim``); None otherwise.
      scale_format: ``"float32"``, ``"float16"`` or ``"float8_e8m0fnu"``; None without
        scales. Per-head scales are float32.
      scale_rule: how a written token's scales are chosen: ``"absmax"`` or ``"ocp_floor"``
        (:func:`emulate.quantize`'s rules); None for per-head and unscaled formats.
      doc: one line for tables.

    Raises:
      ValueError: a field outside the values above, or fields that contradict each other.
    """

    name: str
    element: str
    granularity: str | None
    block: int | None = None
    scale_format: str | None = None
    scale_rule: str | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.element not in _ELEMENTS:
            raise ValueError(
                f"element: expected one of {', '.join(_ELEMENTS)}, got {self.element!r}"
            )
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity: expected one of {GRANULARITIES}, got {self.granularity!r}"
            )
        scaled = self.granularity is not None
        if (self.element == "bfloat16") == scaled:
            raise ValueError(
                f"granularity: a {self.element} cache "
                + ("stores no scales (granularity None)" if scaled else "needs scales")
            )
        if (self.granularity == "block") != (self.block is not None):
            raise ValueError(
                f"block: {self.block!r} with granularity {self.granularity!r}; a block length "
                "goes with granularity 'block' only"
            )
        if self.block is not None and (not isinstance(self.block, int) or self.block % 8):
            raise ValueError(f"block: expected a positive multiple of 8, got {self.block!r}")
        want_scale = {None: None, "head": "float32"}.get(self.granularity, self.scale_format)
        if self.scale_format != want_scale or (scaled and self.scale_format not in _SCALE_STORAGE):
            raise ValueError(
                f"scale_format: {self.scale_format!r} with granularity {self.granularity!r}; "
                f"per-token and block scales are one of {', '.join(_SCALE_STORAGE)}, per-head "
                "scales float32, unscaled caches None"
            )
        dynamic = self.granularity in ("token", "block")
        if dynamic != (self.scale_rule is not None) or self.scale_rule not in (
            None,
            "absmax",
            "ocp_floor",
        ):
            raise ValueError(
                f"scale_rule: {self.scale_rule!r} with granularity {self.granularity!r}; "
                "per-token and block scales take 'absmax' or 'ocp_floor', the others None"
            )
        if self.scale_rule == "absmax" and self.scale_format == "float8_e8m0fnu":
            raise ValueError("scale_rule: 'absmax' scales are not powers of two; e8m0 holds none")

    @property
    def element_format(self) -> Format:
        return formats.get(self.element)

    @property
    def bits(self) -> int:
        """Bits of one stored element (16, 8 or 4)."""
        return self.element_format.bits

    @property
    def packed(self) -> bool:
        """Whether two codes share a byte (4-bit elements)."""
        return self.bits == 4

    @property
    def code_dtype(self) -> np.dtype:
        """The dtype of the stored code arrays: the element's own for 8 and 16 bits (int8,
        float8_*, bfloat16), uint8 for two 4-bit codes a byte."""
        return np.dtype(np.uint8) if self.packed else self.element_format.dtype

    @property
    def scale_dtype(self) -> np.dtype | None:
        """The dtype the scales are stored in (float32, uint16 bits of float16, uint8
        codes of e8m0); None without scales."""
        s = self.scale_format
        return None if s is None else np.dtype(_SCALE_STORAGE[s])

    def blocks(self, head_dim: int) -> int:
        """Scales per (token, KV head): ``head_dim / block`` for block scales, else 1."""
        return head_dim // self.block if self.block else 1

    def check_head_dim(self, head_dim: int, arg: str = "head_dim") -> None:
        """ValueError naming ``arg`` unless ``head_dim`` is a positive multiple of 8 that
        the block length divides."""
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 8:
            raise ValueError(f"{arg}: expected a positive multiple of 8, got {head_dim!r}")
        if self.block and head_dim % self.block:
            raise ValueError(
                f"{arg}: {head_dim} is not a multiple of the {self.name} block of {self.block}"
            )

    def bytes_per_token(self, kv_heads: int, head_dim: int) -> float:
        """Stored bytes of one token of one layer, K and V with their scales."""
        codes = kv_heads * head_dim * self.bits / 8
        dt = self.scale_dtype
        scaled = self.granularity in ("token", "block") and dt is not None
        scales = kv_heads * self.blocks(head_dim) * dt.itemsize if dt is not None and scaled else 0
        return 2 * (codes + scales)


def _token(element: str, doc: str) -> CacheFormat:
    return CacheFormat(element, element, "token", None, "float32", "absmax", doc)


def _head(element: str) -> CacheFormat:
    doc = f"{element}, a fixed float32 scale per KV head"
    return CacheFormat(f"{element}_per_head", element, "head", None, "float32", None, doc)


#: The named cache formats.
FORMATS: dict[str, CacheFormat] = {
    f.name: f
    for f in (
        CacheFormat("bfloat16", "bfloat16", None, doc="bfloat16 values (the baseline)"),
        _token("int8", "int8, a float32 absmax scale per (token, KV head)"),
        _token("float8_e4m3fn", "float8_e4m3fn, a float32 absmax scale per (token, KV head)"),
        _token("float8_e5m2", "float8_e5m2, a float32 absmax scale per (token, KV head)"),
        _head("int8"),
        _head("float8_e4m3fn"),
        _head("float8_e5m2"),
        CacheFormat(
            "q8_0", "int8", "block", 32, "float16", "absmax", "int8, a float16 scale per 32"
        ),
        CacheFormat(
            "q4_0", "int4", "block", 32, "float16", "absmax", "int4, a float16 scale per 32"
        ),
        CacheFormat(
            "mxfp4",
            "float4_e2m1fn",
            "block",
            32,
            "float8_e8m0fnu",
            "ocp_floor",
            "float4_e2m1fn, an e8m0 scale per 32 (OCP MXFP4)",
        ),
    )
}


def cache_format(fmt: str | CacheFormat, arg: str = "format") -> CacheFormat:
    """``fmt`` as a :class:`CacheFormat`: a record, or the name of one of :data:`FORMATS`.

    Raises:
      TypeError: neither a name nor a record. ValueError: an unknown name.
    """
    if isinstance(fmt, CacheFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(
            f"{arg}: expected a cache format name or an emulate.kvcache.CacheFormat, got "
            f"{type(fmt).__name__}"
        )
    if fmt not in FORMATS:
        raise ValueError(f"{arg}: unknown cache format {fmt!r}; known: {', '.join(FORMATS)}")
    return FORMATS[fmt]
