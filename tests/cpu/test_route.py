"""emulate.cpu.route and the switch (emulate.use_cpu_kernel, EMULATE_CPU_KERNEL): which
contractions the CPU kernel takes. Plain tracing: nothing here compiles a kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate.cpu import route
from emulate.cpu.form import Orientation

KN = (((1,), (0,)), ((), ()))


def _q() -> emulate.QArray:
    w = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    return emulate.quantize(w, "int4", block_shape=32, axis=0)


def test_few_rows_without_batch_dimensions() -> None:
    q = _q()
    assert route.choose(q, 1, (route.MAX_ROWS, 64), KN).orientation == Orientation.COLUMNS
    assert route.choose(q, 1, (2, 2, 64), (((2,), (0,)), ((), ()))) is not None
    assert route.choose(q, 1, (0, 64), KN) is None
    for empty in ((0, 16), (64, 0)):  # K or N of 0: XLA's route gives the zeros
        e = emulate.quantize(np.ones(empty, np.float32), "int8", axis=0)
        assert route.choose(e, 1, (2, empty[0]), KN) is None
    assert route.choose(q, 0, (3, 64), (((0,), (1,)), ((), ()))) is not None
    batched = (((2,), (1,)), ((0,), (0,)))
    assert route.choose(q, 1, (1, 2, 64), batched) is None


def test_many_rows_where_the_codes_decode_a_vector_step_at_a_time() -> None:
    # more than MAX_ROWS rows: the many-rows kernel (emulate.cpu.gemm), for vector-step
    # forms and, in layout COLUMNS, whole strips of 16 columns
    q = _q()
    assert route.choose(q, 1, (route.MAX_ROWS + 1, 64), KN) is not None
    assert route.choose(q, 1, (512, 64), KN) is not None
    narrow = emulate.quantize(np.ones((64, 24), np.float32), "int4", block_shape=32, axis=0)
    assert route.choose(narrow, 1, (route.MAX_ROWS, 64), KN) is not None
    assert route.choose(narrow, 1, (route.MAX_ROWS + 1, 64), KN) is None
    odd = emulate.quantize(
        np.ones((63, 16), np.float32), "int4", block_shape=32, axis=0, ragged=True
    )
    assert route.choose(odd, 1, (route.MAX_ROWS, 63), KN) is not None  # the bit-stream loop
    assert route.choose(odd, 1, (route.MAX_ROWS + 1, 63), KN) is None


def test_integer_activations_keep_the_exact_route() -> None:
    # an int8 per-channel weight times int8 activations: integer x integer, which the
    # contract sums exactly in int32; the kernel sums in float32 (127 * 127 * 2**17 =
    # 2114060288 came out 2113930368), so it refuses integer activations
    assert route.choose(_q(), 1, (1, 64), KN, other_integer=True) is None
    k = 2**17
    w = emulate.QArray.from_parts(
        np.full((k, 8), 127, np.int8), np.ones((1, 8), np.float32), block_shape=(k, 1)
    )
    x = jnp.full((1, k), 127, jnp.int8)
    with emulate.use_cpu_kernel(True):
        assert "emulate_cpu_gemv_" in _lowered(x.astype(jnp.float32), w)
        assert "emulate_cpu_gemv_" not in _lowered(x, w)
        got = jax.jit(lambda x: emulate.dot_general(x, w, KN))(x)
    assert np.asarray(got).tolist() == [[2114060288.0] * 8]


def _lowered(x, q) -> str:
    f = jax.jit(lambda x: emulate.dot_general(x, q, KN, preferred_element_type=jnp.float32))
    return f.lower(x).as_text()


def test_the_switch_and_the_xla_route_setting() -> None:
    q, x = _q(), jnp.ones((2, 64), jnp.float32)
    with emulate.use_cpu_kernel(True):
        assert "emulate_cpu_gemv_" in _lowered(x, q)
        with emulate.use_route("xla"):
            assert "emulate_cpu_gemv_" not in _lowered(x, q)
        with emulate.use_cpu_kernel(False):
            assert "emulate_cpu_gemv_" not in _lowered(x, q)
    # another target's plan: the planned route, not the CPU's kernel
    with emulate.use_cpu_kernel(True), emulate.use_target("tpu_v5e"):
        assert "emulate_cpu_gemv_" not in _lowered(x, q)
    with pytest.raises(TypeError, match="^enabled: expected a bool, got int 1$"):
        with emulate.use_cpu_kernel(1):  # type: ignore[arg-type]
            pass


def test_a_thread_unsafe_layer_keeps_the_kernel_on_one_thread(monkeypatch) -> None:
    import numba

    import emulate.cpu

    emulate.cpu.parallel.cache_clear()
    monkeypatch.setattr(numba.config, "THREADING_LAYER", "workqueue")
    try:
        assert emulate.cpu.parallel() is False
    finally:
        emulate.cpu.parallel.cache_clear()


def test_a_bad_environment_value_names_the_variable() -> None:
    env = {**os.environ, "EMULATE_CPU_KERNEL": "yes", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", "import emulate.route_setting"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ValueError: EMULATE_CPU_KERNEL: expected '0' or '1', got 'yes'"
    )
