"""A QArray with zero points, offsets and two-level parts sharded over 8 host CPU devices,
along N and along K at block boundaries, and weights loaded by the importers (a GGUF Q4_K
tensor, an AutoAWQ checkpoint) sharded along K at block boundaries: mode "exact" equals
the unsharded matmul bit for bit; mode "fast" (whose f32 sums XLA may order differently
per shard shape) lies within twice the documented bound of it.

The checks run in a subprocess (XLA_FLAGS must be set before JAX starts)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from _sweeps import LONG
from _xla_flags import host_devices_env

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import emulate
    from emulate import QArray

    rng = np.random.default_rng(0)
    PLANS, LOADED_PLANS = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    LOADED = json.loads(sys.argv[3])
    mesh = Mesh(np.array(jax.devices()), ("x",))

    def weight(k, n, two_level):
        g = 128
        codes = emulate.pack(rng.integers(0, 16, (k, n)).astype(np.uint8), "uint4", axis=0)
        s = (rng.standard_normal((k // g, n)) * 0.05).astype(np.float16)
        z = emulate.pack(rng.integers(0, 16, (k // g, n)).astype(np.uint8), "uint4", axis=1)
        if two_level:
            off = QArray.from_parts(
                rng.integers(0, 64, (k // g, n)).astype(np.uint8),
                (-np.abs(rng.standard_normal((1, n))) * 0.01).astype(np.float16),
                block_shape=(k // g, 1), fmt="uint6")
        else:
            off = (rng.standard_normal((k // g, n)) * 0.1).astype(np.float32)
        return QArray.from_parts(codes, s, block_shape=(g, 1), fmt="uint4",
                                 zero_points=z, offsets=off)

    BUILT = json.loads(sys.argv[4])
    out = {}
    for name, (k, n, spec, two_level) in {
        "along_n": (256, 64, P(None, "x"), True),
        "along_k": (1024, 16, P("x", None), False),
    }.items():
        if name not in BUILT:
            continue
        q = weight(k, n, two_level)
        x = jnp.asarray(rng.standard_normal((4, k)), jnp.bfloat16)
        qs = jax.device_put(q, NamedSharding(mesh, spec))
        xs = jax.device_put(x, NamedSharding(mesh, P(None, spec[0])))
        # |x| @ (|v s| + |z s| + |o|), the magnitude of the bound (docs/numerics.md)
        v = np.asarray(emulate.unpack(q.codes)).astype(np.float64)
        rep = lambda a: np.repeat(np.asarray(a, np.float64), 128, axis=0)
        sv = rep(np.asarray(q.scales, np.float32))
        zv = rep(np.asarray(emulate.unpack(q.zero_points)))
        o = q.offsets.dequantize() if isinstance(q.offsets, QArray) else q.offsets
        parts = np.abs(v * sv) + np.abs(zv * sv) + rep(np.abs(o))
        mag = np.abs(np.asarray(x, np.float64)) @ parts
        bound = 2 * emulate.bounds.gamma(k + k // 128 + 5) * mag
        for target, mode in PLANS:
            f = jax.jit(lambda a, b: emulate.matmul(
                a, b, target=target, mode=mode, preferred_element_type=jnp.float32))
            want = np.asarray(f(x, q))
            got = np.asarray(f(xs, qs))
            if mode == "exact":
                ok = np.array_equal(got.view(np.uint32), want.view(np.uint32))
            else:
                ok = np.all(np.abs(got.astype(np.float64) - want) <= bound)
            out[f"{name}-{target}-{mode}"] = bool(ok)
        out[f"{name}-sharded-leaves"] = [
            len(leaf.sharding.device_set) for leaf in jax.tree.leaves(qs)]

    # Loaded weights, sharded along K at block boundaries: a GGUF Q4_K tensor (N, K),
    # blocks along its last axis (two-level scales and mins, codes packed along K; one
    # 256-element super-block per device), and an AutoAWQ GEMM checkpoint read with
    # load_safetensors, (N, K) as well (zero points packed, group 128 per device).
    import os, tempfile
    from safetensors.numpy import save_file
    from emulate.importers import ggml, gguf as gguf_importer, load_safetensors

    def expand(a, block, shape):
        a = a.dequantize() if isinstance(a, QArray) else a
        a = np.asarray(emulate.unpack(a) if isinstance(a, emulate.Packed) else a, np.float64)
        for axis, b in enumerate(block):
            a = np.repeat(a, b, axis=axis)
        return a[tuple(slice(0, n) for n in shape)]

    def magnitude(x, q):  # |x| @ (|v s| + |z s| + |o|)^T for an (N, K) QArray
        v = np.asarray(emulate.unpack(q.codes), np.float64)
        s = expand(q.scales, q.block_shape, v.shape)
        z = 0 if q.zero_points is None else expand(q.zero_points, q.block_shape, v.shape)
        o = 0 if q.offsets is None else expand(q.offsets, q.block_shape, v.shape)
        w = np.abs(v * s) + np.abs(z * s) + np.abs(o)
        return np.abs(np.asarray(x, np.float64)) @ w.T

    n, k = 16, 2048
    raw = rng.integers(0, 256, (n, k // 256, 144)).astype(np.uint8)
    d = (np.abs(rng.standard_normal((n, k // 256, 2))) * 2.0**-8).astype("<f2")
    raw[:, :, 0:4] = d.view(np.uint8).reshape(n, k // 256, 4)  # finite d and dmin
    q4k = gguf_importer.to_qarray(ggml.parse_blocks(raw.reshape(n, -1), "Q4_K", (n, k)))
    ka, na = 1024, 32
    awq_codes = rng.integers(0, 16, (ka, na)).astype(np.uint32)
    awq_zeros = rng.integers(0, 16, (ka // 128, na)).astype(np.uint32)
    def awq_pack(c):  # nibble i of a word: column [0, 2, 4, 6, 1, 3, 5, 7][i]
        cols = c.reshape(c.shape[0], -1, 8)[:, :, [0, 2, 4, 6, 1, 3, 5, 7]]
        return sum(cols[:, :, i] << (4 * i) for i in range(8)).astype(np.uint32).view(np.int32)
    folder = tempfile.mkdtemp()
    save_file({"l.qweight": awq_pack(awq_codes), "l.qzeros": awq_pack(awq_zeros),
               "l.scales": (rng.uniform(0.5, 1, (ka // 128, na)) * 0.01).astype(np.float16)},
              os.path.join(folder, "model.safetensors"))
    awq_config = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                  "version": "gemm"}
    awq = load_safetensors(folder, config=awq_config)["l.weight"]
    for name, q in {"q4_k": q4k, "awq": awq}.items():
        kk = q.shape[1]
        x = jnp.asarray(rng.standard_normal((4, kk)), jnp.bfloat16)
        qs = jax.device_put(q, NamedSharding(mesh, P(None, "x")))
        xs = jax.device_put(x, NamedSharding(mesh, P(None, "x")))
        segments = kk // min(b for b in q.block_shape if b > 1)
        bound = 2 * emulate.bounds.gamma(kk + segments + 5) * magnitude(x, q)
        for target, mode in LOADED_PLANS if name in LOADED else ():
            f = jax.jit(lambda a, b: emulate.matmul(
                a, b.T, target=target, mode=mode, preferred_element_type=jnp.float32))
            want, got = np.asarray(f(x, q)), np.asarray(f(xs, qs))
            if mode == "exact":
                ok = np.array_equal(got.view(np.uint32), want.view(np.uint32))
            else:
                ok = np.all(np.abs(got.astype(np.float64) - want) <= bound)
            out[f"loaded_{name}-{target}-{mode}"] = bool(ok)
        out[f"loaded_{name}-sharded-leaves"] = [
            len(leaf.sharding.device_set) for leaf in jax.tree.leaves(qs)]
    out["devices"] = jax.device_count()
    print(json.dumps(out))
    """
)


