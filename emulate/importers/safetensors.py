"""Quantized weights from safetensors checkpoints, one call per convention, kept as stored.

``read_<convention>(path, prefix, ...)`` returns the layer's
:class:`~emulate.importers.stored.StoredParts` (numpy, logical ``(..., K, N)``
order, ``.source`` naming what was read); ``load_<convention>`` the same as an
``emulate.QArray`` (:func:`emulate.importers.as_qarray.to_qarray`) in the checkpoint's
``(..., out, in)`` orientation, as every importer returns its QArrays (``load_gguf``,
:func:`load_safetensors`; ``layout="in_out"`` gives ``(..., in, out)``, for ``x @ q``),
logging what it read to the ``emulate.importers`` logger. ``path`` is one
``.safetensors`` file or a directory of them (a sharded checkpoint); ``prefix`` the layer's name
(``"model.layers.0.mlp.up_proj"``). :func:`load_safetensors` reads a whole checkpoint in
one call (every quantized layer of the config's ``quant_method``, and the plain tensors).

Settings: ``config`` is a mapping (a ``quantization_config``, or a whole ``config.json``
holding one), a path to a JSON file, or None to read the ones beside the checkpoint:
``config.json``'s ``quantization_config``, else the project's own file
(``quant_config.json``, ``quantize_config.json``, ``hf_quant_config.json``). Nothing is
guessed: a missing or unknown setting is a ValueError naming it.

Tensors are read with the ``safetensors`` package (``pip install "emulate[safetensors]"``);
its numpy API cannot hold bfloat16 or float8 tensors, so those are read as raw bytes at
the offsets of the file's header and viewed as ml_dtypes arrays.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from emulate.importers.conventions.bnb import parse_bnb_4bit
from emulate.importers.conventions.floats import (
    parse_compressed_fp4,
    parse_fp8_blocks,
    parse_gpt_oss_mxfp4,
    parse_modelopt_nvfp4,
)
from emulate.importers.conventions.integer import parse_awq, parse_compressed_int, parse_gptq
from emulate.importers.stored import StoredParts
from emulate.quantized.array import QArray

__all__ = [
    "SafetensorsCheckpoint",
    "read_awq",
    "read_gptq",
    "read_compressed_tensors",
    "read_gpt_oss_mxfp4",
    "read_fp8_blocks",
    "read_modelopt_nvfp4",
    "read_bnb_4bit",
    "load_awq",
    "load_gptq",
    "load_compressed_tensors",
    "load_gpt_oss_mxfp4",
    "load_fp8_blocks",
    "load_modelopt_nvfp4",
    "load_bnb_4bit",
    "load_safetensors",
]

#: ``load_*`` log what they read (convention, tensors, bits an element) here, at INFO.
LOG = logging.getLogger("emulate.importers")

#: safetensors dtype names -> numpy / ml_dtypes dtypes.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
_RAW = {"BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"}  # not held by safetensors' numpy API


def _safe_open() -> Any:
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError(
            "reading safetensors checkpoints needs the safetensors package: "
            'pip install "emulate[safetensors]"'
        ) from None
    return safe_open


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the offset where its data starts."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return header, 8 + length


class SafetensorsCheckpoint(Mapping[str, np.ndarray]):
    """The tensors of one ``.safetensors`` file, or of every such file in a directory, as
    a read-only mapping from name to numpy array, read lazily."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        if not files or not all(f.is_file() for f in files):
            raise ValueError(
                f"path: {str(p)!r} is not a .safetensors file or a directory holding some"
            )
        safe_open = _safe_open()
        self.path = p
        self._where: dict[str, tuple[Path, dict[str, Any], int]] = {}
        for f in files:
            with safe_open(str(f), framework="numpy") as handle:  # validates the file
                keys = list(handle.keys())
            header, start = _header(f)
            for key in keys:
                if key in self._where:
                    raise ValueError(
                        f"{key}: tensor is in both {self._where[key][0].name} and {f.name}; "
                        "expected one"
                    )
                self._where[key] = (f, header[key], start)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise KeyError(name)
        f, info, start = self._where[name]
        dtype = info["dtype"]
        if dtype not in DTYPES:
            raise ValueError(f"{name}: dtype is {dtype}; expected one of {sorted(DTYPES)}")
        if dtype not in _RAW:
            with _safe_open()(str(f), framework="numpy") as handle:
                return np.asarray(handle.get_tensor(name))
        begin, end = info["data_offsets"]
        with open(f, "rb") as fh:
            fh.seek(start + begin)
            raw = fh.read(end - begin)
        return np.frombuffer(raw, dtype=DTYPES[dtype].newbyteorder("<")).reshape(info["shape"])

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def _config(path: str | os.PathLike[str], given: Any, own: tuple[str, ...]) -> Mapping[str, Any]:
    """The quantization settings: ``given`` (mapping or JSON path) or the files beside
    ``path`` (``config.json``'s ``quantization_config``, then the project's ``own``)."""
    if given is None:
        p = Path(path)
        folder = p if p.is_dir() else p.parent
        for name in ("config.json", *own):
            if (folder / name).is_file():
                given = folder / name
                break
        else:
            raise ValueError(
                f"config: no quantization settings beside {str(path)!r} (looked for "
                f"{['config.json', *own]}); pass config= (the quantization_config)"
            )
    if isinstance(given, (str, os.PathLike)):
        with open(given) as f:
            given = json.load(f)
    if not isinstance(given, Mapping):
        raise TypeError(
            f"config: expected a mapping or a JSON file path, got {type(given).__name__}"
        )
    for key in ("quantization_config", "quantization"):
        if isinstance(given.get(key), Mapping):
            return given[key]
    return given


