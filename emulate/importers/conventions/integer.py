"""Integer codes with zero points, packed into int32 words: AutoAWQ GEMM, GPTQ (v1 and
v2, with and without act-order) and compressed-tensors ``pack-quantized``.

Each parser reads one linear layer's tensors (names ``{prefix}.{tensor}``) and its
settings, checks every shape, dtype and setting, and returns the layer as
:class:`~emulate.importers.stored.StoredParts` of logical shape ``(K, N)``.

- **AutoAWQ GEMM** (``awq/modules/linear/gemm.py``, ``awq/utils/packing_utils.py``):
  ``qweight`` int32 ``(K, N/8)``, eight 4-bit codes per word along N, nibble ``i``
  (bits ``4i..4i+3``) holding column ``8c + [0, 2, 4, 6, 1, 3, 5, 7][i]``; ``qzeros``
  int32 ``(K/G, N/8)`` packed the same way; ``scales`` float16 ``(K/G, N)``.
  ``W = (q - z) * s``.
- **GPTQ** (AutoGPTQ ``qlinear_cuda_old.py``, GPTQModel ``nn_modules/qlinear``):
  ``qweight`` int32 ``(K*b/32, N)``, codes packed along K as a little-endian bit stream
  (code ``j`` at stream bits ``b*j``; 3-bit codes straddle words), ``qzeros`` int32
  ``(G, N*b/32)`` packed the same way along N, ``scales`` ``(G, N)``, ``g_idx`` int32
  ``(K,)`` the group of each input row. Format v1 (``checkpoint_format`` "gptq", the
  default) stores each zero point minus one and decodes ``z = field + 1`` per field
  (AutoGPTQ); v2 ("gptq_v2", GPTQModel) stores ``z``. ``W[k] = (q - z[g_idx[k]]) *
  s[g_idx[k]]``; an act-order ``g_idx`` becomes a permutation of K (``perm``).
- **compressed-tensors pack-quantized** (``compressors/pack_quantized``):
  ``weight_packed`` int32 ``(N, ceil(K*b/32))`` packed densely along K, unsigned codes
  meaning ``u - 2**(b-1)``; ``weight_shape`` ``[N, K]``; ``weight_scale`` ``(N, K/G)``,
  ``(N, 1)`` or ``(1,)``; asymmetric: ``weight_zero_point`` int32 packed along N with the
  same offset; ``weight_g_idx`` for act-order groups. ``W = (q - z) * s``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from emulate.importers.conventions.config import setting
from emulate.importers.conventions.readers import bad, group_permutation, tensor, unpack_stream
from emulate.importers.stored import StoredParts

__all__ = ["parse_awq", "parse_gptq", "parse_compressed_int"]

#: AutoAWQ's AWQ_REVERSE_ORDER: column ``m`` of a word's 8 columns is nibble ``[m]``.
AWQ_COLUMN_NIBBLE = np.array([0, 4, 1, 5, 2, 6, 3, 7])
_HALF = (np.float16, ml_dtypes.bfloat16)


def _int_bits(t: np.ndarray) -> int:
    return t.size * t.dtype.itemsize * 8


def _one_of(config: Mapping[str, Any], names: tuple[str, str], where: str) -> str:
    """The value of the one or two spellings of a setting; refused when they disagree."""
    values = {setting(config, n, where=where, kind=str) for n in names if n in config}
    if not values:
        raise bad(where, names[0], "missing", "the setting to be present (it is not guessed)")
    if len(values) > 1:
        raise bad(where, "/".join(names), sorted(values), "one value (the spellings disagree)")
    return values.pop()


def _group(group_size: int, k: int, where: str) -> int:
    if group_size == -1:
        return k
    if group_size <= 0:
        raise bad(where, "group_size", group_size, "a positive group size or -1 (one group)")
    return group_size


def _checked_scales(
    scales: np.ndarray, name: str, want: tuple[int, int], why: str = "", flat: bool = False
) -> np.ndarray:
    """``scales`` (the tensor ``name``) of shape ``want``, (groups, N) or (N, groups);
    ``flat``: one of as many elements in another shape is reshaped to it. Raises
    ValueError naming ``name`` and ``want`` (then ``why``) otherwise."""
    got = scales.reshape(want) if flat and scales.size == want[0] * want[1] else scales
    if got.shape != want:
        raise bad(name, "shape", scales.shape, f"{want}{why}")
    return got


def _zero_points(
    zp: np.ndarray, name: str, bits: int, n: int, groups: int, axis: int
) -> np.ndarray:
    """Zero points packed ``bits`` to a field along N, N along ``axis`` of ``zp`` (1:
    GPTQ's ``qzeros`` (groups, words); 0: compressed-tensors' (words, groups)), checked
    (ValueError naming ``name``) and unpacked to uint8 fields of shape (groups, N)."""
    words = -(-n * bits // 32)
    want = (groups, words) if axis == 1 else (words, groups)
    if zp.shape != want:
        raise bad(name, "shape", zp.shape, f"{want}")
    fields = unpack_stream(zp, bits, n, axis=axis)
    return fields if axis == 1 else fields.T


def _g_idx(tensors: Mapping[str, Any], name: str) -> np.ndarray | None:
    """An act-order ``g_idx`` (int32 or int64, the group of each row of K) where stored."""
    return tensor(tensors, name, [np.int32, np.int64], 1) if name in tensors else None


def _act_order(g_idx: np.ndarray, group: int, name: str) -> tuple[np.ndarray | None, int]:
    """The permutation of K that sorts ``g_idx``'s groups (:func:`group_permutation`: None
    where they are in order) and the bits ``g_idx`` is stored in."""
    return group_permutation(g_idx, group, name), _int_bits(g_idx)


def _int_parts(codes: np.ndarray, bits: int, perm: np.ndarray | None, **parts: Any) -> StoredParts:
    """:class:`StoredParts` of uint ``bits`` codes (K, N), their rows permuted by an
    act-order ``perm`` where there is one; ``parts``: ``block_shape``, ``scales`` (whose
    dtype the values take), ``zero_points``, ``zero_bits``, ``source``, ``stored_bits``."""
    if perm is not None:
        codes = codes[perm]
    return StoredParts(
        codes=np.ascontiguousarray(codes),
        fmt=f"uint{bits}",
        bits=bits,
        dtype=parts["scales"].dtype.name,
        perm=perm,
        perm_axis=-2 if perm is not None else None,
        **parts,
    )


def parse_awq(tensors: Mapping[str, Any], prefix: str, config: Mapping[str, Any]) -> StoredParts:
    """AutoAWQ GEMM int4 (``{prefix}.qweight``, ``.qzeros``, ``.scales``); see the module
    docstring. ``config``: the ``quantization_config`` (``quant_method`` "awq",
    ``version`` "gemm", ``bits``/``w_bit`` 4, ``group_size``/``q_group_size``,
    ``zero_point`` true)."""
    where = "quantization_config"
    setting(config, "quant_method", where=where, kind=str, allowed=("awq",), default="awq")
    version = _one_of(config, ("version", "format"), where)
    if version.lower() != "gemm":
        raise bad(where, "version", repr(version), "'gemm' (AutoAWQ GEMM packing)")
    setting(config, ("bits", "w_bit"), where=where, kind=int, allowed=(4,))
    group_size = setting(config, ("group_size", "q_group_size"), where=where, kind=int)
    setting(config, "zero_point", where=where, kind=bool, allowed=(True,), default=True)
    qweight = tensor(tensors, f"{prefix}.qweight", [np.int32], 2)
    qzeros = tensor(tensors, f"{prefix}.qzeros", [np.int32], 2)
    scales = tensor(tensors, f"{prefix}.scales", [np.float16], 2)
    k, words = qweight.shape
    n = words * 8
    group = _group(group_size, k, where)
    if k % group:
        raise bad(f"{prefix}.qweight", "rows", k, f"a multiple of group_size {group}")
    scales = _checked_scales(scales, f"{prefix}.scales", (k // group, n))
    if qzeros.shape != (k // group, words):
        raise bad(f"{prefix}.qzeros", "shape", qzeros.shape, f"{(k // group, words)}")

    def columns(packed: np.ndarray) -> np.ndarray:
        nib = unpack_stream(packed, 4, packed.shape[1] * 8, axis=1)
        return nib.reshape(packed.shape[0], -1, 8)[:, :, AWQ_COLUMN_NIBBLE].reshape(
            packed.shape[0], -1
        )

    return StoredParts(
        codes=columns(qweight),
        fmt="uint4",
        bits=4,
        block_shape=(group, 1),
        scales=scales,
        zero_points=columns(qzeros),
        zero_bits=4,
        dtype="float16",
        source=f"AutoAWQ GEMM int4 g{group}: {prefix}.qweight, {prefix}.qzeros, {prefix}.scales",
        stored_bits=_int_bits(qweight) + _int_bits(qzeros) + _int_bits(scales),
    )


def parse_gptq(tensors: Mapping[str, Any], prefix: str, config: Mapping[str, Any]) -> StoredParts:
    """GPTQ (``{prefix}.qweight``, ``.qzeros``, ``.scales``, optional ``.g_idx``); see the
    module docstring. ``config``: ``bits`` (2, 3, 4 or 8), ``group_size`` (-1: one group),
    ``checkpoint_format`` ("gptq" = v1, the default; "gptq_v2")."""
    where = "quantization_config"
    setting(config, "quant_method", where=where, kind=str, allowed=("gptq",), default="gptq")
    bits = setting(config, "bits", where=where, kind=int, allowed=(2, 3, 4, 8))
    group_size = setting(config, "group_size", where=where, kind=int)
    if "checkpoint_format" in config or "format" in config:
        fmt_name = _one_of(config, ("checkpoint_format", "format"), where)
        if fmt_name not in ("gptq", "gptq_v2"):
            raise bad(where, "format", repr(fmt_name), "one of 'gptq', 'gptq_v2'")
    else:
        fmt_name = "gptq"  # the historical layout, transformers' GPTQConfig default
    setting(config, "pack_dtype", where=where, kind=str, allowed=("int32",), default="int32")
    qweight = tensor(tensors, f"{prefix}.qweight", [np.int32], 2)
    qzeros = tensor(tensors, f"{prefix}.qzeros", [np.int32], 2)
    scales = tensor(tensors, f"{prefix}.scales", _HALF, 2)
    if qweight.shape[0] * 32 % bits:
        raise bad(f"{prefix}.qweight", "rows", qweight.shape[0], f"whole {bits}-bit codes")
    k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    group = _group(group_size, k, where)
    groups = -(-k // group)
    scales = _checked_scales(scales, f"{prefix}.scales", (groups, n))
    zeros = _zero_points(qzeros, f"{prefix}.qzeros", bits, n, groups, axis=1)
    codes = unpack_stream(qweight, bits, k, axis=0)
    v1 = fmt_name == "gptq"
    # v1 zero points are field + 1, in [1, 2**bits]: one more bit than stored
    zero_points = (
        (zeros.astype(np.int16) + 1).astype(np.uint8 if bits < 8 else np.int16) if v1 else zeros
    )
    stored = _int_bits(qweight) + _int_bits(qzeros) + _int_bits(scales)
    perm = None
    g_idx = _g_idx(tensors, f"{prefix}.g_idx")
    if g_idx is not None:
        if g_idx.shape != (k,) or g_idx.min(initial=0) < 0 or g_idx.max(initial=0) >= groups:
            raise bad(
                f"{prefix}.g_idx",
                "values",
                f"shape {g_idx.shape}, range [{g_idx.min(initial=0)}, {g_idx.max(initial=0)}]",
                f"shape ({k},) in [0, {groups})",
            )
        perm, g_bits = _act_order(g_idx, group, f"{prefix}.g_idx")
        stored += g_bits
    return _int_parts(
        codes,
        bits,
        perm,
        block_shape=(group, 1),
        scales=scales,
        zero_points=zero_points,
        zero_bits=(bits + 1 if bits < 8 else 16) if v1 else bits,
        source=(
            f"GPTQ {'v1' if v1 else 'v2'} int{bits} g{group}"
            f"{' act-order' if perm is not None else ''}: "
            f"{prefix}.qweight, {prefix}.qzeros, {prefix}.scales"
            + (f", {prefix}.g_idx" if g_idx is not None else "")
        ),
        stored_bits=stored,
    )


def _weights_args(config: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    """The ``weights`` quantization args: ``config`` itself when it has ``num_bits``, else
    the only config group's ``weights`` of a full compressed-tensors config."""
    if "num_bits" in config:
        return config
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise bad(
            "quantization_config",
            "config_groups",
            f"{len(groups) if isinstance(groups, Mapping) else 'no'} groups",
            f"exactly one group, or the weights args of the group that holds {prefix} "
            "(config['config_groups'][name]['weights'])",
        )
    (group,) = groups.values()
    weights = group.get("weights") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping):
        raise bad("quantization_config", "config_groups.weights", weights, "a mapping")
    return weights


