"""emulate.routing.choose: which weight contractions take ``emulate.pallas.matmul``.

The kernel route runs here in Pallas' interpret mode (``use_route("interpret")``), one
small problem shared by every front end (dot_general, matmul, einsum, polyfill, a flax
layer), checked against the oracle (``emulate.reference``: the weight's values, the exact
sum in float64, mode "fast"'s bound); an exact pair bit for bit against dot_general and
brute-force integers; the refusals and the explain / inspect text. The program a prepared
weight gives on every TPU generation (the kernel's one custom call, no temporaries) is
compiled with the real TPU compiler by tests/test_tpu_compile.py (``emulate.matmul``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import emulate
import emulate.pallas
from emulate import bounds, compiler, reference
from emulate.engine.args import dot_args
from emulate.pallas.qweight import as_qarray
from emulate.routing import program

assert compiler.available(), "the real TPU compiler (libtpu) is needed: pip install -e .[test]"

K, N = 256, 128
_RNG = np.random.default_rng(7)
X = jnp.asarray(_RNG.standard_normal((2, 3, K)), jnp.bfloat16)
W = _RNG.standard_normal((K, N)).astype(np.float32)
#: int8 codes, a float16 scale per group of 32 rows and column (scales change along K)
Q = emulate.quantize(W, "int8", block_shape=32, axis=0, scale_fmt="float16")
DN = (((2,), (0,)), ((), ()))
DN2 = (((1,), (0,)), ((), ()))
TPU = "tpu_v5e"


def _values(q: emulate.QArray) -> np.ndarray:
    """The QArray's values by the oracle (numpy)."""
    return reference.dequantize(
        np.asarray(q.codes), np.asarray(q.scales).astype(np.float32), q.block_shape
    ).astype(np.float64)


