"""The front ends' validators (emulate.engine.args): each rule accepted, refused with its
exact type and message, and the edge cases (K = 0, 0-d operands, batch dimensions, None
dimension numbers, integer results of float operands, QArray operands)."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import emulate
from emulate import formats, mx
from emulate.engine import args
from emulate.engine.operands import Operand

DN = (((1,), (0,)), ((), ()))
E4 = ml_dtypes.float8_e4m3fn


def _q(shape=(64, 8), axis=0):
    return emulate.quantize(np.ones(shape, np.float32), mx.MXFP4, axis=axis)


# --- dot_general -------------------------------------------------------------------------


def test_dot_record_of_a_plain_call():
    call = args.dot_args(
        np.ones((2, 3), np.int8),
        np.ones((3, 5), np.int8),
        [[[1], [0]], [[], []]],
        precision=["highest", "highest"],
        target="tpu_v4",
        mode="exact",
    )
    assert call.dimension_numbers == (((1,), (0,)), ((), ()))
    assert call.precision == ("highest", "highest")
    assert (call.result, call.wrap_to, call.k) == ("int8", None, 3)
    assert (call.target.name, call.mode, call.has_qarray) == ("tpu_v4", "exact", False)
    assert isinstance(call.lhs, Operand) and call.lhs.format_name == "int8"
    assert call.tag().name() == (
        "emulate(dot_general int8[2,3] x int8[3,5] -> int8 on tpu_v4 mode exact flops 60)"
    )


def test_none_dimension_numbers_are_lax_dot():
    for ls, rs, want in [
        ((2, 3), (3, 5), (((1,), (0,)), ((), ()))),
        ((3,), (3, 5), (((0,), (0,)), ((), ()))),
        ((2, 3), (3,), (((1,), (0,)), ((), ()))),
        ((3,), (3,), (((0,), (0,)), ((), ()))),
    ]:
        got = args.dot_args(np.ones(ls, E4), np.ones(rs, E4), None).dimension_numbers
        assert got == want
        x, y = np.arange(math.prod(ls)).reshape(ls), np.arange(math.prod(rs)).reshape(rs)
        want_values = lax.dot_general(x, y, None)
        assert lax.dot_general(x, y, got).tolist() == want_values.tolist()
    with pytest.raises(
        ValueError,
        match=r"^dimension_numbers: None stands for a plain matrix-matrix, matrix-vector or "
        r"vector-vector product \(as in lax\.dot\); pass them for shapes \(1, 2, 3\) and "
        r"\(1, 3, 5\)$",
    ):
        args.dot_args(np.ones((1, 2, 3), E4), np.ones((1, 3, 5), E4), None)


def test_k_zero_and_zero_d_operands():
    call = args.dot_args(np.ones((4, 0), E4), np.ones((0, 3), E4), DN)
    assert call.k == 0 and call.tag().flops == 0
    scalar = args.dot_args(np.ones((), E4), np.ones((), E4), (((), ()), ((), ())))
    assert scalar.k == 1 and scalar.result == "float8_e4m3fn" and scalar.tag().flops == 2


def test_batch_dimensions():
    dn = (((2,), (1,)), ((0,), (0,)))
    call = args.dot_args(np.ones((2, 3, 4), np.int8), np.ones((2, 4, 5), ml_dtypes.int4), dn)
    assert call.k == 4 and call.result == "int8"
    assert call.tag().flops == 2 * 2 * 3 * 5 * 4


def _jax_error(ls, rs, dn):
    try:
        jax.eval_shape(
            lambda x, y: lax.dot_general(x, y, dn),
            jax.ShapeDtypeStruct(ls, jnp.float32),
            jax.ShapeDtypeStruct(rs, jnp.float32),
        )
    except (TypeError, ValueError) as e:
        return type(e)
    return None


@given(
    ls=st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple),
    rs=st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple),
    dims=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    counts=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 1), st.integers(0, 1)),
)
def test_dimension_numbers_are_refused_with_jax_types(ls, rs, dims, counts):
    lc, rc, lb, rb = (tuple(dims[i : i + n]) for i, n in zip(range(4), counts, strict=True))
    dn = ((lc, rc), (lb, rb))
    want = _jax_error(ls, rs, dn)
    a, b = np.zeros(ls, E4), np.zeros(rs, E4)
    if want is None:
        call = args.dot_args(a, b, dn)
        assert call.dimension_numbers == dn
        assert call.k == math.prod(ls[d] for d in lc)
    else:
        with pytest.raises(want, match=r"^dimension_numbers: .*; lhs float8_e4m3fn\["):
            args.dot_args(a, b, dn)


def test_contracting_size_mismatch_message():
    with pytest.raises(
        TypeError,
        match=r"^dimension_numbers: lhs contracting dimension 1 has size 3 but rhs contracting "
        r"dimension 0 has size 4; lhs int8\[2, 3\], rhs int4\[4, 5\], target cpu$",
    ):
        args.dot_args(np.ones((2, 3), np.int8), np.ones((4, 5), ml_dtypes.int4), DN, target="cpu")


# --- preferred_element_type --------------------------------------------------------------


def test_preferred_reads_formats_and_jax_types():
    assert args.preferred(None) is None
    assert args.preferred("bf16") == "bfloat16"
    assert args.preferred(jnp.float8_e4m3fn) == "float8_e4m3fn"
    assert args.preferred(jnp.int16) == "int16"  # wrapped into by the front ends
    assert args.preferred(np.complex64) == "complex64"  # handed to JAX


@pytest.mark.parametrize("bad", ["junk", 5, "int9"])
def test_preferred_that_is_no_type_is_a_type_error_as_in_lax(bad):
    with pytest.raises(TypeError):
        lax.dot_general(np.ones((1, 2), np.float32), np.ones((2, 1), np.float32), DN, None, bad)
    with pytest.raises(TypeError, match=r"^preferred_element_type: "):
        args.preferred(bad)


def test_unknown_preferred_message():
    known = ", ".join(formats.names())
    msg = f"preferred_element_type: unknown format 'junk'; known formats: {known}"
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        args.dot_args(np.ones((1, 2), E4), np.ones((2, 1), E4), DN, preferred_element_type="junk")


def test_integer_result_of_float_operands():
    # lax.dot_general truncates the float sum toward zero ...
    x = np.array([[1.5, 1.25]], np.float32)
    y = np.array([[1.0], [1.0]], np.float32)
    assert lax.dot_general(x, y, DN, preferred_element_type=jnp.int32).tolist() == [[2]]
    # ... which emulate's front end hands to JAX where it has nothing to add ...
    got = emulate.dot_general(x, y, DN, preferred_element_type=jnp.int32, target="cpu")
    assert got.dtype == jnp.int32 and got.tolist() == [[2]]
    # ... and refuses where it plans the sum (rounded once, never truncated), as the plans,
    # the oracle and lax.conv_general_dilated do, with the same type.
    msg = (
        r"^preferred_element_type: an integer result \(int32\) needs integer operands, got "
        r"float8_e4m3fn x float8_e4m3fn$"
    )
    a = np.ones((1, 2), E4)
    for refuse in (
        lambda: args.dot_args(a, a.T, DN, preferred_element_type=jnp.int32),
        lambda: emulate.plan(E4, E4, preferred_element_type="int32"),
        lambda: emulate.reference.dot_general(a, a.T, DN, preferred_element_type="int32"),
        lambda: formats.result_format(E4, E4, "int32"),
    ):
        with pytest.raises(TypeError, match=msg):
            refuse()
    with pytest.raises(TypeError, match="preferred_element_type"):
        lax.conv_general_dilated(
            np.ones((1, 1, 2), np.float32),
            np.ones((1, 1, 1), np.float32),
            (1,),
            "VALID",
            preferred_element_type=jnp.int32,
        )


def test_narrow_integer_results_wrap_from_int32():
    a = np.ones((2, 3), np.int8)
    call = args.dot_args(a, a.T, DN, preferred_element_type=np.uint16)
    assert (call.result, call.wrap_to) == ("int32", "uint16")
    call = args.dot_args(a, a.T, DN, preferred_element_type=np.int32)
    assert (call.result, call.wrap_to) == ("int32", None)


def test_a_result_xla_cannot_hold():
    a = np.zeros((1, 2), ml_dtypes.float6_e3m2fn)
    with pytest.raises(
        ValueError,
        match=r"^preferred_element_type: the result type would be float6_e3m2fn, which XLA "
        r"cannot hold; pass preferred_element_type \(e\.g\. jnp\.float32 or jnp\.bfloat16\)$",
    ):
        args.dot_args(a, a.T, DN)
    assert args.dot_args(a, a.T, DN, preferred_element_type="float32").result == "float32"


# --- QArray operands ---------------------------------------------------------------------


def test_qarray_record():
    q = _q()
    call = args.dot_args(np.ones((2, 64), np.float32), q, DN, target="tpu_v5e")
    assert call.has_qarray and call.rhs is q and call.result == "float32" and call.k == 64
    assert call.tag().rhs == "float4_e2m1fn[64,8]:MXFP4"
    # an integer result converts the f32 sum toward zero, as lax does
    pet = args.dot_args(np.ones((2, 64), np.float32), q, DN, preferred_element_type="int32")
    assert pet.result == "int32"
    with pytest.raises(
        ValueError,
        match=r"^preferred_element_type: the result of a QArray matmul must be float32, "
        r"bfloat16, float16 or int32, got float8_e4m3fn$",
    ):
        args.dot_args(q, q, (((0,), (0,)), ((), ())), preferred_element_type=E4)


def test_a_qarray_carries_its_format():
    q = _q()
    with pytest.raises(
        ValueError,
        match=r"^rhs_format: a QArray carries its format \(float4_e2m1fn\); pass rhs_format "
        r"only with uint8 codes, got rhs_format='int8'$",
    ):
        args.dot_args(np.ones((2, 64), np.float32), q, DN, rhs_format="int8")
    assert args.with_format(q, None, "b") is q


def test_qarray_contraction_mismatch_has_the_plain_rule_and_type():
    q = _q()
    for rhs in (q, np.ones((64, 8), E4)):
        with pytest.raises(TypeError, match=r"^dimension_numbers: lhs contracting dimension 1"):
            args.dot_args(np.ones((2, 32), np.float32), rhs, DN)


# --- matmul ------------------------------------------------------------------------------


def test_matmul_operands():
    q = _q()
    x, y = args.matmul_operands(np.ones((64,), E4), q, None, None)
    assert isinstance(x, Operand) and x.shape == (64,) and y is q
    with pytest.raises(
        ValueError,
        match=r"^a, b: matmul needs operands of at least one dimension, got shapes \(\) and "
        r"\(64, 8\)$",
    ):
        args.matmul_operands(np.ones((), E4), _q(), None, None)
    with pytest.raises(ValueError, match=r"^matmul input operand 0 must have ndim at least 1"):
        jnp.matmul(np.ones(()), np.ones((2, 2)))  # JAX's type for it
    with pytest.raises(
        TypeError,
        match=r"^a, b: matmul contracts a's last dimension \(32\) with b's second to last "
        r"\(64\); a float32\[2, 32\], b float4_e2m1fn\[64, 8\]$",
    ):
        args.matmul_operands(np.ones((2, 32), np.float32), _q(), None, None)
    with pytest.raises(
        ValueError,
        match=r"^a, b: matmul of a QArray needs equal batch dimensions or a 1-D/2-D operand, "
        r"got shapes \(1, 3, 64\) and \(2, 64, 8\)$",
    ):
        args.matmul_operands(np.ones((1, 3, 64), np.float32), _q((2, 64, 8), 1), None, None)
    # plain operands broadcast
    x, y = args.matmul_operands(np.ones((1, 3, 4), E4), np.ones((2, 4, 5), E4), None, None)
    assert (x.shape, y.shape) == ((1, 3, 4), (2, 4, 5))
    with pytest.raises(
        ValueError, match=r"^a, b: batch dimensions \(3,\) and \(2,\) do not broadcast$"
    ):
        args.matmul_operands(np.ones((3, 3, 4), E4), np.ones((2, 4, 5), E4), None, None)


def test_einsum_names_the_operand_format():
    with pytest.raises(ValueError, match=r"^operand_formats\[1\]: unknown format 'int9'; "):
        emulate.einsum(
            "ij,jk",
            np.ones((1, 1), np.int8),
            np.ones((1, 1), np.uint8),
            operand_formats=[None, "int9"],
        )


# --- precision as a list of two (issue 40) -----------------------------------------------

HIGHEST_DEFAULT = [lax.Precision.HIGHEST, lax.Precision.DEFAULT]


@pytest.mark.parametrize(
    "precision", [HIGHEST_DEFAULT, ["highest", "default"]], ids=["enums", "strings"]
)
@pytest.mark.parametrize("rhs_dtype", ["float32", "int8"], ids=["passes-through", "emulated"])
def test_a_list_precision_in_every_front_end(precision, rhs_dtype):
    """lax.dot_general documents a list of two; emulate takes it in every front end and
    gives what JAX gives for the same pair as a tuple (JAX's own caches refuse the list of
    enums with "unhashable type: 'list'")."""
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    w = (np.arange(18) % 7 - 3).astype(rhs_dtype).reshape(6, 3)
    img = x.reshape(1, 4, 6, 1)
    ker = w.reshape(1, 3, 1, 6)[..., :3]
    conv_dn = ("NHWC", "HWIO", "NHWC")
    pair = tuple(precision)
    cases = [
        (
            emulate.dot_general(x, w, DN, precision=precision),
            lax.dot_general(x, w, DN, precision=pair),
        ),
        (emulate.matmul(x, w, precision=precision), jnp.matmul(x, w, precision=pair)),
        (
            emulate.einsum("ij,jk->ik", x, w, precision=precision),
            jnp.einsum("ij,jk->ik", x, w, precision=pair),
        ),
        (
            emulate.conv_general_dilated(
                img, ker, (1, 1), "VALID", dimension_numbers=conv_dn, precision=precision
            ),
            lax.conv_general_dilated(  # lax takes one dtype: the int8 kernel's exact values
                img,
                ker.astype(np.float32),
                (1, 1),
                "VALID",
                dimension_numbers=conv_dn,
                precision=pair,
            ),
        ),
    ]
    for got, want in cases:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_precision_arg_makes_a_list_of_two_a_tuple():
    assert args.precision_arg(HIGHEST_DEFAULT) == tuple(HIGHEST_DEFAULT)
    assert args.precision_arg(["high", "high"]) == ("high", "high")
    assert args.precision_arg("highest") == "highest" and args.precision_arg(None) is None