def read_awq(path: str | os.PathLike[str], prefix: str, *, config: Any = None) -> StoredParts:
    """AutoAWQ GEMM int4 (``qweight``, ``qzeros``, ``scales``) as stored."""
    return parse_awq(
        SafetensorsCheckpoint(path), prefix, _config(path, config, ("quant_config.json",))
    )


def read_gptq(path: str | os.PathLike[str], prefix: str, *, config: Any = None) -> StoredParts:
    """GPTQ v1/v2 (``qweight``, ``qzeros``, ``scales``, ``g_idx``) as stored."""
    return parse_gptq(
        SafetensorsCheckpoint(path), prefix, _config(path, config, ("quantize_config.json",))
    )


def read_compressed_tensors(
    path: str | os.PathLike[str], prefix: str, *, config: Any = None
) -> StoredParts:
    """compressed-tensors ``pack-quantized`` (int), ``nvfp4-pack-quantized`` or
    ``mxfp4-pack-quantized`` weights as stored (the config's ``format`` picks)."""
    cfg = _config(path, config, ())
    tensors = SafetensorsCheckpoint(path)
    if cfg.get("format") in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        return parse_compressed_fp4(tensors, prefix, cfg)
    return parse_compressed_int(tensors, prefix, cfg)


def read_gpt_oss_mxfp4(path: str | os.PathLike[str], prefix: str) -> StoredParts:
    """gpt-oss MXFP4 experts (``{prefix}_blocks``, ``{prefix}_scales``) as stored."""
    return parse_gpt_oss_mxfp4(SafetensorsCheckpoint(path), prefix)


def read_fp8_blocks(
    path: str | os.PathLike[str], prefix: str, *, config: Any = None, dtype: str = "bfloat16"
) -> StoredParts:
    """FP8 e4m3 with ``weight_scale_inv`` blocks (DeepSeek-V3) as stored."""
    return parse_fp8_blocks(
        SafetensorsCheckpoint(path), prefix, _config(path, config, ()), dtype=dtype
    )


