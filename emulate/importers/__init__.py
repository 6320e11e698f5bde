"""Importers: quantized weights from other projects' files, kept as stored.

``emulate.importers.ggml`` parses GGML block bytes (GGUF tensors) into parts in logical
element order, in numpy alone; ``emulate.importers.gguf`` reads GGUF files with the
``gguf`` package (the optional extra ``emulate[gguf]``) and turns the parts into
:class:`emulate.QArray` records. ``emulate.importers.conventions`` parses the tensors of
safetensors checkpoints (AutoAWQ, GPTQ, compressed-tensors, gpt-oss MXFP4, FP8 blocks,
modelopt NVFP4, bitsandbytes) into parts, and ``emulate.importers.safetensors`` reads them
(the optional extra ``emulate[safetensors]``).

The one-call readers are re-exported here and imported on first use (they import JAX;
the block-layout modules stay numpy only): ``emulate.importers.load_gguf``,
``read_gguf``, ``GGUFFile`` (from :mod:`emulate.importers.gguf`), ``load_safetensors``,
``SafetensorsCheckpoint`` and ``read_<convention>`` / ``load_<convention>`` for
``awq``, ``gptq``, ``compressed_tensors``, ``gpt_oss_mxfp4``, ``fp8_blocks``,
``modelopt_nvfp4`` and ``bnb_4bit`` (from :mod:`emulate.importers.safetensors`).
"""

from typing import Any

_GGUF = ("GGUFFile", "load_gguf", "read_gguf")
_CONVENTIONS = (
    "awq",
    "gptq",
    "compressed_tensors",
    "gpt_oss_mxfp4",
    "fp8_blocks",
    "modelopt_nvfp4",
    "bnb_4bit",
)
_SAFETENSORS = (
    "SafetensorsCheckpoint",
    "load_safetensors",
    *(f"read_{c}" for c in _CONVENTIONS),
    *(f"load_{c}" for c in _CONVENTIONS),
)

__all__ = [*_GGUF, *_SAFETENSORS]


def __getattr__(name: str) -> Any:
    if name in _GGUF:
        from emulate.importers import gguf

        return getattr(gguf, name)
    if name in _SAFETENSORS:
        from emulate.importers import safetensors

        return getattr(safetensors, name)
    raise AttributeError(f"module 'emulate.importers' has no attribute {name!r}")