@dataclasses.dataclass(frozen=True)
class _PackArgs:
    """compressed-tensors' ``weights`` args for ``pack-quantized`` integers, checked."""

    args: Mapping[str, Any]
    bits: int
    symmetric: bool
    strategy: str


def _pack_args(config: Mapping[str, Any], prefix: str) -> _PackArgs:
    fmt_name = config.get("format", "pack-quantized")
    if fmt_name != "pack-quantized":
        raise bad("quantization_config", "format", repr(fmt_name), "'pack-quantized'")
    args = _weights_args(config, prefix)
    where = "weights"
    # 2, 4 and 8 bits: the dense packing of newer releases and the older one agree there.
    bits = setting(args, "num_bits", where=where, kind=int, allowed=(2, 4, 8))
    setting(args, "type", where=where, kind=str, allowed=("int",))
    symmetric = setting(args, "symmetric", where=where, kind=bool)
    strategy = setting(
        args, "strategy", where=where, kind=str, allowed=("group", "channel", "tensor")
    )
    return _PackArgs(args, bits, symmetric, strategy)


def _packed_codes(
    tensors: Mapping[str, Any], prefix: str, bits: int
) -> tuple[np.ndarray, int, int]:
    """(``weight_packed``, N, K), the packed codes checked against ``weight_shape``."""
    packed = tensor(tensors, f"{prefix}.weight_packed", [np.int32], 2)
    shape = tensor(tensors, f"{prefix}.weight_shape", [np.int32, np.int64], 1)
    if (
        shape.shape != (2,)
        or shape[0] != packed.shape[0]
        or -(-int(shape[1]) * bits // 32) != packed.shape[1]
    ):
        raise bad(
            f"{prefix}.weight_shape",
            "value",
            shape.tolist(),
            f"[{packed.shape[0]}, K] with ceil(K*{bits}/32) == {packed.shape[1]}",
        )
    return packed, int(shape[0]), int(shape[1])


def _pack_group(a: _PackArgs, k: int) -> int:
    """Rows of K per scale: the checked ``group_size`` of strategy "group", else K."""
    if a.strategy != "group":
        return k
    group = setting(a.args, "group_size", where="weights", kind=int)
    if group <= 0 or k % group:
        raise bad("weights", "group_size", group, f"a positive divisor of K = {k}")
    return group


def parse_compressed_int(
    tensors: Mapping[str, Any], prefix: str, config: Mapping[str, Any]
) -> StoredParts:
    """compressed-tensors ``pack-quantized`` integer weights (``{prefix}.weight_packed``,
    ``.weight_shape``, ``.weight_scale``, ``.weight_zero_point``, ``.weight_g_idx``); see
    the module docstring. ``config``: the ``quantization_config`` with one config group,
    or that group's ``weights`` args (``num_bits`` 2, 4 or 8, ``type`` "int",
    ``symmetric``, ``strategy`` "group", "channel" or "tensor", ``group_size``)."""
    a = _pack_args(config, prefix)
    bits, strategy = a.bits, a.strategy
    packed, n, k = _packed_codes(tensors, prefix, bits)
    scale = tensor(
        tensors, f"{prefix}.weight_scale", [np.float16, ml_dtypes.bfloat16, np.float32], (1, 2)
    )
    group = _pack_group(a, k)
    cols = 1 if strategy == "tensor" else k // group
    rows = 1 if strategy == "tensor" else n
    why = f" for strategy {strategy}"
    scale2 = _checked_scales(scale, f"{prefix}.weight_scale", (rows, cols), why, flat=True)
    stored = _int_bits(packed) + _int_bits(scale)
    zero_points: np.ndarray | int = 1 << (bits - 1)
    if not a.symmetric:
        if strategy == "tensor":
            raise bad(
                "weights",
                "symmetric",
                False,
                "true for strategy 'tensor' (its zero point is not packed)",
            )
        zp = tensor(tensors, f"{prefix}.weight_zero_point", [np.int32], 2)
        # unsigned: the offsets cancel
        zero_points = _zero_points(zp, f"{prefix}.weight_zero_point", bits, n, cols, axis=0)
        stored += _int_bits(zp)
    perm = None
    g_idx = _g_idx(tensors, f"{prefix}.weight_g_idx")
    if g_idx is not None:
        if g_idx.shape != (k,) or strategy != "group":
            raise bad(
                f"{prefix}.weight_g_idx",
                "shape",
                f"{g_idx.shape} with strategy {strategy!r}",
                f"({k},) with strategy 'group'",
            )
        if not (g_idx == -1).any():  # compressed-tensors reads -1 as "not initialised"
            perm, g_bits = _act_order(g_idx, group, f"{prefix}.weight_g_idx")
            stored += g_bits
    return _int_parts(
        unpack_stream(packed, bits, k, axis=1).T,
        bits,
        perm,
        block_shape=(group, 1) if strategy != "tensor" else (k, n),
        scales=np.ascontiguousarray(scale2.T),
        zero_points=zero_points,
        zero_bits=bits if not a.symmetric else 0,
        source=(
            f"compressed-tensors pack-quantized int{bits} {strategy}"
            f"{f' g{group}' if strategy == 'group' else ''} "
            f"{'symmetric' if a.symmetric else 'asymmetric'}"
            f"{' act-order' if perm is not None else ''}: "
            f"{prefix}.weight_packed, {prefix}.weight_scale"
        ),
        stored_bits=stored,
    )
