"""emulate: low-precision matmuls with provable numerics on hardware that lacks them.

The public surface:

- formats and codecs: :mod:`emulate.formats`, :func:`decode`, :func:`encode`,
  :func:`pack`, :func:`unpack`, :class:`Packed`;
- the independent oracle :mod:`emulate.reference` and the fast-mode bound
  :mod:`emulate.bounds`;
- targets, modes and plans: :mod:`emulate.targets`, :func:`current_target`, :func:`target`,
  :func:`current_mode`, :func:`use_mode`, :func:`plan`, :class:`Plan`, :func:`runs_as_is`
  (which calls go to JAX unchanged);
- drop-in matmuls: :func:`dot_general`, :func:`matmul`, :func:`einsum`,
  :func:`conv_general_dilated`, :func:`ragged_dot` / :func:`ragged_dot_general` (grouped,
  mixture-of-experts matmuls);
- quantized operands: :class:`QArray` (with zero points, offsets, two-level scales,
  codebooks from :mod:`emulate.codebooks` and act-order permutations),
  :func:`quantize`, :func:`dequantize`, the schemes of :mod:`emulate.mx` (MXFP8/6/4,
  MXINT8, NVFP4, INT4_G128, FP8_BLOCK_128x128),
  and :func:`scaled_matmul` / :func:`scaled_dot_general` (``jax.nn``'s signatures);
- across devices: :func:`shard_weight`, :func:`weight_specs`, :func:`local_weight`
  (every part of a QArray or prepared kernel weight split by one PartitionSpec,
  :mod:`emulate.sharding`);
- wrapping existing code: :func:`polyfill`, and :func:`inspect` to see its sites;
- Pallas TPU kernels: :mod:`emulate.pallas` (``matmul``, an in-kernel ``dot``, ``check``),
  imported on first use of ``emulate.pallas`` because it imports ``jax.experimental.pallas``;
  the route of a weight contraction, a kernel or XLA (:func:`weight_route`,
  :func:`ragged_dot_route`, :class:`WeightRoute`, :func:`use_route`, :func:`current_route`,
  :func:`prepare_weights`: :mod:`emulate.routing`);
- the CPU kernel: a QArray weight times few rows of activations (a decode step) runs a
  numba-compiled kernel that reads the weight as stored (:mod:`emulate.cpu`; its route is
  :mod:`emulate.routing`'s; :func:`use_cpu_kernel` turns it off or on);
- quantized KV caches: :mod:`emulate.kvcache` (``KVCache``, ``attention``: K and V in
  8 or 4 bits, attention reading them as stored), imported on first use of
  ``emulate.kvcache`` because its kernels import ``jax.experimental.pallas``;
- flax models: :mod:`emulate.flax` (``quantize_model``, ``load_weights``), imported on
  first use of ``emulate.flax`` because flax is an optional dependency;
- checkpoints: :mod:`emulate.importers` (``load_gguf``, ``load_safetensors``, one
  ``load_<convention>`` per safetensors layout), imported on first use.
"""

import importlib
import sys

from emulate import bounds, codebooks, formats, moved, reference, targets
from emulate.conv import conv_general_dilated
from emulate.dot import dot_general, einsum, matmul
from emulate.formats import Format
from emulate.numerics.codecs import decode, encode
from emulate.numerics.storage import Packed, pack, unpack
from emulate.planning.plan import Plan, plan, runs_as_is
from emulate.quantized import mx
from emulate.quantized.array import QArray
from emulate.quantized.quantizing import quantize
from emulate.quantized.values import dequantize
from emulate.ragged import ragged_dot, ragged_dot_general
from emulate.report import inspect
from emulate.rewrite import polyfill, scaled_dot_general
from emulate.routing import (
    WeightRoute,
    current_route,
    prepare_weights,
    ragged_dot_route,
    use_cpu_kernel,
    use_route,
    weight_route,
)
from emulate.scaled import scaled_matmul
from emulate.sharding import local_weight, shard_weight, weight_specs
from emulate.targets import Target, current_mode, current_target, use_mode, use_target
from emulate.targets import use_target as target

__version__ = "0.1.0"

#: Modules that moved into a package, under the paths the documentation gave them before
#: (``import emulate.mx``, ``from emulate.quant import SCALE_FORMATS``,
#: ``emulate.reference_rounding.encode``): the same module objects, so both paths name one
#: thing.
_MOVED = {
    "mx": "emulate.quantized.mx",
    "quant": "emulate.quantized.quantizing",
    "qarray": "emulate.quantized.array",
    "reference_codes": "emulate.reference.codes",
    "reference_rounding": "emulate.reference.rounding",
}
for _old, _new in _MOVED.items():
    sys.modules.setdefault(f"emulate.{_old}", importlib.import_module(_new))
del _old, _new
moved.install()  # the module paths the docs gave before a move (emulate.moved)

__all__ = [
    "Format",
    "Packed",
    "Plan",
    "QArray",
    "Target",
    "WeightRoute",
    "bounds",
    "codebooks",
    "conv_general_dilated",
    "current_mode",
    "current_route",
    "current_target",
    "decode",
    "dequantize",
    "dot_general",
    "einsum",
    "encode",
    "formats",
    "inspect",
    "local_weight",
    "matmul",
    "mx",
    "pack",
    "plan",
    "polyfill",
    "prepare_weights",
    "quantize",
    "ragged_dot",
    "ragged_dot_general",
    "ragged_dot_route",
    "reference",
    "runs_as_is",
    "scaled_dot_general",
    "scaled_matmul",
    "shard_weight",
    "target",
    "targets",
    "unpack",
    "use_cpu_kernel",
    "use_mode",
    "use_route",
    "use_target",
    "weight_route",
    "weight_specs",
]


def __getattr__(name: str):
    # emulate.pallas and emulate.kvcache import jax.experimental.pallas, emulate.flax imports
    # flax (optional), emulate.importers reads through gguf / safetensors (optional): load
    # them on first use.
    if name in ("pallas", "flax", "importers", "kvcache"):
        return importlib.import_module(f"emulate.{name}")
    if name in _MOVED:
        return sys.modules[_MOVED[name]]
    raise AttributeError(f"module 'emulate' has no attribute {name!r}")