#: The (target, mode) plans of the QArrays built here and of the loaded weights: mode
#: "exact" on the CPU by default (the bits the contract keeps across shardings); mode
#: "fast" on tpu_v5e and on the CPU (bounded: the same decode, f32 sums) and the loaded
#: weights on tpu_v5e are long: EMULATE_LONG_TESTS=1 (docs/testing.md).
PLANS = [("cpu", "exact")] + ([("tpu_v5e", "fast"), ("cpu", "fast")] if LONG else [])
LOADED_PLANS = [("cpu", "exact")] + ([("tpu_v5e", "fast")] if LONG else [])
#: The built QArrays whose matmuls run: along N (zero points, two-level offsets) by default;
#: along K too under EMULATE_LONG_TESTS=1. Sharding along K at block boundaries runs by
#: default on the loaded Q4_K tensor (test_loaded_weights_sharded_along_k_agree_with_unsharded:
#: codes, two-level scales and mins split along K); the zero points the built weight along K
#: adds are split, along N, in "along_n".
BUILT = ["along_n"] + (["along_k"] if LONG else [])
#: The loaded weights whose matmuls run: the GGUF Q4_K tensor (two-level scales and mins)
#: by default; the AutoAWQ checkpoint's too (codes, scales and packed zero points: the
#: parts the built QArray along K has) under EMULATE_LONG_TESTS=1. Both are sharded.
LOADED = ["q4_k"] + (["awq"] if LONG else [])


@pytest.fixture(scope="module")
def result() -> dict:
    env = host_devices_env(8)
    cmd = [sys.executable, "-c", SCRIPT, json.dumps(PLANS), json.dumps(LOADED_PLANS)]
    cmd += [json.dumps(LOADED), json.dumps(BUILT)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_eight_devices(result):
    assert result["devices"] == 8


@pytest.mark.parametrize("layout", ["along_n", pytest.param("along_k", marks=pytest.mark.long)])
@pytest.mark.parametrize(
    ("target", "mode"),
    [
        ("cpu", "exact"),
        pytest.param("tpu_v5e", "fast", marks=pytest.mark.long),
        pytest.param("cpu", "fast", marks=pytest.mark.long),
    ],
)
def test_sharded_matmul_agrees_with_unsharded(result, layout, target, mode):
    assert result[f"{layout}-{target}-{mode}"] is True


@pytest.mark.parametrize("weight", ["q4_k", pytest.param("awq", marks=pytest.mark.long)])
@pytest.mark.parametrize(
    ("target", "mode"), [("cpu", "exact"), pytest.param("tpu_v5e", "fast", marks=pytest.mark.long)]
)
def test_loaded_weights_sharded_along_k_agree_with_unsharded(result, weight, target, mode):
    assert result[f"loaded_{weight}-{target}-{mode}"] is True


def test_every_part_is_split_over_the_devices(result):
    # codes, scales, zero points, offsets (two-level: their codes and scales) all sharded
    assert result["along_n-sharded-leaves"] == [8, 8, 8, 8, 8]
    if "along_k" in BUILT:
        assert result["along_k-sharded-leaves"] == [8, 8, 8, 8]
    # Q4_K: codes, sub-block scale codes and d, min codes and -dmin; AWQ: codes, scales,
    # zero points
    assert result["loaded_q4_k-sharded-leaves"] == [8, 8, 8, 8, 8]
    assert result["loaded_awq-sharded-leaves"] == [8, 8, 8]