def _assert_within_bound(y: jax.Array, q: emulate.QArray) -> None:
    x = np.asarray(X.astype(jnp.float32)).reshape(-1, K).astype(np.float64)
    w = _values(q)
    exact = x @ w
    # an f32 sum of K products, the group scales applied per segment: gamma_(K + S + 4)
    bound = bounds.dot_general_bound(x, w, (((1,), (0,)), ((), ())), extra_terms=K // 32 + 4)
    got = np.asarray(y, np.float64).reshape(-1, N)
    assert y.shape == (2, 3, N) and y.dtype == jnp.float32
    assert np.all(np.abs(got - exact) <= bound)


def _flax_layer() -> nnx.Module:
    layer = nnx.Linear(K, N, use_bias=False, rngs=nnx.Rngs(0))
    layer.kernel.set_value(jnp.asarray(W))
    with emulate.target(TPU):  # a TPU target: the kernel is prepared once, here
        emulate.flax.quantize_model(layer, "int8")
    return layer


@pytest.fixture(scope="module")
def interpreted() -> dict[str, jax.Array]:
    """Each front end's result under the "interpret" route on a TPU target."""
    layer = _flax_layer()
    with emulate.target(TPU), emulate.use_route("interpret"):
        return {
            "dot_general": emulate.dot_general(X, Q, DN),
            "matmul": emulate.matmul(X, Q),
            "einsum": emulate.einsum("bsk,kn->bsn", X, Q),
            "polyfill": emulate.polyfill(lambda x, q: x @ q)(X, Q),
            "flax": layer(X),
            "flax_kernel": layer.kernel[...],
        }


@pytest.mark.parametrize("front_end", ["dot_general", "matmul", "einsum", "polyfill"])
def test_every_front_end_takes_the_kernel_within_the_bound(interpreted, front_end):
    _assert_within_bound(interpreted[front_end], Q)


def test_a_flax_layer_holds_its_kernel_prepared_and_takes_the_kernel(interpreted):
    kernel = interpreted["flax_kernel"]
    assert isinstance(kernel, emulate.pallas.KernelQWeight)
    # the prepared kernel holds the QArray's bytes: its codes, its f16 scales as bits
    q = as_qarray(kernel)
    assert q.block_shape == (K, 1) and q.format_name == "int8"
    _assert_within_bound(interpreted["flax"], q)
    # and it runs on the CPU route too (the QArray read back), to the same bound
    with emulate.target("cpu"):
        _assert_within_bound(emulate.dot_general(X, kernel, DN), q)


def test_a_prepared_packed_weight_works_on_every_front_end_and_route():
    rng = np.random.default_rng(11)
    codes = jnp.asarray(rng.integers(-8, 8, (K, N)), jnp.int4)
    packed = emulate.pack(codes, axis=0)
    w = emulate.prepare_weights({"w": packed}, target=TPU)["w"]
    assert isinstance(w, emulate.pallas.KernelWeight)
    assert emulate.prepare_weights(packed, target="cpu") is packed  # a CPU target: as it is
    x = X.reshape(6, K)
    dn = (((1,), (0,)), ((), ()))
    f32 = jnp.float32
    assert emulate.weight_route(x, w, dn, target=TPU).kernel
    with emulate.target(TPU):
        got = [
            emulate.dot_general(x, w, dn, preferred_element_type=f32),
            emulate.matmul(x, w, preferred_element_type=f32),
            emulate.einsum("mk,kn->mn", x, w, preferred_element_type=f32),
        ]
        with emulate.use_route("interpret"):
            got.append(emulate.dot_general(x, w, dn, preferred_element_type=f32))
    xv = np.asarray(x.astype(f32), np.float64)
    wv = np.asarray(codes, np.float64)
    bound = bounds.dot_general_bound(xv, wv, dn)
    for y in got:
        assert y.shape == (6, N) and y.dtype == f32
        assert np.all(np.abs(np.asarray(y, np.float64) - xv @ wv) <= bound)


class _Proj(nnx.Module):
    def __init__(self) -> None:
        self.proj = nnx.Linear(K, N, use_bias=False, rngs=nnx.Rngs(0))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj(x)


def test_load_weights_prepares_kernels_once_for_a_tpu_target():
    weights = {"proj.weight": Q.T}  # a checkpoint's (out, in) rows
    with emulate.target(TPU):
        model = emulate.flax.load_weights(_Proj(), weights)
    kernel = model.proj.kernel[...]
    assert isinstance(kernel, emulate.pallas.KernelQWeight)
    assert kernel.nbytes == Q.nbytes  # the same bytes
    # a pytree flax sees: the state's arrays, split and merged back
    leaves = jax.tree.leaves(nnx.state(model))
    assert sorted(str(v.dtype) for v in leaves) == ["int8", "uint16"]  # f16 scales as bits
    graph, state = nnx.split(model)
    again = nnx.merge(graph, state)
    with emulate.target("cpu"):
        cpu_model = emulate.flax.load_weights(_Proj(), weights)  # keeps the QArray
    assert isinstance(cpu_model.proj.kernel[...], emulate.QArray)
    with emulate.target(TPU):  # here the XLA route, on the prepared weight read back
        got, want = again(X), cpu_model(X)
    assert np.array_equal(np.asarray(got), np.asarray(want))


def test_the_kernel_route_runs_the_xla_route_on_the_cpu_bit_for_bit():
    # "kernel" puts the kernel in the program (lax.platform_dependent); run on the CPU, the
    # program is the XLA route. "auto" leaves it out where no TPU can lower it.
    with emulate.target(TPU):
        with emulate.use_route("kernel"):
            routed = emulate.dot_general(X, Q, DN)
            jaxpr = str(jax.make_jaxpr(lambda x, q: emulate.dot_general(x, q, DN))(X, Q))
        with emulate.use_route("xla"):
            xla = emulate.dot_general(X, Q, DN)
        auto = jax.make_jaxpr(lambda x, q: emulate.dot_general(x, q, DN))(X, Q)
    assert np.array_equal(np.asarray(routed), np.asarray(xla))
    assert jaxpr.count("pallas_call") == 1 and "platform_index" in jaxpr
    assert "pallas_call" not in str(auto)
    assert emulate.routing.tpu_may_lower() is False


def test_an_exact_pair_is_bit_identical_to_dot_general_and_the_integers():
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.integers(-128, 128, (4, K)), jnp.int8)
    b = jnp.asarray(rng.integers(-128, 128, (K, N)), jnp.int8)
    dn = (((1,), (0,)), ((), ()))
    with emulate.target("tpu_v4"):  # int8 x int8 is emulated there
        assert emulate.weight_route(a, b, dn, preferred_element_type=jnp.int32).kernel
        with emulate.use_route("interpret"):
            got = emulate.dot_general(a, b, dn, preferred_element_type=jnp.int32)
        with emulate.use_route("xla"):
            xla = emulate.dot_general(a, b, dn, preferred_element_type=jnp.int32)
    ints = np.asarray(a, np.int64) @ np.asarray(b, np.int64)
    assert got.dtype == jnp.int32
    assert np.array_equal(np.asarray(got), np.asarray(xla))
    assert np.array_equal(np.asarray(got), ints)


def test_gradients_reach_the_activations():
    def loss(x):
        return emulate.matmul(x, Q).sum()

    with emulate.target(TPU), emulate.use_route("interpret"):
        g = jax.grad(loss)(X)
    expect = np.broadcast_to(_values(Q).sum(axis=1), (2, 3, K))
    assert g.dtype == jnp.bfloat16
    # the f32 cotangent row sums, rounded once to bf16
    assert np.array_equal(np.asarray(g), np.asarray(jnp.asarray(expect, jnp.bfloat16)))


