"""Abstract quantized weights of real models: ``jax.ShapeDtypeStruct`` pytrees of QArrays
as the importers build them, at any size, with nothing materialized.

Each format's record is built once for real at a small size by the importer a porting user
calls (``parse_blocks`` for GGUF, ``parse_awq`` for AutoAWQ, ``parse_gpt_oss_mxfp4``; zero
bytes), then grown: every leaf's axes and every packed length scale by the ratio of the
wanted logical shape to the small one, which is exact for shapes that are whole blocks
(the leaves of a block-scaled record are the logical shape divided by the block, packed
codes the logical shape divided by the codes per byte). ``prepared`` gives the kernel
layout of such a weight (``emulate.pallas.prepare_weight`` under ``jax.eval_shape``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import emulate
import emulate.pallas
from emulate.importers import ggml
from emulate.importers.as_qarray import to_qarray
from emulate.importers.conventions.floats import parse_gpt_oss_mxfp4
from emulate.importers.conventions.integer import parse_awq
from emulate.numerics.storage import Packed
from emulate.quantized.array import QArray, transpose

__all__ = ["FORMATS", "abstract_weight", "grow", "nbytes", "prepared"]

#: The formats a model's matrices are stored in here: a GGML type, "awq" (AutoAWQ GEMM
#: int4, groups of 128 along K, zero points) or "mxfp4" (gpt-oss, e2m1 in blocks of 32
#: with e8m0 scales).
FORMATS = ("Q4_K", "Q6_K", "awq", "mxfp4")

AWQ_GROUP = 128
#: the small (K, N) each format's record is built at: one block along K, 32 columns
_SMALL = {"Q4_K": (256, 32), "Q6_K": (256, 32), "awq": (AWQ_GROUP, 32), "mxfp4": (32, 32)}


def _small(fmt: str, experts: int | None) -> QArray:
    if fmt not in _SMALL:
        raise ValueError(f"fmt: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    k, n = _SMALL[fmt]
    if fmt in ("Q4_K", "Q6_K"):
        block, size = ggml.BLOCKS[fmt]
        raw = np.zeros(n * k // block * size, np.uint8)
        # GGUF holds (out, in) rows; load_weights hands the layer its (in, out) transpose
        return transpose(to_qarray(ggml.parse_blocks(raw, fmt, (n, k))))
    if fmt == "awq":
        tensors = {
            "w.qweight": np.zeros((k, n // 8), np.int32),
            "w.qzeros": np.zeros((k // AWQ_GROUP, n // 8), np.int32),
            "w.scales": np.ones((k // AWQ_GROUP, n), np.float16),
        }
        config = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": AWQ_GROUP}
        return to_qarray(parse_awq(tensors, "w", config))
    lead = (experts or 1,)  # mxfp4
    tensors = {
        "w_blocks": np.zeros((*lead, n, k // 32, 16), np.uint8),
        "w_scales": np.full((*lead, n, k // 32), 127, np.uint8),
    }
    q = to_qarray(parse_gpt_oss_mxfp4(tensors, "w"))
    if experts:
        return q
    return jax.tree.map(lambda a: a[0], q)


def _leaf(x: Any, factors: Sequence[int]) -> jax.ShapeDtypeStruct:
    shape = tuple(x.shape)
    lead = len(shape) - len(factors)
    if lead < 0:  # a scalar (tensor scale) or a 1-D permutation: kept as it is
        return jax.ShapeDtypeStruct(shape, x.dtype)
    grown = shape[:lead] + tuple(d * f for d, f in zip(shape[lead:], factors))
    return jax.ShapeDtypeStruct(grown, x.dtype)


def grow(q: Any, factors: Sequence[int]) -> Any:
    """``q`` (a QArray, Packed or array) with its last ``len(factors)`` logical axes and
    every leaf's matching axes multiplied by ``factors``; leaves as ShapeDtypeStructs."""
    if q is None or isinstance(q, (int, float)):
        return q
    if isinstance(q, QArray):
        children, aux = q.tree_flatten()
        aux = list(aux)
        shape = tuple(aux[3])
        lead = len(shape) - len(factors)
        aux[3] = shape[:lead] + tuple(d * f for d, f in zip(shape[lead:], factors))
        return QArray.tree_unflatten(tuple(aux), [grow(c, factors) for c in children])
    if isinstance(q, Packed):
        axis = q.axis + len(factors)  # the packed axis among the last len(factors)
        length = q.length * factors[axis]
        return Packed(_leaf(q.data, factors), q.format_name, q.axis, length)
    return _leaf(q, factors)


@functools.cache
def _small_cached(fmt: str, experts: int | None) -> QArray:
    return _small(fmt, experts)


def abstract_weight(fmt: str, k: int, n: int, *, experts: int | None = None) -> Any:
    """The (K, N) weight (``(experts, K, N)`` stacked) in ``fmt`` as its importer builds
    it, abstract: K whole blocks of the format (256 for K-quants, 128 for AWQ, 32 for
    MXFP4) and N a multiple of 32."""
    sk, sn = _SMALL[fmt] if fmt in _SMALL else (1, 1)
    if k % sk or n % sn:
        raise ValueError(f"k, n: expected multiples of {sk} and {sn}, got {k} and {n}")
    return grow(_small_cached(fmt, experts), (k // sk, n // sn))


def prepared(w: Any) -> Any:
    """The kernel layout of an abstract 2-D weight (``emulate.pallas.prepare_weight``), or
    of each expert of a stacked 3-D one."""
    fn = emulate.pallas.prepare_weight
    return jax.eval_shape(jax.vmap(fn) if len(w.shape) == 3 else fn, w)


def nbytes(tree: Any) -> int:
    """Bytes of every array leaf of ``tree`` (abstract or not)."""
    return sum(
        int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize
        for a in jax.tree.leaves(tree)
        if hasattr(a, "shape")
    )
