"""The contenders the benchmarks run against each other, written once.

Format pairs (:mod:`benchmarks.matmul` times them on the CPU, :mod:`benchmarks.tpu`
compiles them for TPUs), each ``fn(x, w)`` on activations ``x`` (M, K) and a weight ``w``
(K, N) (:func:`pair_programs`):

  floor    ``jnp.dot(x, w, preferred_element_type=f32)`` on operands decoded to bf16 up
           front
  astype   ``jnp.dot(x.astype(bf16), w.astype(bf16), preferred_element_type=f32)``
  xla      ``lax.dot_general`` on the raw dtypes, the pair's accumulator
  fast     ``emulate.dot_general(x, w, ..., target=T)``, mode "fast" (under
           ``emulate.use_route(route)`` where a route is named)
  exact    the same with ``mode="exact"`` (never under a route)

Checkpoint schemes (:mod:`benchmarks.quantized`: a QArray weight, (K, N) or GGUF's
(N, K), :func:`scheme_programs`):

  floor       ``lax.dot_general`` of x and the weight decoded to bf16 up front
  dequantize  ``lax.dot_general(x, emulate.dequantize(q, to=bf16), ...)``
  emulate     ``emulate.dot_general(x, q, ..., target=T)`` on the XLA route
  pallas      ``emulate.pallas.matmul(x, w, target=T)`` on a prepared weight

And the compile-only TPU benchmark's contenders with the abstract arguments they take
(:func:`tpu_programs`): the weights as ``jax.ShapeDtypeStruct`` pytrees
(:func:`weight_spec`, :func:`kernel_weight_spec`, :func:`kernel_qweight_spec`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import emulate
import emulate.pallas
from benchmarks.cases import DN, Pair
from emulate import formats
from emulate.numerics.storage import Packed, group_shape
from emulate.pallas import weights

__all__ = [
    "QARRAY_GROUP",
    "kernel_qweight_spec",
    "kernel_weight_spec",
    "pair_programs",
    "scheme_programs",
    "spec",
    "tpu_programs",
    "weight_spec",
]

BF16 = jnp.bfloat16
F32 = jnp.float32
#: The scale groups along K of :func:`kernel_qweight_spec`.
QARRAY_GROUP = 128


def pair_programs(
    acc: Any, target: str, route: str | None = None
) -> dict[str, Callable[[Any, Any], jax.Array]]:
    """floor, astype, xla, fast and exact (module docstring) for a pair whose raw-dtype
    contenders sum into ``acc`` (int32 or float32), emulate's on ``target``; ``fast``
    under ``emulate.use_route(route)`` where ``route`` is given."""

    def floor(x, w):
        return jnp.dot(x, w, preferred_element_type=F32)

    def astype(x, w):
        return jnp.dot(x.astype(BF16), w.astype(BF16), preferred_element_type=F32)

    def xla(x, w):
        return lax.dot_general(x, w, DN, preferred_element_type=acc)

    def fast(x, w):
        with emulate.use_route(route) if route else contextlib.nullcontext():
            return emulate.dot_general(x, w, DN, preferred_element_type=acc, target=target)

    def exact(x, w):
        return emulate.dot_general(
            x, w, DN, preferred_element_type=acc, target=target, mode="exact"
        )

    return {"floor": floor, "astype": astype, "xla": xla, "fast": fast, "exact": exact}


def scheme_programs(dn: Any, target: str) -> dict[str, Callable[[Any, Any], jax.Array]]:
    """floor, dequantize, emulate and pallas (module docstring) for a checkpoint weight
    contracted by the dimension numbers ``dn``, on ``target``: ``w`` is the bf16 weight
    for floor, the QArray for dequantize and emulate, the prepared weight for pallas."""

    def floor(x, w):
        return lax.dot_general(x, w, dn, preferred_element_type=F32)

    def dequantize(x, q):
        return lax.dot_general(x, emulate.dequantize(q, to=BF16), dn, preferred_element_type=F32)

    def fast(x, q):
        with emulate.use_route("xla"):  # the XLA route; the kernel is pallas
            return emulate.dot_general(x, q, dn, preferred_element_type=F32, target=target)

    def pallas(x, w):
        return emulate.pallas.matmul(x, w, target=target, out_dtype=F32, interpret=False)

    return {"floor": floor, "dequantize": dequantize, "emulate": fast, "pallas": pallas}


def tpu_programs(
    pair: Pair, shape: tuple[int, int, int], generation: str
) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    """:mod:`benchmarks.tpu`'s contenders, each as its function and abstract arguments, for
    one pair, (M, K, N) shape and TPU generation: :func:`pair_programs` (fast on the XLA
    route), each on the weight it takes (:func:`weight_spec`; floor on bf16 operands), and
    ``emulate.pallas.matmul`` on the prepared weight (pallas: :func:`kernel_weight_spec`,
    the pair's result type) and on a block-scaled one (pallas_q:
    :func:`kernel_qweight_spec`, an f32 result)."""
    m, k, n = shape
    x = spec((m, k), formats.get(pair.lhs).dtype)
    w = weight_spec(pair, k, n, stored=False)
    w_stored = weight_spec(pair, k, n, stored=True)
    acc = pair.accumulator
    # the XLA route's plan for (d); the kernel is (f) and (g)
    fns = pair_programs(acc, generation, route="xla")

    def pallas(x, w):
        return emulate.pallas.matmul(x, w, target=generation, out_dtype=acc, interpret=False)

    def pallas_q(x, w):
        return emulate.pallas.matmul(x, w, target=generation, out_dtype=F32, interpret=False)

    return {
        "floor": (fns["floor"], (spec((m, k), BF16), spec((k, n), BF16))),
        "astype": (fns["astype"], (x, w)),
        "xla": (fns["xla"], (x, w)),
        "fast": (fns["fast"], (x, w_stored)),
        "exact": (fns["exact"], (x, w_stored)),
        "pallas": (pallas, (x, kernel_weight_spec(pair, k, n))),
        "pallas_q": (pallas_q, (x, kernel_qweight_spec(pair, k, n))),
    }


def spec(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    """An abstract array of ``shape`` and ``dtype``."""
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def weight_spec(pair: Pair, k: int, n: int, *, stored: bool) -> Any:
    """The (K, N) weight: its own dtype, or (``stored`` and a packed pair) a
    :class:`emulate.Packed` of uint8 bytes packed along K, as ``emulate.pack(w, axis=0)``
    returns it."""
    f = formats.get(pair.rhs)
    if stored and pair.packed:
        return Packed(spec((-(-f.bits * k // 8), n), jnp.uint8), f.name, -2, k)
    return spec((k, n), f.dtype)


def kernel_weight_spec(pair: Pair, k: int, n: int) -> Any:
    """The (K, N) weight as ``emulate.pallas.matmul`` takes it: its own dtype (8-bit), or
    a :class:`emulate.pallas.KernelWeight` (a packed pair), as ``prepare_weight`` returns
    it."""
    f = formats.get(pair.rhs)
    if not pair.packed:
        return spec((k, n), f.dtype)
    rows = weights.tiles(f, k) * weights.TILE_GROUPS * group_shape(f.bits)[1]
    return emulate.pallas.KernelWeight(spec((rows, n), jnp.uint8), f.name, k)


def kernel_qweight_spec(pair: Pair, k: int, n: int) -> Any:
    """The (K, N) weight as a :class:`emulate.pallas.KernelQWeight`: the codes as
    :func:`kernel_weight_spec` gives them and one scale per :data:`QARRAY_GROUP` rows and
    column (float16, held as uint16 bits, for integer weights; float8_e8m0fnu for float
    ones)."""
    f = formats.get(pair.rhs)
    sf = "float16" if f.is_integer else "float8_e8m0fnu"
    held = jnp.uint16 if sf == "float16" else formats.get(sf).dtype  # float16 as its bits
    scales = spec((-(-k // QARRAY_GROUP), n), held)
    return emulate.pallas.KernelQWeight(
        kernel_weight_spec(pair, k, n),
        scales,
        None,
        f.name,
        sf,
        (QARRAY_GROUP, 1),
        (k, n),
        jnp.dtype(F32),
    )
