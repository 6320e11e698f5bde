"""The deprecated path emulate.kernel_route: every old name still resolves, to the new
object (or, for the old signatures kept, the same answer), with a DeprecationWarning that
names its new home. (emulate.route_setting and emulate.pallas.route are emulate.moved's
stand-ins: tests/test_moved.py.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import emulate
import emulate.kernel_route
from emulate import routing
from emulate.engine.args import dot_args

DN = (((1,), (0,)), ((), ()))
Q = emulate.quantize(np.ones((256, 128), np.float32), "int8", block_shape=32, axis=0)
X = jnp.ones((4, 256), jnp.bfloat16)


def _old(module, name: str):
    with pytest.warns(DeprecationWarning) as seen:
        value = getattr(module, name)
    return value, str(seen[0].message)


@pytest.mark.parametrize(
    "name, new",
    [
        ("use_route", "emulate.routing.use_route"),
        ("weight_route", "emulate.routing.weight_route"),
        ("prepare_weights", "emulate.routing.prepare_weights"),
        ("unprepared", "emulate.routing.unprepared"),
        ("tpu_may_lower", "emulate.routing.tpu_may_lower"),
        ("weight_side", "emulate.routing.ops.weight_side"),
        ("choose", "emulate.routing.choose (call, op)"),
    ],
)
def test_kernel_route_names_resolve_to_their_new_home(name, new):
    value, message = _old(emulate.kernel_route, name)
    assert message == f"emulate.kernel_route.{name} is deprecated: use {new}"
    home, _, attr = new.split(" ")[0].rpartition(".")
    assert value is getattr(__import__(home, fromlist=[attr]), attr)


def test_kernel_route_keeps_decide_with_its_old_signature():
    decide, message = _old(emulate.kernel_route, "decide")
    assert message == (
        "emulate.kernel_route.decide is deprecated: use "
        "emulate.routing.choose(call, emulate.routing.dot_op(call))"
    )
    call = dot_args(X, Q, DN, target="tpu_v5e")
    with routing.planning():
        assert decide(call) == routing.choose(call, routing.dot_op(call))
        assert decide(call).label() == "pallas.matmul"
