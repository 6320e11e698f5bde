"""Run by tests/test_rewrite_sharding.py in a subprocess with 8 host CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set by the caller).

Prints one JSON object: for each case, whether the sharded result is bit-identical to the
unsharded one, and the shardings observed.
"""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import emulate
from emulate import program

DN = (((1,), (0,)), ((), ()))
mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
operands = {
    "int8": (
        jnp.asarray(rng.integers(-128, 128, (8, 4096)), jnp.int8),
        jnp.asarray(rng.integers(-128, 128, (4096, 16)), jnp.int8),
        jnp.int32,
    ),
    "fp4": (
        jnp.asarray(rng.integers(0, 16, (8, 4096)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)),
        jnp.asarray(rng.integers(0, 16, (4096, 16)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)),
        jnp.bfloat16,
    ),
    # A psum in the body adds the per-shard results in the result type: with float32 the
    # fp4 partial sums are exact (< 2**24 quanta), so the total is too.
    "fp4_f32": (None, None, jnp.float32),
}
operands["fp4_f32"] = operands["fp4"][:2] + (jnp.float32,)
result = {"devices": jax.device_count()}


def spec(x):
    s = tuple(x.sharding.spec)
    return list(s + (None,) * (x.ndim - len(s)))


def bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32).tolist()


for name, (x, w, out) in operands.items():

    def f(x, w, out=out):
        return jax.lax.dot_general(x, w, DN, preferred_element_type=out)

    plain = emulate.polyfill(f, target="tpu_v4")
    unsharded = jax.jit(plain)(x, w)
    x_spec, w_spec, o_spec = P("data", "model"), P("model", None), P("data", None)
    shardings = (NamedSharding(mesh, x_spec), NamedSharding(mesh, w_spec))
    out_sharding = NamedSharding(mesh, o_spec)
    # 1. jit(polyfill(f)) with the contraction dimension sharded over "model".
    gspmd = jax.jit(plain, in_shardings=shardings, out_shardings=out_sharding)(x, w)
    # 2. polyfill(jit(f, shardings)): the inner jit keeps its shardings.
    inner = emulate.polyfill(
        jax.jit(f, in_shardings=shardings, out_shardings=out_sharding), target="tpu_v4"
    )(x, w)

    # 3. with_sharding_constraint inside the program.
    def constrained(x, w, f=f):
        return jax.lax.with_sharding_constraint(f(x, w), NamedSharding(mesh, P(None, "model")))

    pc = emulate.polyfill(constrained, target="tpu_v4")
    cons = jax.jit(pc)(x, w)
    eqns = [e.primitive.name for e in program.walk(jax.make_jaxpr(pc)(x, w).jaxpr)]

    # 4. shard_map body with a psum over the contraction axis.
    def body(a, b, out=out):
        return jax.lax.psum(jax.lax.dot_general(a, b, DN, preferred_element_type=out), "model")

    sm = jax.shard_map(
        body, mesh=mesh, in_specs=(P(None, "model"), P("model", None)), out_specs=P()
    )
    xs = jax.device_put(x, NamedSharding(mesh, P(None, "model")))
    ws = jax.device_put(w, NamedSharding(mesh, P("model", None)))
    smr = jax.jit(emulate.polyfill(sm, target="tpu_v4"))(xs, ws)
    sm_sites = program.sites(jax.make_jaxpr(emulate.polyfill(sm, target="tpu_v4"))(xs, ws))
    result[name] = {
        "dtype": str(unsharded.dtype),
        "gspmd_same": bits(gspmd) == bits(unsharded),
        "gspmd_spec": spec(gspmd),
        "inner_same": bits(inner) == bits(unsharded),
        "inner_spec": spec(inner),
        "constraint_same": bits(cons) == bits(unsharded),
        "constraint_kept": "sharding_constraint" in eqns,
        "constraint_spec": spec(cons),
        "shard_map_sites": sorted({(s.lhs_dtype, s.rhs_dtype) for s in sm_sites}),
        "shard_map_same": bits(smr) == bits(unsharded),
    }
    if name == "int8":
        want = np.asarray(x).astype(np.int64) @ np.asarray(w).astype(np.int64)
        result[name]["exact"] = np.asarray(unsharded).tolist() == want.tolist()

# Mode "exact" for float8: the contraction sharded over "model" gives the same bits.
e4 = rng.integers(0, 126, (8, 1024)).astype(np.uint8)
e4[:, ::3] |= 0x80
x8 = jnp.asarray(e4.view(ml_dtypes.float8_e4m3fn))
w8 = jnp.asarray(rng.integers(0, 126, (1024, 16)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn))