def read_modelopt_nvfp4(
    path: str | os.PathLike[str], prefix: str, *, config: Any = None, dtype: str = "bfloat16"
) -> StoredParts:
    """NVIDIA modelopt NVFP4 (``weight``, ``weight_scale``, ``weight_scale_2``) as stored."""
    cfg = _config(path, config, ("hf_quant_config.json",))
    return parse_modelopt_nvfp4(SafetensorsCheckpoint(path), prefix, cfg, dtype=dtype)


def read_bnb_4bit(path: str | os.PathLike[str], prefix: str) -> StoredParts:
    """bitsandbytes NF4/FP4 ``Linear4bit`` weights (double quantization too) as stored."""
    return parse_bnb_4bit(SafetensorsCheckpoint(path), prefix)


#: The orientations a loader returns: ``"out_in"`` (the checkpoint's ``(..., out, in)``,
#: every loader's default) or ``"in_out"`` (``(..., in, out)``: ``x @ q`` directly).
_LAYOUTS = ("out_in", "in_out")


def _qarray(parts: StoredParts, layout: str = "out_in") -> QArray:
    """The QArray of ``parts`` (logical ``(..., K, N)``) in ``layout``: codes, scales and
    per-block parts moved for ``"out_in"``, nothing decoded."""
    from emulate.importers.as_qarray import to_qarray
    from emulate.quantized.array import transpose

    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected 'out_in' or 'in_out', got {layout!r}")
    LOG.info("read %s (%.3f bits an element)", parts.source, parts.bits_per_element)
    q = to_qarray(parts)
    if layout == "in_out":
        return q
    return transpose(q, (*range(q.ndim - 2), q.ndim - 1, q.ndim - 2))  # (..., N, K)


def load_awq(
    path: str | os.PathLike[str], prefix: str, *, config: Any = None, layout: str = "out_in"
) -> QArray:
    """:func:`read_awq` as an ``emulate.QArray``,
    ``(out, in)`` (``layout="in_out"``: ``(in, out)``)."""
    return _qarray(read_awq(path, prefix, config=config), layout)


def load_gptq(
    path: str | os.PathLike[str], prefix: str, *, config: Any = None, layout: str = "out_in"
) -> QArray:
    """:func:`read_gptq` as an ``emulate.QArray``,
    ``(out, in)`` (``layout="in_out"``: ``(in, out)``)."""
    return _qarray(read_gptq(path, prefix, config=config), layout)


def load_compressed_tensors(
    path: str | os.PathLike[str], prefix: str, *, config: Any = None, layout: str = "out_in"
) -> QArray:
    """:func:`read_compressed_tensors` as an ``emulate.QArray``,
    ``(out, in)`` (``layout="in_out"``: ``(in, out)``)."""
    return _qarray(read_compressed_tensors(path, prefix, config=config), layout)


def load_gpt_oss_mxfp4(
    path: str | os.PathLike[str], prefix: str, *, layout: str = "out_in"
) -> QArray:
    """:func:`read_gpt_oss_mxfp4` as an ``emulate.QArray``,
    ``(out, in)`` (``layout="in_out"``: ``(in, out)``)."""
    return _qarray(read_gpt_oss_mxfp4(path, prefix), layout)


def load_fp8_blocks(
    path: str | os.PathLike[str],
    prefix: str,
    *,
    config: Any = None,
    dtype: str = "bfloat16",
    layout: str = "out_in",
) -> QArray:
    """:func:`read_fp8_blocks` as an ``emulate.QArray``,
    ``(out, in)`` (``layout="in_out"``: ``(in, out)``)."""
    return _qarray(read_fp8_blocks(path, prefix, config=config, dtype=dtype), layout)


def load_modelopt_nvfp4(
    path: str | os.PathLike[str],
    prefix: str,
    *,
    config: Any = None,
    dtype: str = "bfloat16",
    layout: str = "out_in",
) -> QArray:
    """:func:`read_modelopt_nvfp4` as an ``emulate.QArray``,
    ``(out, in)`` (``layout="in_out"``: ``(in, out)``)."""
    return _qarray(read_modelopt_nvfp4(path, prefix, config=config, dtype=dtype), layout)


