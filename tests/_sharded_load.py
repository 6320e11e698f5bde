"""Run by tests/test_flax_load.py in a subprocess with 8 host CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set by the caller).

A GGUF weight (Q8_0, MXFP4) loaded into an NNX Linear, its kernel's leaves (codes,
scales) placed with a NamedSharding along N (the kernel's last axis); prints one JSON
object: whether the jitted sharded result is bit-identical to the unsharded one (mode
"exact": correctly rounded, so it must be; mode "fast" sums in another order per shard
shape), whether it lies within gamma_(K+4) * |x| @ |W|^T of the exact product with
gguf.quants.dequantize's weights, and each leaf's PartitionSpec and number of shards.
"""

import json

import gguf
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from gguf import GGMLQuantizationType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import emulate.flax as ef
from emulate.importers.ggml import parse_blocks
from emulate.importers.gguf import to_qarray

K, N = 128, 64
mesh = jax.make_mesh((8,), ("n",), axis_types=(jax.sharding.AxisType.Auto,))
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(4, K)).astype(np.float32))
result: dict = {"devices": jax.device_count()}


class Head(nnx.Module):
    def __init__(self, rngs):
        self.lm_head = nnx.Linear(K, N, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.lm_head(x)


def leaf_name(path) -> str:
    return str(getattr(path[-1], "name", path[-1]))


for ggml_type, mode in (("Q8_0", "exact"), ("MXFP4", "exact"), ("Q8_0", "fast")):
    w = rng.normal(size=(N, K)).astype(np.float32)
    raw = gguf.quants.quantize(w, GGMLQuantizationType[ggml_type])
    model = ef.load_weights(
        Head(nnx.Rngs(0)),
        {"output.weight": to_qarray(parse_blocks(raw, ggml_type, (N, K)))},
        mode=mode,
    )
    forward = nnx.jit(lambda m, x: m(x))
    want = np.asarray(forward(model, x))
    q = model.lm_head.kernel[...]
    along_n = NamedSharding(mesh, P(None, "n"))
    model.lm_head.kernel = ef.QuantizedWeight(jax.device_put(q, along_n))
    sharded = model.lm_head.kernel[...]
    specs, shards = {}, {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(sharded):
        name = leaf_name(path) if leaf_name(path) != "data" else leaf_name(path[:-1])
        specs[name] = list(leaf.sharding.spec)
        shards[name] = len({str(s.index) for s in leaf.addressable_shards})
    got = np.asarray(forward(model, jax.device_put(x, NamedSharding(mesh, P()))))
    oracle = gguf.quants.dequantize(raw, GGMLQuantizationType[ggml_type]).astype(np.float64)
    xs = np.asarray(x, np.float64)
    gamma = (K + 4) * 2.0**-24 / (1 - (K + 4) * 2.0**-24)
    bound = gamma * (np.abs(xs) @ np.abs(oracle).T)
    result[f"{ggml_type} {mode}"] = {
        "same": bool(np.array_equal(got, want)),
        "within_bound": bool((np.abs(got - xs @ oracle.T) <= bound).all()),
        "leaf_specs": specs,
        "leaf_shards": shards,
    }
print(json.dumps(result))
