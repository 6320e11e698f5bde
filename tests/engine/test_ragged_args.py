"""emulate.engine.ragged_args: the one validator of ragged_dot_general calls."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import emulate
from emulate.engine.ragged_args import BASIC, ragged_args

E4 = jnp.float8_e4m3fn


def _rdn(dn, ragged, group):
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=dn, lhs_ragged_dimensions=ragged, rhs_group_dimensions=group
    )


@pytest.mark.parametrize(
    ("lhs", "rhs", "gs", "rdn", "mode", "prefix", "out"),
    [
        ((11, 5), (3, 5, 7), (3,), BASIC, "noncontracting", (), (11, 7)),
        (
            (11, 5),
            (5, 7),
            (3,),
            _rdn((([1], [0]), ([], [])), [1], []),
            "contracting",
            (),
            (3, 11, 7),
        ),
        (
            (2, 11, 5),
            (2, 5, 7),
            (2, 3),
            _rdn((([2], [1]), ([0], [0])), [2], []),
            "contracting",
            (0,),
            (3, 2, 11, 7),
        ),
        (
            (2, 11, 5),
            (3, 2, 5, 7),
            (2, 3),
            _rdn((([2], [2]), ([0], [1])), [1], [0]),
            "noncontracting",
            (0,),
            (2, 11, 7),
        ),
        (
            (4, 6, 5),
            (4, 5, 7),
            (3,),
            _rdn((([2], [1]), ([0], [0])), [0], []),
            "batch",
            (),
            (4, 6, 7),
        ),
    ],
)
def test_modes_prefixes_and_result_shapes_are_jaxs(lhs, rhs, gs, rdn, mode, prefix, out) -> None:
    # Shapes and modes of jax-ml/jax tests/lax_test.py (RaggedTest,
    # test_ragged_dot_general_shape_inference_success, commit cec06d116c05f0d5).
    call = ragged_args(jnp.zeros(lhs, E4), jnp.zeros(rhs, E4), jnp.ones(gs, jnp.int32), rdn)
    assert (call.mode, call.prefix, call.out_shape) == (mode, prefix, out)
    assert call.dot.result == "float8_e4m3fn"
    assert call.rhs_group == (rdn.rhs_group_dimensions[0] if mode == "noncontracting" else None)


def test_the_tag_counts_each_row_against_its_own_group() -> None:
    call = ragged_args(
        jnp.zeros((10, 9), E4),
        jnp.zeros((3, 9, 8), E4),
        jnp.array([3, 3, 4]),
        BASIC,
        target="tpu_v4",
    )
    tag = call.tag()
    assert tag.op == "ragged_dot_general"
    assert (tag.lhs, tag.rhs, tag.out, tag.target) == (
        "float8_e4m3fn[10,9]",
        "float8_e4m3fn[3,9,8]",
        "float8_e4m3fn",
        "tpu_v4",
    )
    assert tag.flops == 2 * 10 * 9 * 8


def test_a_stacked_qarray_names_its_scheme_in_the_tag() -> None:
    q = emulate.quantize(jnp.ones((2, 64, 8)), emulate.mx.MXFP4, axis=1)
    call = ragged_args(jnp.zeros((4, 64), jnp.bfloat16), q, jnp.array([1, 3]), BASIC)
    assert call.tag().rhs == "float4_e2m1fn[2,64,8]:MXFP4"
    assert call.dot.result == "float32"


@pytest.mark.parametrize(
    ("gs", "kind", "message"),
    [
        (
            np.array([1.0, 2.0]),
            TypeError,
            "group_sizes: expected an array of integers (the "
            "number of rows in each group), got float64[2]",
        ),
        (
            np.array(3, np.int32),
            TypeError,
            "group_sizes: expected an array of rank >= 1 (one "
            "size per group, shape (g,)), got a scalar int32",
        ),
    ],
)
def test_group_sizes_of_the_wrong_type_are_refused(gs, kind, message) -> None:
    with pytest.raises(kind) as e:
        ragged_args(jnp.zeros((4, 3), E4), jnp.zeros((2, 3, 5), E4), gs, BASIC)
    assert str(e.value) == message


def test_dimension_numbers_of_another_type_are_refused() -> None:
    with pytest.raises(
        TypeError,
        match=r"^ragged_dot_dimension_numbers: expected a "
        r"jax.lax.RaggedDotDimensionNumbers, got tuple",
    ):
        ragged_args(
            jnp.zeros((4, 3), E4),
            jnp.zeros((2, 3, 5), E4),
            jnp.array([1, 1]),
            (((1,), (1,)), ((), ())),
        )


def test_a_qarray_lhs_with_a_ragged_contraction_is_refused() -> None:
    q = emulate.quantize(jnp.ones((4, 64)), emulate.mx.MXFP4, axis=1)
    rdn = _rdn((([1], [0]), ([], [])), [1], [])
    with pytest.raises(
        TypeError,
        match=r"^lhs: a QArray lhs is not built for a ragged "
        r"contracting dimension",
    ):
        ragged_args(q, jnp.zeros((64, 8), E4), jnp.array([32, 32]), rdn)
