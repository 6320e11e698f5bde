import functools, jax, jax.numpy as jnp, time
from emulate import compiler
from emulate.pallas import gmm_kernel as G
M,K,N,E = 256, 2048, 1024, 8
cases = {"bf16xe4m3": (jnp.bfloat16, jnp.float8_e4m3fn, jnp.float32), "i8xi8": (jnp.int8, jnp.int8, jnp.int32), "bf16xi8": (jnp.bfloat16, jnp.int8, jnp.bfloat16)}
for t in ["tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v6e", "tpu_v7x"]:
    for name, (xd, wd, od) in cases.items():
        fn = functools.partial(G.ragged_dot, target=t, out_dtype=od, interpret=False)
        specs = (jax.ShapeDtypeStruct((M,K), xd), jax.ShapeDtypeStruct((E,K,N), wd), jax.ShapeDtypeStruct((E,), jnp.int32))
        t0=time.time()
        v = compiler.check(fn, *specs, target=t)
        print(t, name, v.ok, (v.error or "")[:200] if hasattr(v,'error') else v, f"{time.time()-t0:.1f}s", flush=True)
