"""What the quantized benchmarks read off a checkpoint scheme of
:data:`benchmarks.qweights.SCHEMES` beyond its weight: the weight's array shape and
stored bytes, the kernel's prepared weight, and the pairs of schemes that differ by the
offset term only.

:mod:`benchmarks.quantized` (CPU timings, compile-only TPU figures),
:mod:`benchmarks.pallas_ops` (the kernel body's vector work) and
:mod:`benchmarks.pallas_qtime` (timed on a real TPU) share these, so that a scheme means
the same weight, prepared the same way, in each of them.
"""

from __future__ import annotations

from typing import Any

import emulate
import emulate.pallas
from benchmarks.qweights import NK, SCHEMES, Scheme

__all__ = ["offset_pairs", "pallas_weight", "stored_bytes", "weight_shape"]


def offset_pairs(got: dict[str, float]) -> list[tuple[str, str, float]]:
    """``(with, without, got[with] / got[without])`` for each scheme in ``got`` whose
    variant without its offset term (``base_of``) is in ``got`` too."""
    return [
        (s.base_of, name, got[s.base_of] / got[name])
        for name, s in SCHEMES.items()
        if s.base_of in got and name in got
    ]


def weight_shape(scheme: Scheme, k: int, n: int) -> tuple[int, int]:
    """The weight's array shape: (N, K) for GGUF rows, (K, N) otherwise."""
    return (n, k) if scheme.dn == NK else (k, n)


def stored_bytes(q: emulate.QArray, m: int, k: int, n: int) -> int:
    """The operands as stored plus the result: the QArray's bytes, bf16 activations (M, K)
    and the f32 result (M, N)."""
    return int(q.nbytes) + 2 * m * k + 4 * m * n


def pallas_weight(scheme: Scheme, q: emulate.QArray) -> Any:
    """The kernel's weight: the QArray prepared once for ``emulate.pallas.matmul``,
    ``(K, N)`` (GGUF's rows transposed). Raises NotImplementedError where the kernel does
    not build the scheme."""
    return emulate.pallas.prepare_weight(q.T if scheme.dn == NK else q)
