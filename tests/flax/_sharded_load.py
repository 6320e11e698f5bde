"""Run by tests/flax/test_flax_load.py in a subprocess with 8 host CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set by the caller).

A GGUF weight (Q8_0, MXFP4) loaded into an NNX Linear, its kernel's leaves (codes,
scales) placed with a NamedSharding along N (the kernel's last axis), the jitted layer
run sharded and unsharded. Prints one JSON object with, per case, whether the two results
are bit-identical, whether the sharded one lies within gamma_(K+4) * |x| @ |W|^T of the
exact product with gguf.quants.dequantize's weights, and each leaf's PartitionSpec and
number of shards.

Case "ternary": activations in {-1, 0, 1} and K = 32 (one block): every partial sum of
every route is exact in f32 (each term at most 2**18 quanta of the block scale, 32 terms:
below 2**24), so the results must be bit-identical whatever order each shard's dot sums
in. Case "normal":
Gaussian activations, K = 128; mode "fast" sums in an order that may depend on the shard's
shape, so only the bound is asserted.

First, before anything else imports flax: whether ``import emulate`` alone imports flax
(it must not: emulate.flax loads it on first use), and whether ``emulate.flax.Rule`` is
then reachable ("emulate_imports_flax", "emulate_flax_reachable").
"""

import json
import sys

import emulate

EMULATE_IMPORTS_FLAX = "flax" in sys.modules
EMULATE_FLAX_REACHABLE = emulate.flax.Rule.__name__ == "Rule"

import gguf  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import emulate.flax as ef  # noqa: E402
from emulate.importers.ggml import parse_blocks  # noqa: E402
from emulate.importers.gguf import to_qarray  # noqa: E402

N = 64
mesh = jax.make_mesh((8,), ("n",), axis_types=(jax.sharding.AxisType.Auto,))
rng = np.random.default_rng(0)
result: dict = {
    "devices": jax.device_count(),
    "emulate_imports_flax": EMULATE_IMPORTS_FLAX,
    "emulate_flax_reachable": EMULATE_FLAX_REACHABLE,
}


class Head(nnx.Module):
    def __init__(self, k, rngs):
        self.lm_head = nnx.Linear(k, N, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.lm_head(x)


def leaf_name(path) -> str:
    return str(getattr(path[-1], "name", path[-1]))


CASES = [("Q8_0", "ternary", 32), ("MXFP4", "ternary", 32), ("Q8_0", "normal", 128)]
for ggml_type, activations, k in CASES:
    w = rng.normal(size=(N, k)).astype(np.float32)
    if activations == "ternary":
        x = jnp.asarray(rng.integers(-1, 2, (4, k)), jnp.float32)
    else:
        x = jnp.asarray(rng.normal(size=(4, k)).astype(np.float32))
    raw = gguf.quants.quantize(w, GGMLQuantizationType[ggml_type])
    q = to_qarray(parse_blocks(raw, ggml_type, (N, k)))
    model = ef.load_weights(Head(k, nnx.Rngs(0)), {"output.weight": q})
    forward = nnx.jit(lambda m, x: m(x))
    want = np.asarray(forward(model, x))
    along_n = NamedSharding(mesh, P(None, "n"))
    model.lm_head.kernel = ef.QuantizedWeight(jax.device_put(model.lm_head.kernel[...], along_n))
    specs, shards = {}, {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(model.lm_head.kernel[...]):
        name = leaf_name(path) if leaf_name(path) != "data" else leaf_name(path[:-1])
        specs[name] = list(leaf.sharding.spec)
        shards[name] = len({str(s.index) for s in leaf.addressable_shards})
    got = np.asarray(forward(model, jax.device_put(x, NamedSharding(mesh, P()))))
    oracle = gguf.quants.dequantize(raw, GGMLQuantizationType[ggml_type]).astype(np.float64)
    xs = np.asarray(x, np.float64)
    gamma = (k + 4) * 2.0**-24 / (1 - (k + 4) * 2.0**-24)
    bound = gamma * (np.abs(xs) @ np.abs(oracle).T)
    result[f"{ggml_type} {activations}"] = {
        "same": bool(np.array_equal(got, want)),
        "within_bound": bool((np.abs(got - xs @ oracle.T) <= bound).all()),
        "leaf_specs": specs,
        "leaf_shards": shards,
    }
print(json.dumps(result))
