"""emulate.cpu.route.kernel_form and the switch (emulate.use_cpu_kernel,
EMULATE_CPU_KERNEL): which contractions the CPU kernel takes, and why not. Plain tracing:
nothing here compiles a kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import bounds, reference
from emulate.cpu import route
from emulate.cpu.form import Orientation

KN = (((1,), (0,)), ((), ()))


def _q() -> emulate.QArray:
    w = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    return emulate.quantize(w, "int4", block_shape=32, axis=0)


def _taken(got: object) -> bool:
    return not isinstance(got, str)


def test_few_rows_without_batch_dimensions() -> None:
    q = _q()
    form = route.kernel_form(q, 1, (route.MAX_ROWS, 64), KN)
    assert not isinstance(form, str) and form.orientation == Orientation.COLUMNS
    assert _taken(route.kernel_form(q, 1, (2, 2, 64), (((2,), (0,)), ((), ()))))
    assert route.kernel_form(q, 1, (0, 64), KN).startswith("0 rows of activations: ")
    assert _taken(route.kernel_form(q, 0, (3, 64), (((0,), (1,)), ((), ()))))
    for empty in ((0, 16), (64, 0)):  # K or N of 0: XLA's route gives the zeros
        e = emulate.quantize(np.ones(empty, np.float32), "int8", axis=0)
        assert route.kernel_form(e, 1, (2, empty[0]), KN) == (
            f"an empty weight (shape {empty}): XLA's route gives its zeros"
        )
    batched = (((2,), (1,)), ((0,), (0,)))
    assert route.kernel_form(q, 1, (1, 2, 64), batched) == (
        "batch dimensions: the CPU kernel multiplies one 2-D weight"
    )
    assert route.kernel_form(emulate.quantize(np.ones((64, 16), np.float32), "int4",
                             block_shape=32, axis=1), 1, (1, 64), KN).startswith(
        "a weight the CPU kernel has no form for"
    )  # fmt: skip


def test_many_rows_where_the_codes_decode_a_vector_step_at_a_time() -> None:
    # more than MAX_ROWS rows: the many-rows kernel (emulate.cpu.gemm), for vector-step
    # forms and, in layout COLUMNS, whole strips of 16 columns
    q = _q()
    assert _taken(route.kernel_form(q, 1, (route.MAX_ROWS + 1, 64), KN))
    assert _taken(route.kernel_form(q, 1, (512, 64), KN))
    narrow = emulate.quantize(np.ones((64, 24), np.float32), "int4", block_shape=32, axis=0)
    assert _taken(route.kernel_form(narrow, 1, (route.MAX_ROWS, 64), KN))
    assert route.kernel_form(narrow, 1, (route.MAX_ROWS + 1, 64), KN) == (
        "17 rows of activations: the CPU kernel takes 1 to 16 for this weight (more where "
        "its codes decode a vector step at a time and, stored (K, N), N is a multiple of 16)"
    )
    odd = emulate.quantize(
        np.ones((63, 16), np.float32), "int4", block_shape=32, axis=0, ragged=True
    )
    assert _taken(route.kernel_form(odd, 1, (route.MAX_ROWS, 63), KN))  # the bit-stream loop
    assert not _taken(route.kernel_form(odd, 1, (route.MAX_ROWS + 1, 63), KN))


def test_integer_activations_keep_the_exact_route() -> None:
    # an int8 per-channel weight times int8 activations: integer x integer, which the
    # contract sums exactly in int32; the kernel sums in float32 (127 * 127 * 2**17 =
    # 2114060288 came out 2113930368; float32 partial sums of 16129 are inexact from
    # 1041 terms on), so it refuses integer activations
    assert route.kernel_form(_q(), 1, (1, 64), KN, other_integer=True) == (
        "integer activations: the contract sums integer x integer exactly in int32, the CPU "
        "kernel in float32"
    )
    k = 2**12
    w = emulate.QArray.from_parts(
        np.full((k, 8), 127, np.int8), np.ones((1, 8), np.float32), block_shape=(k, 1)
    )
    x = jnp.full((1, k), 127, jnp.int8)
    with emulate.use_cpu_kernel(True):
        assert "emulate_cpu_gemv_" not in _lowered(x, w)
        got = jax.jit(lambda x: emulate.dot_general(x, w, KN))(x)
    assert np.asarray(got).tolist() == [[127 * 127 * 2**12] * 8]


@pytest.mark.long  # a numba compile of the weight's form (some 20 s on 2 cores)
def test_float_activations_take_the_kernel_for_the_same_weight() -> None:
    # the control of the test above: the same weight with float32 activations is the
    # kernel's
    k = 2**12
    w = emulate.QArray.from_parts(
        np.full((k, 8), 127, np.int8), np.ones((1, 8), np.float32), block_shape=(k, 1)
    )
    with emulate.use_cpu_kernel(True):
        assert "emulate_cpu_gemv_" in _lowered(jnp.full((1, k), 127, jnp.float32), w)


def _lowered(x, q) -> str:
    f = jax.jit(lambda x: emulate.dot_general(x, q, KN, preferred_element_type=jnp.float32))
    return f.lower(x).as_text()


def _front_ends_run_the_kernel_within_the_bound() -> None:
    """The route of emulate.routing (routing/test_cpu_op.py: its decisions) runs the kernel:
    dot_general, matmul, einsum and polyfill, against the oracle's values and mode "fast"'s
    bound, beside the XLA route; the gradient is the XLA route's."""
    q, x = _q(), jnp.asarray(np.random.default_rng(3).standard_normal((2, 64)), jnp.float32)
    w = reference.dequantize(
        np.asarray(emulate.unpack(q.codes)), np.asarray(q.scales), q.block_shape
    ).astype(np.float64)
    xv = np.asarray(x, np.float64)
    bound = bounds.dot_general_bound(xv, w, KN, extra_terms=64 // 32 + 4)
    with emulate.use_cpu_kernel(True):
        f = jax.jit(lambda x: emulate.dot_general(x, q, KN, preferred_element_type=jnp.float32))
        assert f.lower(x).as_text().count("stablehlo.custom_call @emulate_cpu_gemv_") == 1
        got = {
            "dot_general": f(x),
            "matmul": emulate.matmul(x, q),
            "einsum": emulate.einsum("mk,kn->mn", x, q),
            "polyfill": emulate.polyfill(lambda x, q: x @ q, target="cpu")(x, q),
        }
        with emulate.use_route("xla"):
            got["xla"] = emulate.matmul(x, q)
        g = jax.grad(lambda x: emulate.matmul(x, q).sum())(x)
    for name, y in got.items():
        assert y.shape == (2, 16) and y.dtype == jnp.float32, name
        assert np.all(np.abs(np.asarray(y, np.float64) - xv @ w) <= bound), name
    assert np.allclose(np.asarray(g), np.broadcast_to(w.sum(axis=1), (2, 64)), rtol=1e-6)


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
    _front_ends_run_the_kernel_within_the_bound()  # the same form: compiled once


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
        [sys.executable, "-c", "import emulate.routing.setting"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ValueError: EMULATE_CPU_KERNEL: expected '0' or '1', got 'yes'"
    )


def test_the_environment_value_is_read_once_at_the_first_decision() -> None:
    # set after `import emulate` (as a conftest.py does when pytest's plugin imported
    # emulate first): the first decision reads it, later changes do not count
    env = {k: v for k, v in os.environ.items() if k != "EMULATE_CPU_KERNEL"}
    code = (
        "import os\n"
        "from emulate.routing import setting\n"
        "os.environ['EMULATE_CPU_KERNEL'] = '0'\n"
        "print(setting.cpu_kernel_enabled())\n"
        "os.environ['EMULATE_CPU_KERNEL'] = '1'\n"
        "print(setting.cpu_kernel_enabled())\n"
        "with setting.use_cpu_kernel(True):\n"
        "    print(setting.cpu_kernel_enabled())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "False", "True"]


def test_numbas_compiler_switched_off_keeps_xla_s_route(monkeypatch) -> None:
    # NUMBA_DISABLE_JIT=1 (numba's debugging switch) made the kernel's cfunc fail to type
    # its Python helpers: a raw numba TypingError from inside the contraction
    import numba

    import emulate.cpu

    x = np.random.default_rng(1).normal(size=(2, 64)).astype(np.float32)
    q = _q()
    with emulate.use_cpu_kernel(False):
        want = np.asarray(emulate.matmul(x, q))
    emulate.cpu.unavailable.cache_clear()
    try:
        with monkeypatch.context() as m:
            m.setattr(numba.config, "DISABLE_JIT", True)
            assert route.kernel_form(q, 1, x.shape, KN) == (
                "NUMBA_DISABLE_JIT is set: numba compiles nothing, and XLA calls the CPU "
                "kernel as compiled code"
            )
            assert emulate.cpu.available() is False
            with emulate.use_cpu_kernel(True):
                got = np.asarray(emulate.matmul(x, q))
    finally:
        emulate.cpu.unavailable.cache_clear()
    np.testing.assert_array_equal(got, want)
    assert emulate.cpu.available()