ALONG_N = emulate.quantize(W, "int8", block_shape=32, axis=1)  # blocks of 32 columns


def test_a_weight_the_kernel_refuses_keeps_the_xla_route_and_says_why():
    r = emulate.weight_route(X, ALONG_N, DN, target=TPU)
    assert r is not None and r.route == "xla" and r.weight == "rhs"
    assert r.reason.startswith(
        "emulate.pallas.matmul refuses it: w: emulate.pallas.matmul does not decode blocks "
        "of 32 columns in the kernel"
    )


def test_route_kernel_refuses_what_the_kernel_cannot_take_by_name():
    with emulate.use_route("kernel"), pytest.raises(ValueError) as e:
        emulate.dot_general(X, ALONG_N, DN, target=TPU)
    assert str(e.value).startswith(
        "rhs: route 'kernel' asks for emulate.pallas.matmul, which cannot take this call: "
        "emulate.pallas.matmul refuses it: w: emulate.pallas.matmul does not decode blocks "
        "of 32 columns"
    )
    with emulate.use_route("kernel"), pytest.raises(ValueError) as e:
        emulate.weight_route(X, Q, DN, target="gpu_sm90")
    assert str(e.value).startswith(
        "target: route 'kernel' asks for emulate.pallas.matmul, which cannot take this call: "
        "target gpu_sm90 is not a TPU"
    )
    with emulate.use_route("kernel"), emulate.use_cpu_kernel(True), pytest.raises(ValueError) as e:
        emulate.weight_route(X.astype(jnp.int8), Q, DN, target="cpu")  # integer activations
    assert str(e.value) == (
        "rhs: route 'kernel' asks for emulate.cpu.gemv, which cannot take this call: integer "
        "activations: the contract sums integer x integer exactly in int32, the CPU kernel in "
        "float32; use emulate.use_route('auto') or ('xla') for the XLA route"
    )
    with emulate.use_route("kernel"), pytest.raises(ValueError, match=r"^mode: route 'kernel'"):
        emulate.weight_route(X, Q, DN, target=TPU, mode="exact")
    with pytest.raises(ValueError, match=r"^route: expected one of 'auto', 'kernel'"):
        with emulate.use_route("fast"):
            pass


def test_explain_says_the_route_and_why():
    r = emulate.weight_route(X, Q, DN, target=TPU)
    assert r.explain() == (
        "route on tpu_v5e (setting 'auto'): pallas.matmul\n"
        "  rhs read as stored by emulate.pallas.matmul where the program is lowered for a "
        "TPU; the XLA route elsewhere"
    )
    gpu = emulate.weight_route(X, Q, DN, target="gpu_sm90")
    assert (gpu.route, gpu.reason) == ("xla", "target gpu_sm90 is not a TPU")
    transposed = emulate.weight_route(X, Q.T, (((2,), (1,)), ((), ())), target=TPU)
    assert transposed.route == "xla" and transposed.reason.startswith(
        "the weight contracts along its axis 1: the kernel reads a (K, N) weight as stored"
    )
    assert emulate.weight_route(X, X.reshape(6, K).T, DN, target=TPU) is None  # no weight


def test_inspect_shows_the_route_per_site():
    report = emulate.inspect(lambda x, a, b: (x @ a, x @ b), X, Q, ALONG_N, target=TPU)
    routes = [r.weight_route for r in report.rows]
    assert routes[0] == "pallas.matmul"
    assert routes[1].startswith("xla: emulate.pallas.matmul refuses it: w:")
    text = str(report)
    assert "pallas.matmul" in text.splitlines()[2]
    assert (
        "kept off the Pallas kernels (pallas.matmul, pallas.ragged_dot, kvcache.attention):" in text
    )


def test_auto_keeps_a_program_jax_may_partition_on_the_xla_route():
    # JAX refuses to partition a Pallas call ("Mosaic kernels cannot be automatically
    # partitioned"): outside shard_map, a mesh of several devices keeps route "auto" on
    # the XLA route, with the reason; inside shard_map each shard takes the kernel.
    auto = jax.sharding.AxisType.Auto
    mesh8 = jax.sharding.AbstractMesh((8,), ("x",), axis_types=(auto,))
    mesh1 = jax.sharding.AbstractMesh((1,), ("x",), axis_types=(auto,))
    manual = jax.sharding.AbstractMesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Manual,))
    assert emulate.sharding.partitioned_over() == 1  # no mesh, no TPU backend
    with jax.sharding.use_abstract_mesh(mesh8):
        assert emulate.sharding.partitioned_over() == 8
    with jax.sharding.use_abstract_mesh(manual):
        assert emulate.sharding.partitioned_over() == 1

    def jaxpr_under(mesh):
        with jax.default_device(compiler.device(TPU)), emulate.target(TPU):
            with jax.sharding.use_abstract_mesh(mesh):
                return str(jax.make_jaxpr(lambda x, q: emulate.dot_general(x, q, DN))(X, Q))

    assert "pallas_call" not in jaxpr_under(mesh8)
    assert jaxpr_under(mesh1).count("pallas_call") == 1
    with jax.sharding.use_abstract_mesh(mesh8), jax.default_device(compiler.device(TPU)):
        call = dot_args(X, Q, DN, target=TPU)
        route = emulate.routing.choose(call, emulate.routing.dot_op(call))
    assert route is not None and route.route == "xla"
    assert route.reason == (
        "the program may be partitioned over 8 devices, and JAX does not partition a Pallas "
        "kernel: run the contraction inside jax.shard_map (each shard takes the kernel), or "
        "emulate.use_route('kernel') for a program on one device"
    )