def f8(x, w):
    return jax.lax.dot_general(x, w, DN, preferred_element_type=jnp.float32)


exact_plain = jax.jit(emulate.polyfill(f8, target="tpu_v4", mode="exact"))
ex_unsharded = exact_plain(x8, w8)
ex_sharded = jax.jit(
    emulate.polyfill(f8, target="tpu_v4", mode="exact"),
    in_shardings=(NamedSharding(mesh, P("data", "model")), NamedSharding(mesh, P("model", None))),
    out_shardings=NamedSharding(mesh, P("data", None)),
)(x8, w8)
result["exact_fp8_same"] = bits(ex_sharded) == bits(ex_unsharded)

# Mode "exact" for bf16 activations x float8 weights (per-row scaling; row 0 spans more
# than one block of slices, so the residual loop runs): sharded, the same bits.
xb = rng.standard_normal((8, 1024)).astype(np.float32)
xb[0, 5] = 2.0**-100
xb = jnp.asarray(xb.astype(ml_dtypes.bfloat16))
exact_b = jax.jit(emulate.polyfill(f8, target="tpu_v4", mode="exact"))(xb, w8)
exact_b_sharded = jax.jit(
    emulate.polyfill(f8, target="tpu_v4", mode="exact"),
    in_shardings=(NamedSharding(mesh, P("data", "model")), NamedSharding(mesh, P("model", None))),
    out_shardings=NamedSharding(mesh, P("data", None)),
)(xb, w8)
result["exact_bf16_fp8_same"] = bits(exact_b_sharded) == bits(exact_b)

# out_sharding on a mesh of 2 devices outside a mesh context (no jax.set_mesh), jitted or
# not: emulate's dot_general and einsum return what lax.dot_general and jnp.einsum do.
two = jax.make_mesh(
    (2,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:2]
)
osh = NamedSharding(two, P("x", None))
osh3 = NamedSharding(two, P(None, "x", None))
a4 = jnp.asarray(rng.integers(-8, 8, (4, 8)), jnp.int4)
b4 = jnp.asarray(rng.integers(-8, 8, (8, 4)), jnp.int4)
f32 = jnp.float32
pairs = {
    "dot_general": (
        lambda a, b: emulate.dot_general(
            a, b, DN, out_sharding=osh, preferred_element_type=f32, target="tpu_v4"
        ),
        lambda a, b: jax.lax.dot_general(a.astype(f32), b.astype(f32), DN, out_sharding=osh),
    ),
    "einsum": (
        lambda a, b: emulate.einsum(
            "ij,jk->ik", a, b, out_sharding=osh, preferred_element_type=f32, target="tpu_v4"
        ),
        lambda a, b: jnp.einsum("ij,jk->ik", a.astype(f32), b.astype(f32), out_sharding=osh),
    ),
    # emulate's own einsum contraction (a Packed operand) and the convolution (issue 49:
    # both applied the placement, and under jit raised)
    "einsum-packed": (
        lambda a, b: emulate.einsum(
            "ij,jk->ik",
            a,
            emulate.pack(b, axis=0),
            out_sharding=osh,
            preferred_element_type=f32,
            target="tpu_v4",
        ),
        lambda a, b: jnp.einsum("ij,jk->ik", a.astype(f32), b.astype(f32), out_sharding=osh),
    ),
    "conv_general_dilated": (
        lambda a, b: emulate.conv_general_dilated(
            a[None],
            b[:4, :, None],
            (1,),
            "VALID",
            out_sharding=osh3,
            preferred_element_type=f32,
            target="tpu_v4",
        ),
        lambda a, b: jax.lax.conv_general_dilated(
            a[None].astype(f32), b[:4, :, None].astype(f32), (1,), "VALID", out_sharding=osh3
        ),
    ),
}
no_mesh = {}
for name, (ours, theirs) in pairs.items():
    for jitted in (False, True):
        wrap = jax.jit if jitted else (lambda fn: fn)
        got, want = wrap(ours)(a4, b4), wrap(theirs)(a4, b4)
        no_mesh[f"{name}-jit" if jitted else name] = [
            type(got.sharding).__name__,
            type(want.sharding).__name__,
            bits(got) == bits(want),
        ]
result["out_sharding_no_mesh"] = no_mesh
print(json.dumps(result))
