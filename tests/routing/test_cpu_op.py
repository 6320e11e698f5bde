"""emulate.routing.cpu_op: the CPU kernel on the route of every front end, decided by
emulate.routing.choose and reported by weight_route and inspect. Nothing here compiles a
kernel (the kernel is not traced where a program is only inspected); the front ends run it
in tests/cpu/test_route.py, beside the lowering tests that compile the same form."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import emulate
import emulate.pallas

K, N = 64, 16
DN = (((1,), (0,)), ((), ()))
_RNG = np.random.default_rng(5)
W = _RNG.standard_normal((K, N)).astype(np.float32)
Q = emulate.quantize(W, "int4", block_shape=32, axis=0, scale_fmt="float16")
X2 = jnp.asarray(_RNG.standard_normal((2, K)), jnp.float32)
XI = jnp.asarray(_RNG.integers(-8, 8, (2, K)), jnp.int8)  # integer x integer: exact, no kernel
TAKEN = (
    "route on cpu (setting 'auto'): cpu.gemv\n"
    "  rhs read as stored by emulate.cpu.gemv where the program is lowered for the CPU; the "
    "XLA route elsewhere"
)


@pytest.fixture(autouse=True)
def _cpu_kernel_on():
    with emulate.use_cpu_kernel(True):  # the suite keeps it off (tests/conftest.py)
        yield


def test_weight_route_reports_the_cpu_kernel_and_why_not():
    assert emulate.weight_route(X2, Q, DN, target="cpu").explain() == TAKEN
    lhs = emulate.weight_route(Q.T, X2.T, (((1,), (0,)), ((), ())), target="cpu")
    assert (lhs.label(), lhs.weight) == ("cpu.gemv", "lhs")
    integer = emulate.weight_route(XI, Q, DN, target="cpu")
    assert (integer.route, integer.kernel_name, integer.reason) == (
        "xla",
        "emulate.cpu.gemv",
        "integer activations: the contract sums integer x integer exactly in int32, the CPU "
        "kernel in float32",
    )
    exact = emulate.weight_route(X2, Q, DN, target="cpu", mode="exact")
    assert exact.reason == "mode 'exact': the CPU kernel gives mode \"fast\"'s result"
    assert emulate.weight_route(Q, Q.T, DN, target="cpu").reason == (
        "two QArrays: the CPU kernel takes one QArray weight"
    )
    with emulate.use_cpu_kernel(False):
        off = emulate.weight_route(X2, Q, DN, target="cpu")
    assert off.reason == (
        "the CPU kernel is switched off (emulate.use_cpu_kernel(False), or the environment "
        "variable EMULATE_CPU_KERNEL=0): emulate.use_cpu_kernel(True) lets it in"
    )
    with emulate.use_route("xla"):
        assert emulate.weight_route(X2, Q, DN, target="cpu").reason == (
            "the route setting is 'xla'"
        )


def test_an_act_order_or_prepared_weight_is_decided_as_its_qarray_is():
    perm = np.random.default_rng(2).permutation(K).astype(np.int32)
    stored = emulate.QArray.from_parts(
        Q.codes, Q.scales, block_shape=Q.block_shape, perm=perm, perm_axis=0
    )
    assert emulate.weight_route(X2, stored, DN, target="cpu").explain() == TAKEN
    q8 = emulate.quantize(W, "int8", block_shape=K, axis=0, scale_fmt="float16")
    prepared = emulate.prepare_weights(q8, target="tpu_v5e")
    assert isinstance(prepared, emulate.pallas.KernelQWeight)
    assert emulate.weight_route(X2, prepared, DN, target="cpu").explain() == TAKEN


def test_inspect_shows_the_cpu_kernel_and_the_sites_kept_off_it():
    report = emulate.inspect(lambda a, b, q: (a @ q, b @ q), X2, XI, Q, target="cpu")
    assert [r.weight_route for r in report.rows] == [
        "cpu.gemv",
        "xla: integer activations: the contract sums integer x integer exactly in int32, the "
        "CPU kernel in float32",
    ]
    text = str(report).splitlines()
    assert text[2].split()[6] == "cpu.gemv"  # the route column
    assert text[4] == "kept off the CPU kernel (emulate.cpu.gemv):"
