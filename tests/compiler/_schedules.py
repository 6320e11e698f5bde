"""The program whose final bundle schedules ``tests/compiler/schedules/`` holds, and where.

``python -m tests.compiler._schedules DIR TARGET`` compiles it for TARGET with libtpu
dumping into DIR (a fresh process: libtpu reads its dump flags once).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

#: The checked-in schedules, one directory per target.
SCHEDULES = Path(__file__).with_name("schedules")
#: The libtpu that wrote them.
LIBTPU = "0.0.42.1"
#: The operands' shape and block.
SIZE, BLOCK = 256, 128


def _kernel(x_ref, w_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...]


def tiny_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """An f32 Pallas matmul in (BLOCK, BLOCK) blocks over a (M, N, K) grid."""
    b = BLOCK
    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        _kernel,
        grid=(m // b, n // b, k // b),
        in_specs=[
            pl.BlockSpec((b, b), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((b, b), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((b, b), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
    )(x, w)


def spec() -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((SIZE, SIZE), jnp.float32)


def _write(directory: str, target: str) -> None:
    import emulate.compiler

    emulate.compiler.compile(tiny_matmul, spec(), spec(), target=target)


if __name__ == "__main__":
    out, target = sys.argv[1], sys.argv[2]
    if os.environ.get("EMULATE_SCHEDULES_CHILD"):
        _write(out, target)
    else:
        from emulate.compiler.isolate import dump_args

        env = dict(os.environ, EMULATE_SCHEDULES_CHILD="1", JAX_PLATFORMS="cpu")
        env["LIBTPU_INIT_ARGS"] = " ".join(dump_args(out))
        cmd = [sys.executable, "-m", "tests.compiler._schedules", out, target]
        sys.exit(subprocess.run(cmd, env=env, check=False).returncode)
