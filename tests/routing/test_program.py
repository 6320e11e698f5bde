"""emulate.routing.program: the kernel traced once per op, structure and shapes, in a cache
of at most ``CACHED`` programs (least recently used dropped)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import emulate
from emulate.routing import program

Q = emulate.quantize(
    np.random.default_rng(0).standard_normal((256, 128)).astype(np.float32),
    "int8",
    block_shape=32,
    axis=0,
    scale_fmt="float16",
)
DN = (((1,), (0,)), ((), ()))


def _route(rows: int) -> None:
    r = emulate.weight_route(jnp.ones((rows, 256), jnp.bfloat16), Q, DN, target="tpu_v5e")
    assert r is not None and r.route == "kernel"


def test_the_cache_keeps_the_most_recently_used_programs(monkeypatch) -> None:
    monkeypatch.setattr(program, "CACHED", 3)
    monkeypatch.setattr(program, "_PROGRAMS", type(program._PROGRAMS)())
    for rows in (1, 2, 3, 4, 1, 5):  # 1 used again after 4: 2 and 3 are the oldest
        _route(rows)
    kept = [key[2][0][0][0] for key in program._PROGRAMS]  # x's rows, in use order
    assert kept == [4, 1, 5]