def test_a_weight_laid_out_again_on_every_call_is_refused_with_the_fix():
    # int4 codes in groups of 32 rows: the kernel reads them K-planar, a copy per call of a
    # TPU program that takes the QArray as it is: route "kernel" refuses it naming the fix;
    # route "auto" takes the XLA route and its reason says why
    q32 = emulate.quantize(W, "int4", block_shape=32, axis=0, scale_fmt="float16")
    fix = r"prepare it once, outside the program: emulate\.pallas\.prepare_weight\(w\)"
    copied = (
        "w: a QArray int4[256, 128] is not stored as the TPU kernel reads it: its "
        "codes (into the K-planar layout) would be laid out again on every call"
    )
    with emulate.target(TPU):
        with emulate.use_route("auto"):
            r = emulate.weight_route(X, q32, DN)
        assert not r.kernel and copied in r.reason, r.reason
        with emulate.use_route("kernel"), pytest.raises(ValueError, match=fix) as e:
            jax.make_jaxpr(lambda x, q: emulate.dot_general(x, q, DN))(X, q32)
        assert copied in str(e.value)
        prepared = emulate.prepare_weights(q32)
        assert emulate.weight_route(X, prepared, DN).kernel
        with emulate.use_route("interpret"):  # no TPU program: the copy is allowed
            assert emulate.weight_route(X, q32, DN).kernel


def test_the_traced_kernels_cache_keeps_the_most_recently_used(monkeypatch) -> None:
    # emulate.routing.program: one trace per op, structure and shapes, CACHED at most
    monkeypatch.setattr(program, "CACHED", 3)
    monkeypatch.setattr(program, "PROGRAMS", type(program.PROGRAMS)())
    for rows in (1, 2, 3, 4, 1, 5):  # 1 used again after 4: 2 and 3 are the oldest
        r = emulate.weight_route(jnp.ones((rows, K), jnp.bfloat16), Q, DN2, target=TPU)
        assert r is not None and r.route == "kernel"
    kept = [key[2][0][0][0] for key in program.PROGRAMS]  # x's rows, in use order
    assert kept == [4, 1, 5]


EXPLICIT = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
SHARDED = "bfloat16[2@data,3,256] is sharded along Explicit mesh axis 'data'"


def test_activations_sharded_along_an_explicit_axis_take_the_xla_route_as_jax_shards():
    # the kernels take whole operands: the XLA route, whose result type is sharded as
    # jnp.dot's (the CPU kernel's custom call gave P(None, None) before the rule)
    with jax.set_mesh(EXPLICIT):
        xs = jax.device_put(X, jax.sharding.PartitionSpec("data"))
        want = jnp.dot(xs, jnp.asarray(W, jnp.bfloat16), preferred_element_type=jnp.float32)
        with emulate.use_cpu_kernel(True):
            r = emulate.weight_route(xs, Q, DN, target="cpu")
            got = emulate.dot_general(xs, Q, DN, preferred_element_type=jnp.float32)
        with emulate.target(TPU), emulate.use_route("interpret"), pytest.raises(ValueError) as e:
            emulate.dot_general(xs, Q, DN)
    assert r is not None and r.route == "xla"
    assert r.reason == f"{SHARDED}: the kernels take unsharded operands"
    assert jax.typeof(got).sharding.spec == jax.typeof(want).sharding.spec
    assert jax.typeof(got).sharding.spec == jax.sharding.PartitionSpec("data", None, None)
    with emulate.use_cpu_kernel(False):
        plain = emulate.dot_general(X, Q, DN, preferred_element_type=jnp.float32)
    assert np.array_equal(np.asarray(got), np.asarray(plain))
    assert str(e.value) == (
        "lhs: route 'interpret' asks for emulate.pallas.matmul, which cannot take this call: "
        f"{SHARDED}: the kernels take unsharded operands; use emulate.use_route('auto') or "
        "('xla') for the XLA route"
    )
