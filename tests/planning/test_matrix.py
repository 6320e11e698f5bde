"""planning.matrix.method_matrix: the plan of every pair on every target at once."""

from __future__ import annotations

import numpy as np
import pytest

import emulate
from emulate import formats, targets
from emulate.planning.matrix import NO_ROUTE, MethodCell, method_matrix

LOW = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]


def test_default_is_every_target_and_operand_format_with_itself():
    cells = method_matrix()
    assert [(c.target, c.lhs, c.rhs) for c in cells] == [
        (t, f, f) for t in targets.names() for f in LOW
    ]
    for c in cells:
        p = emulate.plan(c.lhs, c.rhs, target=c.target, preferred_element_type="float32")
        fallback = None if p.fallback is None else p.fallback.method
        native = targets.get(c.target).supports(c.lhs, c.rhs)
        assert c == (c.target, c.lhs, c.rhs, p.method, native, fallback, p.platform), c


def test_known_cells():
    by = {(c.target, c.rhs): c for c in method_matrix(["v5e", "v4", "cpu", "v7x"], LOW)}
    # int4 x int4 is native on v5e; the host CPU cannot compile it, so the program lowered
    # for any other platform takes the int8 route.
    assert by["tpu_v5e", "int4"] == MethodCell(
        "tpu_v5e", "int4", "int4", "native", True, "int8", "tpu"
    )
    # fp8 pairs compile on v5e, but JAX's table gives it no fp8 rate: bf16 is faster.
    e4m3 = by["tpu_v5e", "float8_e4m3fn"]
    assert (e4m3.method, e4m3.native, e4m3.passed_over) == ("bf16", True, True)
    assert by["tpu_v5e", "float4_e2m1fn"][3:] == ("int8", False, None, "tpu")
    assert not by["tpu_v5e", "float4_e2m1fn"].passed_over
    assert by["tpu_v4", "int8"][3:] == ("bf16", False, None, "tpu")
    assert by["tpu_v7x", "float8_e4m3fn"][3:] == ("native", True, None, "tpu")
    assert by["cpu", "int4"][3:] == ("int8", False, None, "cpu")
    assert by["cpu", "float8_e5m2"][3:] == ("native", True, None, "cpu")
    passed = sorted((c.target, c.rhs) for c in by.values() if c.passed_over)
    assert passed == [
        ("tpu_v5e", "float8_e4m3b11fnuz"),
        ("tpu_v5e", "float8_e4m3fn"),
        ("tpu_v5e", "float8_e5m2"),
    ]


def test_left_operand_and_order():
    cells = method_matrix([targets.get("v2"), "h100", "v2"], [np.int8, "e2m1"], lhs="bf16")
    assert [tuple(c[:4]) for c in cells] == [
        ("tpu_v2", "bfloat16", "int8", "f32"),
        ("tpu_v2", "bfloat16", "float4_e2m1fn", "f32"),
        ("gpu_sm90", "bfloat16", "int8", "bf16"),
        ("gpu_sm90", "bfloat16", "float4_e2m1fn", "bf16"),
        ("tpu_v2", "bfloat16", "int8", "f32"),
        ("tpu_v2", "bfloat16", "float4_e2m1fn", "f32"),
    ]
    assert not any(c.native or c.passed_over for c in cells)


def test_no_route():
    # A scale type is no matmul operand: emulate.plan raises ValueError.
    (c,) = method_matrix(["v5e"], ["float8_e8m0fnu"])
    assert c == MethodCell("tpu_v5e", "float8_e8m0fnu", "float8_e8m0fnu", "none", False, None, None)
    assert c.method == NO_ROUTE and not c.passed_over
    # Mode "exact" is not built for int32 x int32: NotImplementedError, no route either.
    (c,) = method_matrix(["cpu"], ["int32"], preferred_element_type=None, mode="exact")
    assert c == MethodCell("cpu", "int32", "int32", "none", False, None, None)
    (c,) = method_matrix(["cpu"], ["int32"], preferred_element_type=None)
    assert c == MethodCell("cpu", "int32", "int32", "native", False, None, "cpu")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"targets": ["tpu_v99"]}, r"^target: unknown target 'tpu_v99'; known targets: "),
        ({"formats": ["fp7"]}, r"^fmt: unknown format 'fp7'"),
        ({"lhs": "fp7"}, r"^fmt: unknown format 'fp7'"),
        ({"preferred_element_type": "f7"}, r"^fmt: unknown format 'f7'"),
        ({"mode": "quick"}, r"^mode: expected one of 'fast', 'exact', got 'quick'$"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        method_matrix(**{"targets": ["cpu"], "formats": ["int8"], **kwargs})