def load_bnb_4bit(path: str | os.PathLike[str], prefix: str, *, layout: str = "out_in") -> QArray:
    """:func:`read_bnb_4bit` as an ``emulate.QArray``,
    ``(out, in)`` (``layout="in_out"``: ``(in, out)``)."""
    return _qarray(read_bnb_4bit(path, prefix), layout)


#: quant_method -> (the suffix that marks a quantized layer, the suffixes its reader
#: consumes, the parser): the conventions :func:`load_safetensors` reads whole.
_WHOLE: dict[str, tuple[str, tuple[str, ...], Any]] = {
    "awq": (".qweight", (".qweight", ".qzeros", ".scales"), parse_awq),
    "gptq": (".qweight", (".qweight", ".qzeros", ".scales", ".g_idx"), parse_gptq),
    "fp8": (".weight_scale_inv", (".weight", ".weight_scale_inv"), parse_fp8_blocks),
    "compressed-tensors": (
        ".weight_packed",
        (
            ".weight_packed",
            ".weight_shape",
            ".weight_scale",
            ".weight_zero_point",
            ".weight_g_idx",
        ),
        parse_compressed_int,
    ),
}


def load_safetensors(path: str | os.PathLike[str], *, config: Any = None) -> dict[str, Any]:
    """Every tensor of a quantized safetensors checkpoint in one call, for
    ``emulate.flax.load_weights``.

    The config's ``quant_method`` names the convention: ``"awq"`` (AutoAWQ GEMM),
    ``"gptq"`` (v1/v2, act-order too), ``"fp8"`` (``weight_scale_inv`` blocks) or
    ``"compressed-tensors"`` (``pack-quantized`` integers). Each quantized layer (a name
    ending in ``.qweight``, ``.weight_scale_inv`` or ``.weight_packed``) becomes one
    QArray under ``{prefix}.weight``, as the unquantized checkpoint names it, in the
    checkpoint's ``(out_features, in_features)`` orientation (as :func:`load_awq` and its
    siblings return them by default: codes and scales moved, nothing decoded), so that
    ``load_weights``' default ``layout="out_in"`` applies to every tensor. Every other
    tensor (embeddings, norms, an unquantized ``lm_head``) is a JAX
    array of its stored dtype. Names are in file order.

    Args:
      path: a ``.safetensors`` file or a directory of them.
      config: as for :func:`read_awq` (None: the settings beside the checkpoint).

    Raises:
      ImportError: the ``safetensors`` package is missing.
      ValueError: a ``quant_method`` this function does not read whole (modelopt, bnb,
        gpt-oss MXFP4 checkpoints: use the per-layer ``load_*``), and every error of the
        convention's reader, naming the tensor and the field.
    """
    import jax.numpy as jnp

    tensors = SafetensorsCheckpoint(path)
    cfg = _config(path, config, ("quant_config.json", "quantize_config.json"))
    method = cfg.get("quant_method")
    if method not in _WHOLE:
        raise ValueError(
            f"config: quant_method is {method!r}; load_safetensors reads "
            f"{', '.join(map(repr, _WHOLE))} checkpoints whole (for the others, load each "
            "layer with load_modelopt_nvfp4, load_bnb_4bit or load_gpt_oss_mxfp4)"
        )
    marker, consumed, parse = _WHOLE[method]
    prefixes = [n[: -len(marker)] for n in tensors if n.endswith(marker)]
    taken = {p + s for p in prefixes for s in consumed}
    out: dict[str, Any] = {}
    for name in tensors:
        if name.endswith(marker):
            prefix = name[: -len(marker)]
            out[f"{prefix}.weight"] = _qarray(parse(tensors, prefix, cfg))  # (..., N, K)
        elif name not in taken:
            out[name] = jnp.asarray(tensors[name])
    return out
