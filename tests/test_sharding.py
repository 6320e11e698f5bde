"""emulate.sharding: one PartitionSpec of a weight's logical shape placed on every part of
a QArray and of a prepared kernel weight.

In this process, on an abstract mesh (no devices): the spec each part gets (N and K
splits; a part of one block along a split axis replicated) and the exact errors for
splits that cut a scale group, a packed byte group or a K-planar tile. In one subprocess
with 8 host CPU devices: a sharded QArray through ``emulate.matmul`` under jit equals the
unsharded result bit for bit (mode "exact"), and inside ``jax.shard_map`` the Pallas
kernel (interpret mode) per shard: column-parallel bit for bit; row-parallel plus a psum
bit for bit for int8 x int8 (an int32 sum), within the f32 bound for a scaled weight.
Compile-only on 8-chip TPU topologies: the sharded projection's collectives move the bytes
of the bf16 program's.

By default the subprocess runs the column-parallel layout and the compile-only check the
v5e 2x4 topology; EMULATE_LONG_TESTS=1 adds the row-parallel layout (along K) and the v4
2x2x2 topology."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _sweeps import LONG
from _xla_flags import host_devices_env
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import emulate
import emulate.pallas
from emulate import QArray, compiler
from emulate.sharding import local_weight, shard_weight, weight_specs

MESH = AbstractMesh((8,), ("x",))
RNG = np.random.default_rng(0)


def affine_weight(k: int, n: int, rng: np.random.Generator = RNG) -> QArray:
    """uint4 codes packed along K, f16 scales per 128 rows, uint4 zero points packed along
    K's groups, two-level offsets (uint6 codes, f16 scales per 2 groups)."""
    g = 128
    codes = emulate.pack(rng.integers(0, 16, (k, n)).astype(np.uint8), "uint4", axis=0)
    s = (rng.standard_normal((k // g, n)) * 0.05).astype(np.float16)
    z = emulate.pack(rng.integers(0, 16, (k // g, n)).astype(np.uint8), "uint4", axis=0)
    off = QArray.from_parts(
        rng.integers(0, 64, (k // g, n)).astype(np.uint8),
        (-np.abs(rng.standard_normal((k // g // 2, n))) * 0.01).astype(np.float16),
        block_shape=(2, 1),
        fmt="uint6",
    )
    return QArray.from_parts(codes, s, block_shape=(g, 1), fmt="uint4", zero_points=z, offsets=off)


def leaf_specs(tree) -> list:
    return jax.tree.leaves(tree, is_leaf=lambda p: isinstance(p, P))


def test_every_part_of_a_qarray_follows_the_logical_split():
    q = affine_weight(2048, 64)
    # codes, scales, zero points, offsets' codes, offsets' scales
    assert leaf_specs(weight_specs(q, P(None, "x"), MESH)) == [P(None, "x")] * 5
    assert leaf_specs(weight_specs(q, P("x", None), MESH)) == [P("x", None)] * 5
    per_channel = emulate.quantize(jnp.ones((2048, 64)), "int8", block_shape=(2048, 1))
    # scales of one block along K: replicated along K
    assert leaf_specs(weight_specs(per_channel, P("x"), MESH)) == [P("x", None), P(None, None)]


def test_stacked_experts_split_along_any_axis():
    one = [
        emulate.quantize(
            jnp.asarray(np.random.default_rng(i).standard_normal((256, 64))),
            "int4",
            block_shape=(32, 1),
        )
        for i in range(8)
    ]
    experts = jax.tree.map(lambda *a: jnp.stack(a), *one)  # (8, 256, 64), blocks (1, 32, 1)
    # codes packed along K (8, 128, 64) and scales (8, 8, 64): E, K (whole groups) or N
    for spec in (P("x", None, None), P(None, "x", None), P(None, None, "x")):
        assert leaf_specs(weight_specs(experts, spec, MESH)) == [spec, spec]


def test_every_part_of_a_prepared_weight_follows_the_logical_split():
    kq = emulate.pallas.prepare_weight(affine_weight(4096, 128))
    got = weight_specs(kq, P("x", None), MESH)
    assert isinstance(got, emulate.pallas.KernelQWeight)
    # K-planar codes, scales, zero points, offsets' codes, offsets' scales
    assert leaf_specs(got) == [P("x", None)] * 5
    assert leaf_specs(weight_specs(kq, P(None, "x"), MESH)) == [P(None, "x")] * 5
    # the kernel packs the 6-bit offset codes 4 groups to 3 bytes along K (a unit of 512
    # rows): K = 2048 splits 8 ways as a QArray, not as a prepared weight
    assert leaf_specs(weight_specs(affine_weight(2048, 128), P("x"), MESH)) == [P("x", None)] * 5
    with pytest.raises(
        ValueError,
        match=re.escape(
            "w: axis 0 (2048) split 8 ways over mesh axes ('x',) leaves 256 per shard, not whole "
            "offsets (512 along it a unit): the axis must be a multiple of 4096"
        ),
    ):
        weight_specs(emulate.pallas.prepare_weight(affine_weight(2048, 128)), P("x"), MESH)


@pytest.mark.parametrize(
    ("k", "spec", "message"),
    [
        (
            1024,
            P("x", None),
            # zero points packed 2 groups a byte along K: 256 rows a byte
            "w: axis 0 (1024) split 8 ways over mesh axes ('x',) leaves 128 per shard, not "
            "whole zero points (packed: 2 codes a byte group) (256 along it a unit): the axis "
            "must be a multiple of 2048",
        ),
        (
            2048,
            P(None, ("x", "y")),
            "spec: mesh axis 'y' is not in the mesh (axes ('x',))",
        ),
        (
            2048,
            P(None, None, "x"),
            "spec: P(None, None, 'x') names 3 axes; w has 2 (shape (2048, 64))",
        ),
    ],
)
def test_a_split_that_cuts_a_block_is_refused(k, spec, message):
    with pytest.raises(ValueError) as e:
        weight_specs(affine_weight(k, 64), spec, MESH)
    assert str(e.value).startswith(message)


def test_a_split_that_cuts_a_scale_group_is_refused():
    q = emulate.quantize(jnp.ones((512, 256)), "int8", block_shape=(128, 1))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "w: axis 0 (512) split 8 ways over mesh axes ('x',) leaves 64 per shard, not whole "
            "scales (128 along it a unit): the axis must be a multiple of 1024"
        ),
    ):
        shard_weight(q, jax.sharding.NamedSharding(MESH, P("x")))


def test_a_split_that_cuts_a_k_planar_tile_is_refused():
    w = emulate.pallas.prepare_weight(
        emulate.pack(RNG.integers(0, 16, (1024, 128)).astype(np.uint8), "uint4", axis=0)
    )
    with pytest.raises(
        ValueError,
        match=re.escape(
            "w: axis 0 (1024) split 8 ways over mesh axes ('x',) leaves 128 per shard, not whole "
            "K-planar codes (tiles of 256 rows) (256 along it a unit): the axis must be a "
            "multiple of 2048"
        ),
    ):
        weight_specs(w, P("x", None), MESH)


def test_an_act_order_permutation_is_not_split_along_its_axis():
    q = affine_weight(2048, 64)
    perm = jnp.asarray(RNG.permutation(2048).astype(np.int32))
    q = QArray.from_parts(
        q.codes, q.scales, block_shape=(128, 1), fmt="uint4", perm=perm, perm_axis=0
    )
    with pytest.raises(ValueError, match="an act-order permutation along axis 0 cannot be split"):
        weight_specs(q, P("x", None), MESH)
    assert leaf_specs(weight_specs(q, P(None, "x"), MESH)) == [P(None, "x"), P(None, "x"), P()]


def test_shard_weight_refuses_a_sharding_it_cannot_read():
    with pytest.raises(TypeError, match="sharding: expected a jax.sharding.NamedSharding or Mesh"):
        shard_weight(affine_weight(256, 8), P("x"))
    with pytest.raises(TypeError, match="spec: expected a jax.sharding.PartitionSpec"):
        weight_specs(affine_weight(256, 8), ("x", None), MESH)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import emulate, emulate.pallas
    sys.path.insert(0, sys.argv[1])
    from test_sharding import affine_weight
    from emulate.sharding import local_weight, shard_weight, weight_specs

    rng = np.random.default_rng(1)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    out = {"devices": jax.device_count()}
    bits = lambda a: np.asarray(a, np.float32).view(np.uint32)
    layouts = {"along_n": (256, 1024, P(None, "x")), "along_k": (4096, 128, P("x", None))}
    for name in json.loads(sys.argv[2]):
        k, n, spec = layouts[name]
        q = affine_weight(k, n, rng)
        x = jnp.asarray(rng.standard_normal((8, k)), jnp.bfloat16)
        xs = jax.device_put(x, NamedSharding(mesh, P(None, spec[0])))
        f = jax.jit(lambda a, b: emulate.matmul(
            a, b, target="cpu", mode="exact", preferred_element_type=jnp.float32))
        qs = shard_weight(q, mesh, spec)
        out[name + "-leaves"] = [len(leaf.sharding.device_set) for leaf in jax.tree.leaves(qs)]
        out[name + "-xla"] = bool(np.array_equal(bits(f(xs, qs)), bits(f(x, q))))
        xla = np.asarray(f(x, q))
        def xla_body(a, b, spec=spec):
            y = f(a, local_weight(b, spec, mesh))
            return jax.lax.psum(y, "x") if spec[0] else y
        sm = jax.jit(jax.shard_map(xla_body, mesh=mesh, in_specs=(P(None, spec[0]),
            weight_specs(q, spec, mesh)), out_specs=P(None, spec[1])))
        xla_sm = np.asarray(sm(xs, qs))
        kq = emulate.pallas.prepare_weight(q)
        run = lambda a, b: emulate.pallas.matmul(
            a, b, target="tpu_v5e", interpret=True, out_dtype=jnp.float32)
        want = np.asarray(jax.jit(run)(x, kq))
        def body(a, b, spec=spec):
            y = run(a, local_weight(b, spec, mesh))
            return jax.lax.psum(y, "x") if spec[0] else y
        sm = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, spec[0]),
            weight_specs(kq, spec, mesh)), out_specs=P(None, spec[1])))
        got = np.asarray(sm(xs, shard_weight(kq, mesh, spec)))
        out[name + "-kernel-equal"] = bool(np.array_equal(bits(got), bits(want)))
        # |x| @ (|v s| + |z s| + |o|), the magnitude of the bound (docs/numerics.md)
        rep = lambda a: np.repeat(np.asarray(a, np.float64), 128, axis=0)
        v = np.asarray(emulate.unpack(q.codes), np.float64)
        s, z = rep(q.scales), rep(emulate.unpack(q.zero_points))
        terms = np.abs(v * s) + np.abs(z * s) + rep(np.abs(q.offsets.dequantize()))
        mag = np.abs(np.asarray(x, np.float64)) @ terms
        bound = 2 * emulate.bounds.gamma(k + k // 128 + 5) * (mag + 1e-30)
        out[name + "-kernel-bounded"] = bool(np.all(np.abs(got - want) <= bound))
        out[name + "-xla-shard-map-equal"] = bool(np.array_equal(bits(xla_sm), bits(xla)))
        out[name + "-xla-shard-map-bounded"] = bool(np.all(np.abs(xla_sm - xla) <= bound))
    # int8 x int8, row-parallel: int32 partial sums, a psum of int32: exact
    w = rng.integers(-128, 128, (2048, 128)).astype(np.int8)
    x = rng.integers(-128, 128, (8, 2048)).astype(np.int8)
    run = lambda a, b: emulate.pallas.matmul(
        a, b, target="tpu_v5e", interpret=True, out_dtype=jnp.int32)
    sm = jax.jit(jax.shard_map(lambda a, b: jax.lax.psum(run(a, b), "x"), mesh=mesh,
        in_specs=(P(None, "x"), weight_specs(w, P("x", None), mesh)), out_specs=P()))
    got = np.asarray(sm(x, shard_weight(jnp.asarray(w), mesh, P("x", None))))
    out["int8-row-parallel"] = bool(np.array_equal(got, x.astype(np.int64) @ w.astype(np.int64)))
    print(json.dumps(out))
    """
)


#: The layouts the subprocess runs: column-parallel (along N) by default; row-parallel
#: (along K, K = 4096 for whole units of the packed offsets: the Pallas kernel in interpret
#: mode over 8 shards) under EMULATE_LONG_TESTS=1. Row-parallel stays by default in the
#: int8 kernel's psum here, in the compile-only collectives below, and along K in
#: tests/quantized/test_array_sharding.py.
LAYOUTS = ["along_n"] + (["along_k"] if LONG else [])
LAYOUT_CASES = ["along_n", pytest.param("along_k", marks=pytest.mark.long)]


@pytest.fixture(scope="module")
def result() -> dict:
    tests = str(__import__("pathlib").Path(__file__).parent)
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, tests, json.dumps(LAYOUTS)],
        capture_output=True,
        text=True,
        timeout=900,
        env=host_devices_env(8),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("layout", LAYOUT_CASES)
def test_sharded_weights_give_the_unsharded_result(result, layout):
    assert result["devices"] == 8
    # codes, scales, zero points, two-level offsets' codes and scales: each on 8 devices
    assert result[f"{layout}-leaves"] == [8] * 5
    assert result[f"{layout}-xla"] is True
    assert result[f"{layout}-kernel-bounded"] is True


def test_column_parallel_kernel_is_bit_identical(result):
    assert result["along_n-kernel-equal"] is True


@pytest.mark.parametrize("layout", LAYOUT_CASES)
def test_emulate_matmul_runs_per_shard_in_shard_map(result, layout):
    # column-parallel: the same bits; row-parallel: a psum of f32 partial sums, bounded
    assert result[f"{layout}-xla-shard-map-bounded"] is True
    if layout == "along_n":
        assert result[f"{layout}-xla-shard-map-equal"] is True


def test_row_parallel_int8_kernel_with_psum_is_exact(result):
    assert result["int8-row-parallel"] is True


#: HLO collectives: result type, op name (async pairs counted once, at their start).
_COLLECTIVE = re.compile(
    r"= ([a-z0-9]+)\[([\d,]*)\][^ ]* "
    r"(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\("
)
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1}


def collective_bytes(hlo: str) -> dict[str, int]:
    """Bytes each kind of collective produces in a compiled HLO text."""
    out: dict[str, int] = {}
    for dt, dims, op in _COLLECTIVE.findall(hlo):
        size = int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
        out[op] = out.get(op, 0) + size * _BYTES[dt]
    return out


@pytest.fixture(scope="module")
def tpu_collectives():
    """Per (topology, split): the collectives' bytes of x @ w for a bf16 w, a QArray through
    emulate.matmul and its prepared weight through the Pallas kernel in shard_map; each
    topology compiled on first use (the long one only when its cases run)."""
    cache: dict = {}

    def get(topo: str, split: str) -> dict:
        if topo not in cache:
            cache[topo] = _collectives_on(topo)
        return cache[topo][split]

    return get


def _abstract(w, spec, mesh):
    """``w``'s leaves as ShapeDtypeStructs placed by ``weight_specs(w, spec, mesh)``."""
    return jax.tree.map(
        lambda a, p: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, p)),
        w,
        weight_specs(w, spec, mesh),
    )


def _collectives_on(topo: str) -> dict:
    k, n = 4096, 1024
    q = affine_weight(k, n)
    kq = emulate.pallas.prepare_weight(q)
    out = {}
    devs = compiler.topology_devices(topo)
    # one device a chip: libtpu lists v4's two TensorCores apart (16 devices)
    mesh = Mesh(np.array([d for d in devs if d.core_on_chip == 0]), ("x",))
    for spec in (P(None, "x"), P("x", None)):
        xs = jax.ShapeDtypeStruct(
            (16, k), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, spec[0]))
        )
        outs = NamedSharding(mesh, P(None, spec[1]))
        bf16 = jax.jit(
            lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32),
            out_shardings=outs,
        )
        xla = jax.jit(
            lambda a, b: emulate.matmul(a, b, target="tpu_v5e", preferred_element_type=jnp.float32),
            out_shardings=outs,
        )

        def body(a, b, spec=spec, mesh=mesh):
            y = emulate.pallas.matmul(
                a,
                local_weight(b, spec, mesh),
                target="tpu_v5e",
                interpret=False,
                out_dtype=jnp.float32,
            )
            return jax.lax.psum(y, "x") if spec[0] else y

        kernel = jax.jit(
            jax.shard_map(
                body,
                mesh=mesh,
                in_specs=(P(None, spec[0]), weight_specs(kq, spec, mesh)),
                out_specs=P(None, spec[1]),
            )
        )
        # the XLA route: under automatic partitioning JAX refuses a Mosaic kernel
        with jax.default_device(devs[0]), emulate.use_route("xla"):
            out[str(spec)] = {
                "bf16": collective_bytes(
                    bf16.lower(
                        xs,
                        jax.ShapeDtypeStruct(
                            (k, n), jnp.bfloat16, sharding=NamedSharding(mesh, spec)
                        ),
                    )
                    .compile()
                    .as_text()
                ),
                "qarray": collective_bytes(
                    xla.lower(xs, _abstract(q, spec, mesh)).compile().as_text()
                ),
                "kernel": collective_bytes(
                    kernel.lower(xs, _abstract(kq, spec, mesh)).compile().as_text()
                ),
            }
    return out


#: v5e 2x4 by default; v4 2x2x2 (two TensorCores a chip, a 3-D torus: the same programs
#: over another device list) under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize("topology", ["v5e:2x4", pytest.param("v4:2x2x2", marks=pytest.mark.long)])
@pytest.mark.parametrize(
    ("split", "collectives"),
    [
        # column-parallel: nothing moves; row-parallel: one all-reduce of the (16, 1024) f32
        (str(P(None, "x")), {}),
        (str(P("x", None)), {"all-reduce": 16 * 1024 * 4}),
    ],
)
def test_sharded_projection_moves_the_bytes_of_the_bf16_one(
    tpu_collectives, topology, split, collectives
):
    got = tpu_collectives(topology, split)
    assert got == {"bf16": collectives, "qarray": collectives, "kernel": collectives}
