"""emulate.context: the target and mode a block sets follow asyncio tasks (and threads),
and jax.jit's key follows them; a trace under another task's key is refused.

Programs are compared by their matmul sites against the same call made with ``target=``
(emulate's own direct call), as in test_targets_context.
"""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import program, targets

RNG = np.random.default_rng(28)
A8 = jnp.asarray(RNG.integers(-128, 128, (4, 64)), jnp.int8)
B8 = jnp.asarray(RNG.integers(-128, 128, (64, 8)), jnp.int8)
WANT8 = np.asarray(A8).astype(np.int64) @ np.asarray(B8).astype(np.int64)
DN = (((1,), (0,)), ((), ()))


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("EMULATE_TARGET", raising=False)


def sites(fn, *args):
    return [
        (s.primitive, s.lhs_dtype, s.rhs_dtype, s.lhs_shape, s.rhs_shape)
        for s in program.sites(jax.make_jaxpr(fn)(*args))
    ]


def idot(a, b, **kw):
    return emulate.dot_general(a, b, DN, preferred_element_type=jnp.int32, **kw)


def _gather(*coroutines):
    async def main():
        return await asyncio.gather(*coroutines)

    return asyncio.run(main())


def test_asyncio_tasks_see_their_own_blocks():
    # Each task enters its block, then waits while the others enter theirs: a thread-local
    # setting would show every task the last one entered ('tpu_v4' three times).
    async def task(name, mode):
        with emulate.target(name), emulate.use_mode(mode):
            await asyncio.sleep(0)
            seen = (emulate.current_target().name, emulate.current_mode())
            await asyncio.sleep(0)
            return seen, (emulate.current_target().name, emulate.current_mode())

    pairs = [("cpu", "exact"), ("tpu_v5e", "fast"), ("tpu_v4", "exact")]
    got = _gather(*(task(n, m) for n, m in pairs))
    assert got == [(p, p) for p in pairs]
    host = targets.from_device(jax.devices()[0]).name
    assert (emulate.current_target().name, emulate.current_mode()) == (host, "fast")
    # the blocks left in another order than they were entered: jit's key is the host's again
    f = jax.jit(idot)
    assert sites(f, A8, B8) == sites(lambda a, b: idot(a, b, target=host), A8, B8)


def test_asyncio_tasks_jit_for_their_own_target():
    f = jax.jit(idot)

    async def task(name):
        await asyncio.sleep(0)
        with emulate.target(name):
            return sites(f, A8, B8)

    got = _gather(task("tpu_v5e"), task("tpu_v4"), task("tpu_v5e"))
    want = {n: sites(lambda a, b, n=n: idot(a, b, target=n), A8, B8) for n in ("tpu_v4", "tpu_v5e")}
    assert got == [want["tpu_v5e"], want["tpu_v4"], want["tpu_v5e"]]
    assert want["tpu_v5e"] != want["tpu_v4"]


def test_tracing_under_another_tasks_jit_key_is_refused():
    # Task a resumes inside its block after task b entered its own: jax.jit's key (per
    # thread) is b's, a program traced now would be cached under it.
    order = []

    async def a():
        with emulate.target("tpu_v5e"):
            order.append("a in")
            await asyncio.sleep(0)
            with pytest.raises(
                RuntimeError,
                match=r"^emulate.target: this code is traced under "
                r"target tpu_v5e, but jax.jit's cache key in this thread holds "
                r"tpu_v4 ",
            ):
                jax.jit(lambda a, b: idot(a, b))(A8, B8)  # a function not traced before
            # an explicit target and mode do not read the context
            return np.asarray(
                jax.jit(lambda a, b: idot(a, b, target="tpu_v5e", mode="fast"))(A8, B8)
            )

    async def b():
        with emulate.target("tpu_v4"):
            order.append("b in")
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    got, _ = _gather(a(), b())
    assert order == ["a in", "b in"]
    np.testing.assert_array_equal(got, WANT8)
