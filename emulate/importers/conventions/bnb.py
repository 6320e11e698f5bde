"""bitsandbytes 4-bit weights (NF4 or FP4), with and without double quantization.

As ``Linear4bit`` saves them (bitsandbytes-foundation/bitsandbytes ``functional.py``
``QuantState.as_dict(packed=True)``, ``backends/default/ops.py``): ``{prefix}.weight``
uint8 ``(ceil(N*K/2), 1)`` holding the row-major ``(N, K)`` codes two per byte, element
``2i`` in the HIGH nibble of byte ``i``; ``{prefix}.weight.absmax`` one scale per
``blocksize`` consecutive elements of the flattened weight; ``{prefix}.weight.quant_map``
the 16-entry float32 table (NF4 or bitsandbytes' FP4); and
``{prefix}.weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``), the JSON of
``quant_type``, ``blocksize``, ``dtype``, ``shape`` and the nested settings, as uint8.
``W = quant_map[c] * absmax[block]`` in float32, cast to ``dtype``.

Double quantization: ``absmax`` is then uint8 codes into ``{prefix}.weight.nested_quant_map``
(the 256-entry dynamic map) with ``{prefix}.weight.nested_absmax`` float32 per
``nested_blocksize`` codes and the float ``nested_offset`` added after:
``absmax = nested_quant_map[a] * nested_absmax[block] + nested_offset`` (float32), kept as
nested :class:`~emulate.importers.stored.StoredParts`.

Blocks must be rectangular on the ``(N, K)`` weight (``blocksize`` divides K or K divides
``blocksize``); others are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from emulate.importers.conventions.readers import bad, flat_block, nibbles, tensor
from emulate.importers.stored import StoredParts

__all__ = ["parse_bnb_4bit", "QUANT_STATE_KEYS"]

#: The keys of bitsandbytes' packed quant state (plain, then nested).
QUANT_STATE_KEYS = ("quant_type", "blocksize", "dtype", "shape")
NESTED_KEYS = ("nested_blocksize", "nested_dtype", "nested_offset")
_DTYPES = ("bfloat16", "float16", "float32")


def _bits(*ts: np.ndarray) -> int:
    return sum(t.size * t.dtype.itemsize * 8 for t in ts)


def _quant_state(tensors: Mapping[str, Any], prefix: str) -> tuple[str, dict[str, Any]]:
    """The name and the parsed JSON of the one packed quant state of ``prefix``."""
    names = [f"{prefix}.weight.quant_state.bitsandbytes__{t}" for t in ("nf4", "fp4")]
    present = [n for n in names if n in tensors]
    if len(present) != 1:
        raise ValueError(
            f"{prefix}.weight: quant state is {'ambiguous' if present else 'missing'}; "
            f"expected exactly one of {names}"
        )
    name = present[0]
    raw = tensor(tensors, name, [np.uint8], 1)
    try:
        state = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(
            name, "contents", f"not JSON ({e})", "the JSON of bitsandbytes' quant state"
        ) from None
    if not isinstance(state, dict):
        raise bad(name, "contents", type(state).__name__, "a JSON object")
    nested = "nested_blocksize" in state
    want = set(QUANT_STATE_KEYS) | (set(NESTED_KEYS) if nested else set())
    if set(state) != want:
        raise bad(name, "keys", sorted(state), f"{sorted(want)}")
    if state["quant_type"] != name.rpartition("__")[2]:
        raise bad(name, "quant_type", repr(state["quant_type"]), repr(name.rpartition("__")[2]))
    if state["dtype"] not in _DTYPES or (nested and state["nested_dtype"] != "float32"):
        raise bad(name, "dtype", repr(state["dtype"]), f"one of {_DTYPES}; nested_dtype 'float32'")
    shape = state["shape"]
    if not (
        isinstance(shape, list)
        and len(shape) == 2
        and all(isinstance(d, int) and d > 0 for d in shape)
    ):
        raise bad(name, "shape", shape, "[N, K], the 2-D weight shape")
    for key in ("blocksize", "nested_blocksize") if nested else ("blocksize",):
        if not isinstance(state[key], int) or state[key] <= 0:
            raise bad(name, key, state[key], "a positive int")
    return name, state


def parse_bnb_4bit(tensors: Mapping[str, Any], prefix: str) -> StoredParts:
    """bitsandbytes ``Linear4bit`` weights (``{prefix}.weight`` and its quant state); see
    the module docstring."""
    state_name, state = _quant_state(tensors, prefix)
    n, k = state["shape"]
    blocksize = state["blocksize"]
    wname = f"{prefix}.weight"
    w = tensor(tensors, wname, [np.uint8], (1, 2))
    if w.size != -(-n * k // 2):
        raise bad(
            wname, "size", w.size, f"ceil({n}*{k}/2) = {-(-n * k // 2)} bytes for shape {[n, k]}"
        )
    codebook = tensor(tensors, f"{wname}.quant_map", [np.float32], 1)
    if codebook.shape != (16,):
        raise bad(f"{wname}.quant_map", "shape", codebook.shape, "(16,)")
    codes = nibbles(w.reshape(-1), high_first=True)[: n * k].reshape(n, k)
    br, bc = flat_block(n, k, blocksize, state_name)
    grid = (-(-n // br), -(-k // bc))
    nblocks = grid[0] * grid[1]
    stored = _bits(w, codebook)
    absmax_name = f"{wname}.absmax"
    if "nested_blocksize" not in state:
        absmax = tensor(tensors, absmax_name, [np.float32], 1)
        if absmax.shape != (nblocks,):
            raise bad(
                absmax_name, "shape", absmax.shape, f"({nblocks},): one per block of {blocksize}"
            )
        scales: np.ndarray | StoredParts = np.ascontiguousarray(absmax.reshape(grid).T)
        stored += _bits(absmax)
    else:
        scales = _nested_absmax(tensors, wname, state, state_name, grid)
        stored += scales.stored_bits
    return StoredParts(
        codes=np.ascontiguousarray(codes.T),
        fmt="uint4",
        bits=4,
        block_shape=(bc, br),
        scales=scales,
        codebook=codebook,
        dtype=state["dtype"],
        source=(
            f"bitsandbytes {state['quant_type']} blocksize {blocksize}"
            f"{' double-quantized' if isinstance(scales, StoredParts) else ''}: "
            f"{wname}, {absmax_name}, "
            f"{wname}.quant_map, {state_name}"
        ),
        stored_bits=stored,
    )


def _nested_absmax(
    tensors: Mapping[str, Any],
    wname: str,
    state: dict[str, Any],
    state_name: str,
    grid: tuple[int, int],
) -> StoredParts:
    """The double-quantized absmax as StoredParts of logical shape ``grid`` transposed."""
    nb = state["nested_blocksize"]
    q = tensor(tensors, f"{wname}.absmax", [np.uint8], 1)
    nblocks = grid[0] * grid[1]
    if q.shape != (nblocks,):
        raise bad(f"{wname}.absmax", "shape", q.shape, f"({nblocks},)")
    table = tensor(tensors, f"{wname}.nested_quant_map", [np.float32], 1)
    if table.shape != (256,):
        raise bad(f"{wname}.nested_quant_map", "shape", table.shape, "(256,)")
    nested = tensor(tensors, f"{wname}.nested_absmax", [np.float32], 1)
    if nested.shape != (-(-nblocks // nb),):
        raise bad(f"{wname}.nested_absmax", "shape", nested.shape, f"({-(-nblocks // nb)},)")
    offset = state["nested_offset"]
    if not isinstance(offset, (int, float)) or isinstance(offset, bool):
        raise bad(state_name, "nested_offset", repr(offset), "a number")
    br, bc = flat_block(grid[0], grid[1], nb, state_name)
    ngrid = (-(-grid[0] // br), -(-grid[1] // bc))
    return StoredParts(
        codes=np.ascontiguousarray(q.reshape(grid).T),
        fmt="uint8",
        bits=8,
        block_shape=(bc, br),
        scales=np.ascontiguousarray(nested.reshape(ngrid).T),
        codebook=table,
        offsets=np.float32(offset),
        dtype="float32",
        source=(
            f"bitsandbytes nested absmax: {wname}.absmax, {wname}.nested_absmax, "
            f"{wname}.nested_quant_map"
        ),
        stored_bits=_bits(q, table, nested),
    )
