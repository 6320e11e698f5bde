"""emulate.program: matmul sites found through every higher-order primitive of a jaxpr."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import emulate
from emulate import program, targets

DN = (((1,), (0,)), ((), ()))

# Operands with distinct dtype pairs, so each site says which dot it is and which
# operand is lhs.
F32 = jnp.ones((2, 3), jnp.float32)
BF16 = jnp.ones((3, 2), jnp.bfloat16)
F16 = jnp.ones((3, 2), jnp.float16)
I8 = jnp.ones((2, 3), jnp.int8)
I8R = jnp.ones((3, 2), jnp.int8)
# Convolution operands, NCH / OIH (lax's convolution takes one dtype only).
X = jnp.ones((1, 2, 5), jnp.int8)
W = jnp.ones((4, 2, 3), jnp.int8)


def dot(x, y, pet=jnp.float32):
    return lax.dot_general(x, y, DN, preferred_element_type=pet)


def conv(x, w):
    out = lax.conv_general_dilated(x, w, (1,), "VALID", preferred_element_type=jnp.int32)
    return out.astype(jnp.float32)


def found(fn, *args) -> list[tuple[str, str, str]]:
    return [
        (s.primitive, s.lhs_dtype, s.rhs_dtype) for s in program.sites(jax.make_jaxpr(fn)(*args))
    ]


def test_top_level_sites_in_program_order_with_shapes():
    def f(x, y, z):
        return dot(x, y), conv(X, W), dot(x, z)

    closed = jax.make_jaxpr(f)(F32, BF16, F16)
    sites = program.sites(closed)
    assert [(s.primitive, s.lhs_dtype, s.rhs_dtype) for s in sites] == [
        ("dot_general", "float32", "bfloat16"),
        ("conv_general_dilated", "int8", "int8"),
        ("dot_general", "float32", "float16"),
    ]
    assert [(s.lhs_shape, s.rhs_shape) for s in sites] == [
        ((2, 3), (3, 2)),
        ((1, 2, 5), (4, 2, 3)),
        ((2, 3), (3, 2)),
    ]
    assert sites[1].equation.primitive.name == "conv_general_dilated"
    # A Jaxpr and its ClosedJaxpr give the same sites.
    assert program.sites(closed.jaxpr) == sites


def test_no_sites():
    assert found(lambda x: jnp.sum(x * 2), F32) == []


def test_inside_jit_nested():
    inner = jax.jit(lambda x, y: dot(x, y))
    outer = jax.jit(lambda x, y, z: (inner(x, y), dot(x, z)))
    assert found(outer, F32, BF16, F16) == [
        ("dot_general", "float32", "bfloat16"),
        ("dot_general", "float32", "float16"),
    ]


def test_inside_scan():
    def f(x, y):
        def body(c, w):
            return c + dot(x, w), conv(X, W)

        return lax.scan(body, jnp.zeros((2, 2)), jnp.stack([y, y]))

    assert found(f, F32, BF16) == [
        ("dot_general", "float32", "bfloat16"),
        ("conv_general_dilated", "int8", "int8"),
    ]


def test_inside_cond_both_branches():
    def f(p, x, y, z):
        # lax.cond's branches are (false_fn, true_fn): the false branch comes first.
        return lax.cond(p, lambda: dot(x, y), lambda: dot(x, z))

    assert found(f, True, F32, BF16, F16) == [
        ("dot_general", "float32", "float16"),
        ("dot_general", "float32", "bfloat16"),
    ]


def test_inside_switch():
    def f(i, x, y, z):
        return lax.switch(i, [lambda: dot(x, y), lambda: dot(x, z), lambda: conv(X, W)[0, :2, :2]])

    assert found(f, 1, F32, BF16, F16) == [
        ("dot_general", "float32", "bfloat16"),
        ("dot_general", "float32", "float16"),
        ("conv_general_dilated", "int8", "int8"),
    ]


def test_inside_while_cond_and_body():
    def f(x, y, z):
        def cond(c):
            return jnp.sum(dot(I8, I8R, jnp.int32)) < c[1]

        def body(c):
            return c[0] + dot(x, y), c[1] - 1

        return lax.while_loop(cond, body, (dot(x, z), 3))

    # The init value's dot, then the loop's condition (evaluated first), then its body.
    assert found(f, F32, BF16, F16) == [
        ("dot_general", "float32", "float16"),
        ("dot_general", "int8", "int8"),
        ("dot_general", "float32", "bfloat16"),
    ]


def test_inside_fori_loop():
    def f(x, y):
        return lax.fori_loop(0, 3, lambda i, c: c + dot(x, y), jnp.zeros((2, 2)))

    assert found(f, F32, BF16) == [("dot_general", "float32", "bfloat16")]


def test_inside_remat():
    f = jax.checkpoint(lambda x, y: dot(x, y) + conv(X, W)[0, :2, :2])
    assert found(f, F32, BF16) == [
        ("dot_general", "float32", "bfloat16"),
        ("conv_general_dilated", "int8", "int8"),
    ]


def test_inside_custom_jvp():
    @jax.custom_jvp
    def g(x, y):
        return dot(x, y)

    @g.defjvp
    def g_jvp(primals, tangents):
        x, y = primals
        return g(x, y), dot(tangents[0], y)

    assert found(lambda x, y: g(x, y) * 2, F32, BF16) == [("dot_general", "float32", "bfloat16")]


def test_inside_custom_vjp():
    @jax.custom_vjp
    def g(x, y):
        return dot(x, y)

    def fwd(x, y):
        return dot(x, y), (x, y)

    def bwd(res, ct):
        x, y = res
        return dot(ct, y.T.astype(jnp.float32)), None

    g.defvjp(fwd, bwd)
    # make_jaxpr traces the primal: the site is the call_jaxpr's dot.
    assert found(lambda x, y: g(x, y) + 1, F32, BF16) == [("dot_general", "float32", "bfloat16")]


def test_inside_shard_map():
    mesh = jax.make_mesh((1,), ("x",))

    def body(x, y, z):
        return dot(x, y) + dot(x, z), conv(X, W)

    f = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P()), out_specs=(P(), P()))
    assert found(f, F32, BF16, F16) == [
        ("dot_general", "float32", "bfloat16"),
        ("dot_general", "float32", "float16"),
        ("conv_general_dilated", "int8", "int8"),
    ]


def test_nested_everything():
    mesh = jax.make_mesh((1,), ("x",))

    @jax.custom_jvp
    def g(x, y):
        return dot(x, y)

    g.defjvp(lambda p, t: (g(*p), dot(t[0], p[1])))

    def f(x, y):
        def body(c, _):
            inner = jax.checkpoint(lambda: lax.cond(c[0, 0] > 0, lambda: g(x, y), lambda: c))
            return inner(), None

        sm = jax.shard_map(
            lambda c: lax.scan(body, c, None, length=2)[0], mesh=mesh, in_specs=P(), out_specs=P()
        )
        return jax.jit(sm)(jnp.zeros((2, 2)))

    assert found(f, F32, BF16) == [("dot_general", "float32", "bfloat16")]


def test_unsupported_sites_flags_plain_int8_dot_on_tpu_v4():
    def plain(x, y):
        return lax.dot_general(x, y, DN, preferred_element_type=jnp.int32)

    flagged = program.unsupported_sites(plain, I8, I8R, target="tpu_v4")
    assert [(s.primitive, s.lhs_dtype, s.rhs_dtype) for s in flagged] == [
        ("dot_general", "int8", "int8")
    ]
    assert [(s.lhs_shape, s.rhs_shape) for s in flagged] == [((2, 3), (3, 2))]
    # tpu_v5e has an int8 x int8 unit; the CPU runs it natively too.
    assert program.unsupported_sites(plain, I8, I8R, target="tpu_v5e") == []
    assert program.unsupported_sites(plain, I8, I8R, target="cpu") == []


@pytest.mark.parametrize("target", ["tpu_v4", "tpu_v2", "tpu_v5e", "cpu"])
def test_unsupported_sites_finds_nothing_in_emulate_dot_general(target):
    def emulated(x, y):
        return emulate.dot_general(x, y, DN, preferred_element_type=jnp.int32, target=target)

    assert program.unsupported_sites(emulated, I8, I8R, target=target) == []
    # The emulated program still holds a matmul site, of a pair the target runs.
    sites = program.sites(jax.make_jaxpr(emulated)(I8, I8R))
    t = targets.get(target)
    assert sites and all(t.supports(s.lhs_dtype, s.rhs_dtype) for s in sites)
    want = {"tpu_v4": "bfloat16", "tpu_v2": "float32", "tpu_v5e": "int8", "cpu": "int8"}[target]
    assert {(s.lhs_dtype, s.rhs_dtype) for s in sites} == {(want, want)}


def test_unsupported_sites_uses_the_current_target():
    def plain(x, y):
        return lax.dot_general(x, y, DN, preferred_element_type=jnp.int32)

    with emulate.use_target("tpu_v4"):
        assert len(program.unsupported_sites(plain, I8, I8R)) == 1
    with emulate.use_target("tpu_v5e"):
        assert program.unsupported_sites(plain, I8, I8R) == []


def test_emulated_result_matches_integer_sum():
    # The flagged and the emulated programs compute the same exact int32 sums.
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (2, 3)).astype(np.int8)
    b = rng.integers(-128, 128, (3, 2)).astype(np.int8)
    got = emulate.dot_general(a, b, DN, preferred_element_type=jnp.int32, target="tpu_v4")
    assert np.asarray(got).tolist() == (a.astype(np.int64) @ b.astype(np.int64)).tolist()


# --- inspect: one row per emulate call, on the user's line ------------------------------

XB = jnp.asarray(np.random.default_rng(1).standard_normal((4, 256)), jnp.bfloat16)
Q4 = emulate.quantize(
    jnp.asarray(np.random.default_rng(2).standard_normal((256, 8)), jnp.float32),
    emulate.mx.INT4_G128,
    axis=0,
)


def model(x, q):
    y = x @ q  # line +1
    z = emulate.einsum("bk,kn->bn", x, q)  # line +2
    return y + z, dot(I8, I8R, jnp.int32)  # line +3


def test_inspect_rows_are_emulate_calls_on_the_users_lines():
    line = model.__code__.co_firstlineno
    where = [f"{__file__}:{line + i} (model)" for i in (1, 2)]
    where.append(f"{__file__}:{dot.__code__.co_firstlineno + 1} (dot)")  # innermost user frame
    for target, mode in (("tpu_v4", "fast"), ("tpu_v7x", "exact")):
        report = emulate.inspect(model, XB, Q4, target=target, mode=mode)
        rows = [(r.source, r.primitive, r.lhs, r.rhs, r.status) for r in report.rows]
        q_row = ("dot_general", "bfloat16[4,256]", "int4[256,8]:INT4_G128", "emulated")
        assert rows == [
            (where[0], *q_row),
            (where[1], *q_row),
            (
                where[2],
                "dot_general",
                "int8[2,3]",
                "int8[3,2]",
                targets.get(target).supports("int8", "int8") and "native" or "emulated",
            ),
        ]
        for r in report.rows[:2]:  # planned for inspect's target and mode
            assert r.plan is not None and (r.plan.target, r.plan.mode) == (target, mode)
            assert r.flops == 2 * 4 * 8 * 256


def test_inspect_estimates_the_larger_of_compute_and_memory_time():
    """A decode-step output head (1 x 4096 by 4096 x 128256, bf16) moves 1.05 GB: its time
    is the bytes over the HBM bandwidth, not its flops over the matrix unit's rate. On v2
    and v3, whose Mosaic-level table lacks bf16 x bf16, XLA runs the dot itself (polyfill
    leaves it): "native (XLA)", not emulated."""
    x = jax.ShapeDtypeStruct((1, 4096), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((4096, 128256), jnp.bfloat16)
    moved = 2 * (4096 + 4096 * 128256 + 128256)
    flops = 2 * 4096 * 128256
    for target, status in (("tpu_v2", "native (XLA)"), ("tpu_v5e", "native")):
        t = targets.get(target)
        (r,) = emulate.inspect(jnp.dot, x, w, target=target).rows
        assert (r.status, r.plan, r.bytes) == (status, None, moved)
        assert r.compute_seconds == flops / t.bf16_ops_per_second
        assert r.memory_seconds == moved / t.mem_bw_bytes_per_second
        assert r.seconds == r.memory_seconds > 50 * r.compute_seconds
    (q,) = emulate.inspect(lambda x, q: x @ q, XB, Q4, target="tpu_v2").rows
    assert q.bytes == 4 * 256 * 2 + 256 * 8 // 2  # bf16 activations, int4 codes
    assert q.memory_seconds == q.bytes / targets.get("tpu_v2").mem_bw_bytes_per_second
    assert q.seconds == max(q.compute_seconds, q.memory_seconds)
    text = str(emulate.inspect(jnp.dot, x, w, target="tpu_v2"))
    header = text.splitlines()[1].split()
    assert header[-5:] == ["route", "compute", "memory", "est.", "time"]


XC = jnp.asarray(np.random.default_rng(3).standard_normal((1, 6, 6, 32)), jnp.bfloat16)
WC = jnp.asarray(np.random.default_rng(4).standard_normal((3, 3, 32, 16)), jnp.float8_e4m3fn)
QC = emulate.quantize(
    jnp.asarray(np.random.default_rng(5).standard_normal((3, 3, 32, 16)), jnp.float32),
    emulate.mx.INT8_PER_CHANNEL,
    axis=(0, 1, 2),
)


def convs(x, w):
    a = emulate.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)  # +1
    b = emulate.conv_general_dilated(x, QC, (2, 2), "VALID", dimension_numbers=NHWC)  # +2
    return a, b


NHWC = ("NHWC", "HWIO", "NHWC")


def test_inspect_rows_for_convolutions_are_one_site_each():
    line = convs.__code__.co_firstlineno
    report = emulate.inspect(convs, XC, WC, target="tpu_v4")
    rows = [(r.source, r.primitive, r.lhs, r.rhs, r.status) for r in report.rows]
    assert rows == [
        (
            f"{__file__}:{line + 1} (convs)",
            "conv_general_dilated",
            "bfloat16[1,6,6,32]",
            "float8_e4m3fn[3,3,32,16]",
            "emulated",
        ),
        (
            f"{__file__}:{line + 2} (convs)",
            "conv_general_dilated",
            "bfloat16[1,6,6,32]",
            "int8[3,3,32,16]:INT8_PER_CHANNEL",
            "emulated",
        ),
    ]
    # 2 * output elements * K (K = 3 * 3 * 32): SAME keeps 6x6, VALID with stride 2 gives 2x2
    assert [r.flops for r in report.rows] == [2 * 36 * 16 * 288, 2 * 4 * 16 * 288]


def test_inspect_under_a_polyfill_context_and_jit():
    # the target and mode of an enclosing block reach inspect's trace, and a jitted
    # function's cached trace is not reused for another target
    f = jax.jit(model)
    with emulate.target("tpu_v5e"), emulate.use_mode("exact"):
        r5 = emulate.inspect(f, XB, Q4)
    r4 = emulate.inspect(f, XB, Q4, target="tpu_v4", mode="fast")
    assert (r5.target, r5.rows[0].plan.target, r5.rows[0].plan.mode) == (
        "tpu_v5e",
        "tpu_v5e",
        "exact",
    )
    assert (r4.rows[0].plan.target, r4.rows[0].plan.mode) == ("tpu_v4", "fast")
    assert [r.status for r in r5.rows] == ["emulated", "emulated", "native"]
    assert [r.status for r in r4.rows] == ["emulated", "emulated", "emulated"]


def test_inspect_names_flax_linen_module_paths():
    from flax import linen

    class Net(linen.Module):
        @linen.compact
        def __call__(self, x):
            x = linen.Dense(4, name="proj", use_bias=False)(x)
            return linen.Dense(2, use_bias=False)(x)

    net = Net()
    x = jnp.ones((2, 8), jnp.float32)
    params = jax.eval_shape(net.init, jax.random.key(0), x)  # traced only
    report = emulate.inspect(lambda p, x: net.apply(p, x), params, x, target="tpu_v4")
    text = open(__file__).read().splitlines()
    line = next(i for i, t in enumerate(text, 1) if 'linen.Dense(4, name="proj"' in t)
    fn = "test_inspect_names_flax_linen_module_paths.<locals>.Net.__call__"
    assert [(r.source, r.status) for r in report.rows] == [
        (f"{__file__}:{line} ({fn}) [Net/proj]", "native"),
        (f"{__file__}:{line + 1} ({fn}) [Net/Dense_0]", "native"),
    ]


def test_inspect_names_flax_nnx_layer_paths():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.proj = nnx.Linear(8, 4, use_bias=False, rngs=rngs)
            self.layers = nnx.List([nnx.Linear(4, 4, use_bias=False, rngs=rngs) for _ in range(2)])

        def __call__(self, x):
            x = self.proj(x)
            for layer in self.layers:
                x = layer(x)
            return x

    block = Block(nnx.Rngs(0))
    x8 = jnp.ones((2, 8), jnp.int8)
    report = emulate.inspect(lambda m, x: m(x.astype(jnp.float32)), block, x8, target="tpu_v4")
    text = open(__file__).read().splitlines()
    line = next(i for i, t in enumerate(text, 1) if "x = self.proj(x)" in t)
    fn = "test_inspect_names_flax_nnx_layer_paths.<locals>.Block.__call__"
    assert [r.source for r in report.rows] == [
        f"{__file__}:{line} ({fn}) [Block/proj]",
        f"{__file__}:{line + 2} ({fn}) [Block/layers/0]",
        f"{__file__}:{line + 2} ({fn}) [Block/layers/1]",
    ]
    assert (
        "__call__" not in vars(nnx.Linear) or nnx.Linear.__call__.__qualname__ == "Linear.__call__"
    )
    assert Block.__call__.__qualname__.endswith("Block.__call__")  # restored after the trace
