"""Bad input gets a clear error; the awkward inputs that are not errors give lax's answer.

One row per case of issue 15 ("every bad input a clear error"): the call, the exception
type and a message pattern that names the argument. Then the cases that were silently
wrong and now give the right numbers (checked against JAX itself or against integers),
the command line's usage errors (exit 2, one line on stderr), NaN propagation in
``quantize`` past XLA:CPU's vectorised-max size, and MXINT8 against the OCP MX spec.
"""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import linen, nnx
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import emulate
import emulate.compiler
import emulate.flax
import emulate.pallas
from emulate import cli, mx, reference

DN = (((1,), (0,)), ((), ()))
I8 = np.ones((4, 8), np.int8)
W8 = np.ones((8, 4), np.int8)
X = np.ones((64, 32), np.float32)
IMG = np.ones((2, 8, 8, 3), ml_dtypes.float8_e4m3fn)  # NHWC
KER = np.ones((3, 3, 3, 4), ml_dtypes.float8_e4m3fn)  # HWIO
CONV_DN = ("NHWC", "HWIO", "NHWC")


def _conv(**kw):
    kw.setdefault("window_strides", (1, 1))
    kw.setdefault("padding", "SAME")
    return emulate.conv_general_dilated(IMG, KER, dimension_numbers=CONV_DN, **kw)


def _mxfp4():
    return emulate.quantize(np.ones((64, 8), np.float32), mx.MXFP4, axis=0)


def _qarray_with_scales(scales):
    q = _mxfp4()
    return emulate.QArray(
        q.codes, scales, None, q.format_name, q.scale_format, q.block_shape, q.shape, q.dtype
    )


def _packed(fmt="int4", axis=-1, length=4):
    return emulate.Packed(jnp.zeros((4, 2), jnp.uint8), fmt, axis, length)


def _vmap_after_the_packed_axis():
    p = emulate.pack(jnp.ones((8, 4), jnp.int4), axis=0)
    return jax.vmap(emulate.unpack, in_axes=1)(p)


class _OneDense(linen.Module):
    @linen.compact
    def __call__(self, x):
        return linen.Dense(4)(x)


def _quantize_linen(variables):
    x = np.ones((2, 8), np.float32)
    return emulate.flax.quantize_model(_OneDense(), "int8", variables, x)


class _WithTranspose(nnx.Module):
    def __init__(self):
        self.up = nnx.ConvTranspose(3, 2, (2,), rngs=nnx.Rngs(0))


CASES = [
    # codes and storage
    (
        "int4 code 0xFF",
        lambda: emulate.decode(np.uint8([0xFF]), "int4"),
        ValueError,
        r"^x: 1 code\(s\) exceed int4's 4 bits \(e\.g\. 0xff",
    ),
    (
        "float6 code 0x40",
        lambda: emulate.decode(np.uint8([0x40]), "float6_e2m3fn"),
        ValueError,
        r"^x: 1 code\(s\) exceed float6_e2m3fn's 6 bits",
    ),
    (
        "lhs codes above 4 bits",
        lambda: emulate.dot_general(
            np.uint8([[0x1F]]), np.ones((1, 1), np.int8), DN, lhs_format="int4"
        ),
        ValueError,
        r"^lhs: 1 code\(s\) exceed int4's 4 bits",
    ),
    (
        "Packed axis out of range",
        lambda: _packed(axis=-5),
        ValueError,
        r"^axis: -5 is out of range for data of shape \(4, 2\)",
    ),
    (
        "Packed 8-bit format",
        lambda: _packed(fmt="int8", length=2),
        ValueError,
        r"^format_name: int8 is 8-bit",
    ),
    (
        "Packed unknown format",
        lambda: _packed(fmt="int9"),
        ValueError,
        r"^format_name: unknown format 'int9'",
    ),
    (
        "Packed negative length",
        lambda: _packed(length=-4),
        ValueError,
        r"^length: expected a non-negative element count, got -4",
    ),
    (
        "Packed string length",
        lambda: _packed(length="4"),
        TypeError,
        r"^length: expected an int, got str '4'",
    ),
    (
        "Packed length disagrees",
        lambda: _packed(length=9),
        ValueError,
        r"^length: 9 int4 elements need 5 bytes along axis -1, the data has 2",
    ),
    (
        "Packed data not an array",
        lambda: emulate.Packed([1, 2], "int4", -1, 4),
        TypeError,
        r"^data: expected a uint8 array, got list",
    ),
    (
        "pack axis=1.0",
        lambda: emulate.pack(np.ones((4, 4), ml_dtypes.int4), axis=1.0),
        TypeError,
        r"^axis: expected an int, got float 1\.0",
    ),
    (
        "encode x of strings",
        lambda: emulate.encode("a", "int8"),
        TypeError,
        r"^x: expected a float or integer array, got dtype <U1",
    ),
    (
        "encode saturate='y'",
        lambda: emulate.encode(X, "int8", saturate="y"),
        TypeError,
        r"^saturate: expected True or False, got str",
    ),
    # formats and targets
    (
        "format None",
        lambda: emulate.formats.get(None),
        TypeError,
        r"^fmt: expected a format name, a dtype or a Format, got NoneType None",
    ),
    (
        "decode fmt=5",
        lambda: emulate.decode(np.uint8([1]), 5),
        TypeError,
        r"^fmt: expected a format name, a dtype or a Format, got int 5",
    ),
    (
        "quantize fmt None",
        lambda: emulate.quantize(X, None),
        TypeError,
        r"^fmt: expected a format name.*got NoneType None",
    ),
    (
        "lhs_format=7",
        lambda: emulate.dot_general(I8, W8, DN, lhs_format=7),
        TypeError,
        r"^lhs_format: expected a format name, a dtype or a Format, got int 7",
    ),
    (
        "preferred_element_type='junk'",
        lambda: emulate.dot_general(I8, W8, DN, preferred_element_type="junk"),
        TypeError,  # as lax.dot_general raises for it
        r"^preferred_element_type: unknown format 'junk'",
    ),
    (
        "preferred_element_type=5",
        lambda: emulate.dot_general(I8, W8, DN, preferred_element_type=5),
        TypeError,
        r"^preferred_element_type: expected a format name",
    ),
    (
        "detect(None)",
        lambda: emulate.targets.detect(None),
        TypeError,
        r"^platform: expected a string .* got NoneType None",
    ),
    (
        "detect device_kind=4",
        lambda: emulate.targets.detect("tpu", 4),
        TypeError,
        r"^device_kind: expected a string",
    ),
    (
        "detect compute_capability=9.0",
        lambda: emulate.targets.detect("gpu", "", 9.0),
        TypeError,
        r"^compute_capability: expected a 'major\.minor' string or None",
    ),
    # dimension numbers and shapes
    (
        "dimension number 1.5",
        lambda: emulate.dot_general(I8, W8, (((1.5,), (0,)), ((), ()))),
        TypeError,
        r"^dimension_numbers: expected .* of integer dimensions",
    ),
    (
        "dimension_numbers=None for batched operands",
        lambda: emulate.dot_general(I8[None], W8[None], None),
        ValueError,
        r"^dimension_numbers: None stands for a plain matrix-matrix",
    ),
    (
        "dimension_numbers=None for batched int4 operands",
        lambda: emulate.dot_general(I8[None].astype(jnp.int4), W8[None].astype(jnp.int4), None),
        ValueError,
        r"^dimension_numbers: None stands for a plain matrix-matrix",
    ),
    # quantized arrays
    (
        "QArray with wrong-shaped scales",
        lambda: _qarray_with_scales(jnp.ones((2, 2), jnp.float8_e8m0fnu)),
        ValueError,
        r"^QArray: scales have shape \(2, 2\), expected \(2, 8\) for shape \(64, 8\)",
    ),
    (
        "QArray with scales of a non-scale dtype",
        lambda: _qarray_with_scales(jnp.ones((2, 8), jnp.int8)),
        ValueError,
        r"^QArray: scales are int8, the record says float8_e8m0fnu",
    ),
    (
        "quantize block_shape=1.5",
        lambda: emulate.quantize(X, "int8", block_shape=1.5, axis=-1),
        TypeError,
        r"^block_shape: expected a positive int or a sequence of positive ints, got "
        r"float 1\.5",
    ),
    (
        "quantize block_shape=(1.5,)",
        lambda: emulate.quantize(X, "int8", block_shape=(1.5,), axis=-1),
        TypeError,
        r"^block_shape: expected a positive int or a sequence",
    ),
    (
        "quantize axis='a'",
        lambda: emulate.quantize(X, mx.MXFP4, axis="a"),
        TypeError,
        r"^axis: expected an int or a sequence of ints, got str 'a'",
    ),
    (
        "quantize saturate='no'",
        lambda: emulate.quantize(X, mx.MXFP4, saturate="no"),
        TypeError,
        r"^saturate: expected True or False, got str 'no'",
    ),
    (
        "from_parts block_shape 1.5",
        lambda: emulate.QArray.from_parts(
            np.ones((4, 4), np.int8), np.ones((4, 1), np.float32), block_shape=(1, 1.5)
        ),
        TypeError,
        r"^block_shape: expected a sequence of ints",
    ),
    (
        "dequantize to='junk'",
        lambda: emulate.dequantize(_mxfp4(), to="junk"),
        TypeError,
        r"^to: expected float32, bfloat16 or float16, got 'junk'",
    ),
    (
        "scaled_dot_general configs='junk'",
        lambda: emulate.scaled_dot_general(X, X.T, DN, configs="junk"),
        TypeError,
        r"^configs: expected None or a list of jax\.nn block-scale configs",
    ),
    ("inspect(5)", lambda: emulate.inspect(5), TypeError, r"^fn: expected a callable, got int"),
    # convolution parameters (lax's exception types; messages name the argument)
    (
        "conv strides (0, 0)",
        lambda: _conv(window_strides=(0, 0)),
        ValueError,
        r"^window_strides: expected ints >= 1, got \(0, 0\)",
    ),
    (
        "conv strides (-1, -1)",
        lambda: _conv(window_strides=(-1, -1)),
        ValueError,
        r"^window_strides: expected ints >= 1, got \(-1, -1\)",
    ),
    (
        "conv strides 1",
        lambda: _conv(window_strides=1),
        TypeError,
        r"^window_strides: expected a sequence of 2 ints",
    ),
    (
        "conv strides of 3",
        lambda: _conv(window_strides=(1, 1, 1)),
        ValueError,
        r"^window_strides: expected 2 values",
    ),
    (
        "conv padding 'JUNK'",
        lambda: _conv(padding="JUNK"),
        RuntimeError,
        r"^padding: expected 'VALID', 'SAME', 'SAME_LOWER' or 2 \(low, high\) pairs, got 'JUNK'",
    ),
    (
        "conv padding pairs of floats",
        lambda: _conv(padding=[(1.5, 1), (1, 1)]),
        ValueError,
        r"^padding: expected .* pairs of ints",
    ),
    (
        "conv lhs_dilation (0, 0)",
        lambda: _conv(lhs_dilation=(0, 0), padding=[(1, 1)] * 2),
        ValueError,
        r"^lhs_dilation: expected ints >= 1, got \(0, 0\)",
    ),
    (
        "conv feature_group_count 0",
        lambda: _conv(feature_group_count=0),
        ValueError,
        r"^feature_group_count: expected a positive int, got 0",
    ),
    # issue 28: the second sweep
    (
        "float6 preferred_element_type on a native pair (cpu pass-through)",
        lambda: emulate.dot_general(
            np.ones((4, 8), ml_dtypes.float8_e4m3fn),
            np.ones((8, 4), ml_dtypes.float8_e4m3fn),
            DN,
            preferred_element_type=ml_dtypes.float6_e2m3fn,
            target="cpu",
        ),
        ValueError,
        r"^preferred_element_type: the result type would be float6_e2m3fn, which XLA cannot "
        r"hold; pass a wider preferred_element_type \(e\.g\. jnp\.float32",
    ),
    (
        "vmap over an axis after a Packed's packed axis",
        _vmap_after_the_packed_axis,
        ValueError,
        r"^p: 8 int4 elements need 4 bytes along axis -2 \(counted from the end\), the data "
        r"has 1 axis \(shape \(4,\)\); jax\.vmap and stacking may add or remove axes before "
        r"the packed axis only",
    ),
    (
        "from_parts tensor_scale='x'",
        lambda: emulate.QArray.from_parts(
            np.ones((4, 4), np.int8),
            np.ones((4, 1), np.float32),
            block_shape=(1, 4),
            tensor_scale="x",
        ),
        TypeError,
        r"^tensor_scale: expected None or a float32 scalar, got str 'x'$",
    ),
    (
        "conv operands of different ranks",
        lambda: emulate.conv_general_dilated(
            np.ones((1, 1, 4), ml_dtypes.float8_e4m3fn), KER, (1,), "VALID", target="tpu_v4"
        ),
        TypeError,  # as lax: "convolution requires lhs and rhs ndim to be equal"
        r"^lhs, rhs: convolution operands need the same rank, got 3 and 4; lhs "
        r"float8_e4m3fn\[1, 1, 4\], rhs float8_e4m3fn\[3, 3, 3, 4\], target tpu_v4$",
    ),
    (
        "conv rank-2 operands with a stride",
        lambda: emulate.conv_general_dilated(
            np.ones((2, 4), ml_dtypes.float8_e4m3fn),
            np.ones((3, 4), ml_dtypes.float8_e4m3fn),
            (1,),
            "VALID",
            target="tpu_v4",
        ),
        ValueError,
        r"^window_strides: expected 0 values \(one per spatial dimension: the operands' rank "
        r"- 2\), got \(1,\); lhs float8_e4m3fn\[2, 4\], rhs float8_e4m3fn\[3, 4\]",
    ),
    (
        "conv rank-2 operands with a stride, passed through",
        lambda: emulate.conv_general_dilated(
            np.ones((2, 4), np.float32), np.ones((3, 4), np.float32), (1,), "VALID"
        ),
        ValueError,
        r"^window_strides: expected 0 values \(one per spatial dimension: the operands' rank "
        r"- 2\), got \(1,\); lhs \(2, 4\), rhs \(3, 4\)$",
    ),
    (
        "linen variables without params",
        lambda: _quantize_linen({}),
        ValueError,
        r"^variables: expected the model's variables, a mapping with a 'params' collection "
        r"\(what model\.init returns\), got a mapping with the collections \[\]$",
    ),
    (
        "linen variables without the layer's kernel",
        lambda: _quantize_linen({"params": {}}),
        ValueError,
        r"^variables: no params/Dense_0/kernel for the Dense at 'Dense_0'; pass the variables "
        r"model\.init returned$",
    ),
    (
        "a chosen NNX layer that cannot be quantized",
        lambda: emulate.flax.quantize_model(_WithTranspose(), "int8"),
        ValueError,
        r"^rules: the layer at 'up' \(ConvTranspose\) has a kernel, but emulate\.flax "
        r"quantizes Linear, LinearGeneral, Einsum, Conv and Embed layers",
    ),
    (
        "Rule subclasses='no'",
        lambda: emulate.flax.quantize_model(
            nnx.Linear(4, 2, rngs=nnx.Rngs(0)), emulate.flax.Rule(".*", "int8", subclasses="no")
        ),
        ValueError,
        r"^rules: subclasses must be True or False, got 'no'$",
    ),
    (
        "emulate_layer on a module of another type",
        lambda: emulate.flax.emulate_layer(nnx.LayerNorm(4, rngs=nnx.Rngs(0))),
        TypeError,
        r"^module: expected an NNX Linear, LinearGeneral, Einsum, Conv and Embed layer \(or a "
        r"subclass\), got LayerNorm$",
    ),
    (
        "dot_result of a pair with no common result type",
        lambda: emulate.formats.dot_result("float8_e5m2", "float8_e5m2fnuz"),
        TypeError,  # as lax.dot_general: "argument type error: float8_e5m2, float8_e5m2fnuz"
        r"^lhs, rhs: float8_e5m2 and float8_e5m2fnuz have no common result type "
        r"\(lax\.dot_general refuses the pair\); pass preferred_element_type to choose the "
        r"result type$",
    ),
    (
        "dot_general on a pair with no common result type",
        lambda: emulate.dot_general(
            np.ones((2, 4), ml_dtypes.float8_e5m2), np.ones((4, 3), ml_dtypes.float8_e5m2fnuz), DN
        ),
        TypeError,
        r"^lhs, rhs: float8_e5m2 and float8_e5m2fnuz have no common result type ",
    ),
    (
        "dot_result rhs=None",
        lambda: emulate.formats.dot_result("int8", None),
        TypeError,
        r"^rhs: expected a format name, a dtype or a Format, got NoneType None$",
    ),
    (
        "pallas.dot with batch dimension numbers",
        lambda: emulate.pallas.dot(
            I8, I8, dimension_numbers=(((1,), (1,)), ((0,), (0,))), target="tpu_v4"
        ),
        NotImplementedError,
        r"^dimension_numbers: emulate\.pallas\.dot contracts 2-D tiles without batch "
        r"dimensions, got batch dimensions \(0,\) and \(0,\)",
    ),
    # issue 49: an integer sub-byte result of floats reached XLA's verifier ("does not
    # support custom element sizes", a JaxRuntimeError, as lax's own call); None operands
    # were read as arrays of rank 0 and blamed on the dimension numbers
    (
        "int4 preferred_element_type of float operands",
        lambda: emulate.ragged_dot(X, X.T[None], np.array([64]), preferred_element_type=jnp.int4),
        TypeError,
        r"^preferred_element_type: an integer result \(int4\) needs integer operands",
    ),
    *(
        (
            f"{fn} {arg}=None",
            call,
            TypeError,
            rf"^{arg}: expected an array \(jax or numpy\), a QArray, a Packed array or uint8 "
            rf"codes with {arg}_format=, got None$",
        )
        for fn, arg, call in (
            ("dot_general", "rhs", lambda: emulate.dot_general(X, None, DN)),
            ("dot_general", "lhs", lambda: emulate.dot_general(None, X, DN)),
            ("ragged_dot", "rhs", lambda: emulate.ragged_dot(X, None, np.array([64]))),
            ("ragged_dot", "lhs", lambda: emulate.ragged_dot(None, X.T[None], np.array([64]))),
            (
                "conv_general_dilated",
                "rhs",
                lambda: emulate.conv_general_dilated(IMG, None, (1, 1), "SAME"),
            ),
        )
    ),
    *(
        (
            f"ragged_dot group_sizes={got}",
            lambda value=value: emulate.ragged_dot(X, X.T[None], value),
            TypeError,
            rf"^group_sizes: expected an array of integers \(the number of rows in each "
            rf"group\), got {got}$",
        )
        for got, value in (("None", None), ("str", "64"))
    ),
]


@pytest.mark.parametrize(
    ("call", "exc", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_a_clear_error(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_unknown_padding_is_also_a_value_error():
    # lax raises RuntimeError for it; the project's rule wants a ValueError: both hold.
    with pytest.raises(RuntimeError, match="Unrecognized padding type"):
        lax.conv_general_dilated(
            np.ones((1, 4, 4, 1), np.float32),
            np.ones((3, 3, 1, 1), np.float32),
            (1, 1),
            "JUNK",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
    with pytest.raises(ValueError, match="^padding:"):
        _conv(padding="junk")


def test_conv_accepts_what_lax_accepts():
    # lower-case padding strings, lists for tuples, numpy ints
    want = lax.conv_general_dilated(
        IMG.astype(np.float32),
        KER.astype(np.float32),
        (1, 1),
        "SAME",
        dimension_numbers=CONV_DN,
    )
    got = _conv(window_strides=[np.int64(1), 1], padding="same", preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want))


# --- what used to be silently wrong -------------------------------------------------------


def test_traced_codes_have_their_high_bits_ignored():
    # Under jit the codes cannot be checked without a host round trip: the bits above
    # the format's width are masked off (documented in emulate.numerics.storage).
    got = jax.jit(lambda c: emulate.decode(c, "int4", to=jnp.int32))(np.uint8([0xFF, 0x17]))
    assert np.asarray(got).tolist() == [-1, 7]


@pytest.mark.parametrize(
    ("x", "fmt", "want"),
    [
        (np.array([4294967295], np.uint32), "int8", [127]),
        (np.array([2**40, -(2**40), 5], np.int64), "int8", [127, -128, 5]),
        (np.array([2**63 - 1], np.uint64), "uint4", [15]),
        (np.array([300, -300], np.int32), "int4", [7, -8]),
    ],
)
def test_encode_saturate_clamps_before_narrowing(x, fmt, want):
    got = emulate.encode(x, fmt, saturate=True)
    assert np.asarray(got).astype(int).tolist() == want
    got = emulate.encode(jnp.asarray(x) if x.dtype.itemsize <= 4 else x, fmt, saturate=True)
    assert np.asarray(got).astype(int).tolist() == want


def test_encode_wraps_wide_integers_modulo_the_width():
    x = np.array([2**40 + 3, -(2**40) - 1, 4294967295], np.int64)
    want = [((v + 128) % 256) - 128 for v in x.tolist()]
    assert np.asarray(emulate.encode(x, "int8")).astype(int).tolist() == want


def test_packed_positive_axis_is_counted_from_the_end():
    p = emulate.Packed(jnp.asarray(np.uint8([[0x21], [0x43]])), "int4", 1, 2)
    assert p.axis == -1
    assert np.asarray(emulate.unpack(p)).astype(int).tolist() == [[1, 2], [3, 4]]


def test_k_zero_in_mode_exact_gives_zeros_like_lax():
    a = np.ones((4, 0), ml_dtypes.float8_e4m3fn)
    b = np.ones((0, 3), ml_dtypes.float8_e4m3fn)
    want = lax.dot_general(a, b, DN)
    for mode in ("exact", "fast"):
        got = emulate.dot_general(a, b, DN, mode=mode)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert not np.asarray(got, np.float32).any()


@pytest.mark.parametrize(
    ("dtype", "k", "mode"),
    [(np.int8, 140_000, "fast"), (np.int8, 140_000, "exact"), (np.int8, 140_000, "int")],
)
def test_chunked_plans_run_under_x64(dtype, k, mode):
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (1, k)).astype(dtype)
    b = rng.integers(-128, 128, (k, 1)).astype(dtype)
    exact = int((a.astype(np.int64) @ b.astype(np.int64))[0, 0])
    with jax.enable_x64(True):
        if mode == "int":  # an int32 result wraps like XLA's integer dot
            got = emulate.dot_general(a, b, DN, preferred_element_type=jnp.int32)
            assert int(got[0, 0]) == ((exact + 2**31) % 2**32) - 2**31
        else:
            got = emulate.dot_general(a, b, DN, mode=mode, preferred_element_type=jnp.float32)
            assert float(got[0, 0]) == float(np.float32(exact))


def test_int32_result_of_a_qarray_matmul_converts_like_lax():
    # lax (jax 0.10.2) accepts an int32 preferred_element_type for float operands and
    # converts the f32 sum (toward zero); emulate's QArray matmul does the same.
    x = np.array([[0.5, 0.75, 0.5, -0.25] * 8], np.float32)
    q = emulate.quantize(np.ones((32, 2), np.float32), mx.MXFP8_E4M3, axis=0)
    got = emulate.matmul(x, q, preferred_element_type=jnp.int32)
    want = lax.dot_general(x, emulate.dequantize(q), DN, preferred_element_type=jnp.int32)
    assert got.dtype == want.dtype and np.asarray(got).tolist() == np.asarray(want).tolist()


def _experts():
    rng = np.random.default_rng(3)
    return rng.standard_normal((3, 64, 16)).astype(np.float32)


def test_vmap_over_a_qarray_of_experts():
    w = _experts()
    q = emulate.quantize(w, mx.MXFP4, axis=1)  # (E, K, N), blocks of 32 along K
    x = np.ones((2, 64), np.float32)
    each = [emulate.dequantize(emulate.quantize(w[e], mx.MXFP4, axis=0)) for e in range(3)]
    np.testing.assert_array_equal(np.asarray(jax.vmap(emulate.dequantize)(q)), np.stack(each))
    got = jax.vmap(lambda qe: emulate.matmul(x, qe))(q)
    # fp4 values times two power-of-two scales, 64 of them: the f32 sums are exact
    want = np.stack([x.astype(np.float64) @ np.asarray(d, np.float64) for d in each])
    np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32))


def test_stacked_qarrays_are_one_qarray_with_a_leading_axis():
    w = _experts()
    qs = [emulate.quantize(w[e], mx.MXFP4, axis=0) for e in range(3)]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *qs)
    assert stacked.shape == (3, 64, 16) and stacked.block_shape == (1, 32, 1)
    np.testing.assert_array_equal(
        np.asarray(emulate.dequantize(stacked)),
        np.stack([np.asarray(emulate.dequantize(q)) for q in qs]),
    )
    also = jax.vmap(lambda v: emulate.quantize(v, mx.MXFP4, axis=0))(w)
    np.testing.assert_array_equal(
        np.asarray(emulate.dequantize(also)), np.asarray(emulate.dequantize(stacked))
    )


def test_nvfp4_dequantize_rounds_the_two_level_scale_first():
    # docs/quantized.md: code * (scale * tensor_scale), the parenthesised product rounded to
    # f32, then the product with the code rounded once. numpy's float32 multiplications
    # round once each; the oracle reads codes and scales through ml_dtypes.
    x = np.random.default_rng(28).standard_normal((32, 64)).astype(np.float32) * 3
    q = emulate.quantize(x, mx.NVFP4)
    codes = np.asarray(q.unpacked_codes()).astype(np.float32)
    scales = np.asarray(q.scales).astype(np.float32)
    ts = np.float32(q.tensor_scale)
    s = np.repeat(scales * ts, q.block_shape[1], axis=1)  # (32, 64): one f32 rounding
    want = codes * s  # one more rounding
    want = np.where(np.abs(want) < 2.0**-126, np.float32(0) * want, want)
    got = np.asarray(emulate.dequantize(q))
    assert got.tobytes() == want.tobytes()
    once = (codes.astype(np.float64) * np.repeat(scales, 16, axis=1) * float(ts)).astype(
        np.float32
    )  # a single rounding of the exact triple product (at most 30 significant bits)
    assert (once != want).sum() > 0  # the order is observable: the docs must state it


def test_quantize_along_an_empty_axis_is_an_empty_qarray():
    # Per-channel scales over an axis of length 0 (nnx.Linear(0, 4)): empty blocks, and
    # the matmul over K = 0 gives zeros as lax's does.
    q = emulate.quantize(np.ones((0, 4), np.float32), "int8", axis=0)
    assert (q.shape, q.scales.shape) == ((0, 4), (0, 4))
    got = emulate.matmul(np.ones((2, 0), np.float32), q)
    want = lax.dot_general(np.ones((2, 0), np.float32), np.ones((0, 4), np.float32), DN)
    assert got.dtype == want.dtype and np.asarray(got).tolist() == np.asarray(want).tolist()


# --- the command line: usage errors exit 2 with one line on stderr -----------------------


def _cli_usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def kernels(tmp_path):
    (tmp_path / "bad_syntax.py").write_text("def f(:\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "two_args.py").write_text(
        "import jax.numpy as jnp\n\ndef mm(x, w):\n    return jnp.dot(x, w)\n\n"
        "def boom(x):\n    raise RuntimeError('boom at trace')\n"
    )
    return tmp_path


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["bad_syntax.py:f"], r"cannot import .*bad_syntax.*SyntaxError"),
        (["raises.py:f"], r"cannot import .*raises.*RuntimeError: boom at import"),
        (
            ["two_args.py:mm", "--shapes", "8x128:bfloat16"],
            r"--shapes: .*two_args\.py:mm' takes 2 array argument\(s\) \(x, w\), --shapes gave 1",
        ),
        (
            ["two_args.py:mm", "--shapes", "8x128:bfloat16,128x8:bfloat16,8x8:bfloat16"],
            r"--shapes: .* takes 2 array argument\(s\) \(x, w\), --shapes gave 3",
        ),
        (["two_args.py:mm"], r"--shapes: .* takes 2 array argument\(s\) \(x, w\), --shapes gave 0"),
        (
            ["two_args.py:boom", "--shapes", "8x128:bfloat16"],
            r"cannot trace .*two_args\.py:boom.*RuntimeError: boom at trace",
        ),
    ],
    ids=[
        "syntax-error",
        "raises-on-import",
        "too-few-shapes",
        "too-many-shapes",
        "no-shapes",
        "raises-on-trace",
    ],
)
def test_check_kernel_usage_errors(args, pattern, kernels, capsys):
    args = [str(kernels / args[0]) if i == 0 else a for i, a in enumerate(args)]
    line = _cli_usage_error(["check-kernel", *args, "--target", "tpu_v5e"], capsys)
    assert line.startswith("emulate check-kernel: error: ")
    assert re.search(pattern, line), line


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_validate_json_on_a_full_device(capsys):
    line = _cli_usage_error(
        [
            "validate",
            "--json",
            "/dev/full",
            "--examples",
            "1",
            "--formats",
            "int8",
            "--target",
            "cpu",
            "--modes",
            "fast",
        ],
        capsys,
    )
    assert (
        line == "emulate validate: error: cannot write --json '/dev/full': No space left on device"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--out", ""], "emulate targets: error: --out: expected a path to a file, got ''"),
        (
            ["--out", "{tmp}"],
            "emulate targets: error: cannot write --out '{tmp}': Is a directory (give a path "
            "to a file in an existing, writable directory)",
        ),
        (
            ["--out", "{tmp}/missing/probe.json"],
            "emulate targets: error: cannot write --out '{tmp}/missing/probe.json': No such "
            "file or directory (give a path to a file in an existing, writable directory)",
        ),
    ],
    ids=["empty", "directory", "missing-directory"],
)
def test_targets_probe_checks_out_before_the_probe(args, line, tmp_path, capsys):
    args = [a.format(tmp=tmp_path) for a in args]
    got = _cli_usage_error(["targets", "--probe", "--target", "v5e", *args], capsys)
    assert got == line.format(tmp=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_targets_probe_on_a_full_device(monkeypatch, capsys):
    # A full device takes the empty open of the check before the probe; the write after it
    # fails: one line and exit 2, as validate --json. The probe itself (11 s for v5e) is
    # the recorded one here: this test is about the command line's error, not the compiler.
    recorded = emulate.mosaic.recorded()
    calls = []

    def probe(targets=None, **kw):
        calls.append((targets, kw))
        rows = tuple(r for r in recorded.rows if r.case.target in targets)
        return dataclasses.replace(
            recorded, rows=rows, topologies={t: recorded.topologies[t] for t in targets}
        )

    monkeypatch.setattr(emulate.compiler, "probe", probe)
    line = _cli_usage_error(["targets", "--probe", "--target", "v5e", "--out", "/dev/full"], capsys)
    assert calls == [(["tpu_v5e"], {})]
    assert line == "emulate targets: error: cannot write --out '/dev/full': No space left on device"


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("junk", r"emulate targets: error: unknown target 'junk' \(choose from tpu_v2, "),
        (
            "cpu",
            r"emulate targets: error: --probe: the TPU compiler compiles for TPU targets "
            r"only, got cpu$",
        ),
        ("tpu_v4i", r"emulate targets: error: --probe: "),
    ],
)
def test_targets_probe_refuses_targets_in_the_cli_form(name, line, capsys):
    got = _cli_usage_error(["targets", "--probe", "--target", name], capsys)
    assert re.match(line, got), got
    if name == "tpu_v4i" and emulate.compiler.available():
        assert re.match(
            r"emulate targets: error: --probe: libtpu \S+ has no compile-only device for "
            r"tpu_v4i \(choose from tpu_v2, ",
            got,
        ), got


# --- NaN in quantize past XLA:CPU's vectorised max ----------------------------------------


@given(
    rows=st.sampled_from([127, 160]),
    nans=st.lists(st.tuples(st.integers(0, 126), st.integers(0, 31)), min_size=1, max_size=3),
    scheme=st.sampled_from([mx.MXFP4, mx.NVFP4]),
)
def test_quantize_keeps_nan_blocks_at_any_size(rows, nans, scheme):
    # 127 x 32 is below the size (about 4096 elements) where XLA:CPU's max drops NaN.
    x = np.linspace(-3, 3, rows * 32, dtype=np.float32).reshape(rows, 32)
    for r, c in nans:
        x[r, c] = np.nan
    q = emulate.quantize(x, scheme)
    codes, scales, t = reference.quantize(
        x,
        scheme.format,
        q.block_shape,
        scale_fmt=scheme.scale_format,
        scale_rule=scheme.scale_rule,
        tensor_scale=scheme.tensor_scale,
    )
    got_scales = np.asarray(q.scales).view(np.uint8)
    np.testing.assert_array_equal(got_scales, np.asarray(scales).view(np.uint8))
    deq = np.asarray(emulate.dequantize(q))
    nan_blocks = {(r, c // q.block_shape[1]) for r, c in nans}
    for r, b in nan_blocks:
        assert np.isnan(deq[r, b * q.block_shape[1] : (b + 1) * q.block_shape[1]]).all()
    assert np.isnan(deq).sum() == len(nan_blocks) * q.block_shape[1]


# --- MXINT8 against the OCP MX spec (v1.0), with Fractions --------------------------------


def _spec_value(scale_byte: int, code: int) -> Fraction:
    """OCP MX v1.0: MXINT8 element = X * int8 * 2**-6, X = 2**(scale_byte - 127)."""
    return Fraction(2) ** (scale_byte - 127) * code / 64


def _f32(v: Fraction) -> float:
    """``v`` as f32 (exact here: at most 8 significant bits), flushed below 2**-126."""
    f = float(v)
    return 0.0 if abs(f) < 2.0**-126 else f


def _spec_quantize(block: np.ndarray) -> tuple[int, list[int]]:
    """The spec's MXINT8 conversion of a block: X = 2**(floor(log2 amax) - emax), emax 0;
    elements round(x / X * 64) half to even, clamped to [-127, 127]."""
    vals = [Fraction(float(v)) for v in block]
    amax = max(abs(v) for v in vals)
    e = math.floor(math.log2(amax))
    while Fraction(2) ** (e + 1) <= amax:  # exact floor(log2) on the Fraction
        e += 1
    while Fraction(2) ** e > amax:
        e -= 1
    codes = []
    for v in vals:
        p = v / Fraction(2) ** e * 64
        r = round(p)  # Python rounds a Fraction half to even
        codes.append(max(-127, min(127, r)))
    return e + 127, codes


@pytest.mark.parametrize("scale_byte", [3, 5, 6, 100, 127, 200])
def test_mxint8_spec_blocks_dequantize_exactly(scale_byte):
    codes = np.array([(-1) ** i * (16 + 3 * i) for i in range(32)], np.int8)
    scales = np.array([[scale_byte]], np.uint8).view(ml_dtypes.float8_e8m0fnu).reshape(1)
    q = emulate.QArray.from_parts(codes, scales, block_shape=(32,), element_exponent=-6)
    want = [_f32(_spec_value(scale_byte, int(c))) for c in codes]
    assert np.asarray(emulate.dequantize(q)).tolist() == want
    # through the scaled matmul: one-hot rows pick single elements out
    eye = np.eye(32, dtype=np.float32)
    got = emulate.matmul(
        eye,
        emulate.QArray.from_parts(
            codes.reshape(32, 1), scales.reshape(1, 1), block_shape=(32, 1), element_exponent=-6
        ),
    )
    assert np.asarray(got).ravel().tolist() == want


@pytest.mark.parametrize("top", [-125.0, -123.5, -121.25, -60.0, 0.0, 3.0, 90.0])
def test_mxint8_quantize_follows_the_spec(top):
    rng = np.random.default_rng(int(top * 4) % 1000)
    block = (rng.standard_normal(32) * 2.0**top).astype(np.float32)
    block[rng.integers(0, 32)] = np.float32(2.0**top * 1.99)
    block = np.where(np.abs(block) < 2.0**-126, 0, block).astype(np.float32)
    q = emulate.quantize(block, mx.MXINT8)
    byte, codes = _spec_quantize(block)
    assert int(np.asarray(q.scales).view(np.uint8)[0]) == byte
    assert np.asarray(q.codes).astype(int).tolist() == codes
    ref_codes, ref_scales, _ = reference.quantize(block, "int8", (32,), element_exponent=-6)
    assert np.asarray(ref_codes).astype(int).tolist() == codes
    assert int(np.asarray(ref_scales).view(np.uint8)[0]) == byte


# --- emulate.pallas.matmul under jax.grad and jax.vmap (interpret mode on the CPU) --------


def test_pallas_matmul_has_gradients_and_maps():
    from emulate import pallas as ep

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 256)), jnp.bfloat16)
    w = emulate.pack(jnp.asarray(rng.integers(-8, 8, (256, 128)), jnp.int4), axis=0)

    def mm(x, w):
        return ep.matmul(x, w, target="tpu_v5e", interpret=True, out_dtype=jnp.float32)

    wv = np.asarray(emulate.decode(w, to=jnp.float32))
    got = jax.grad(lambda x: (mm(x, w) ** 2).sum())(x)
    want = jax.grad(lambda x: ((x.astype(jnp.float32) @ wv) ** 2).sum())(x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    xs = jnp.stack([x, -2 * x])
    mapped = jax.vmap(lambda xi: mm(xi, w))(xs)
    np.testing.assert_array_equal(np.asarray(mapped), np.stack([mm(x, w), mm(-2 * x, w)]))


@pytest.mark.parametrize("dtype", [np.int8, jnp.int4, jnp.float8_e4m3fn])
def test_dimension_numbers_none_is_lax_dot(dtype):
    # lax.dot_general(x, y, None) is lax.dot's plain product; emulate reads None the same way.
    x, w = I8.astype(dtype), W8.astype(dtype)
    got = emulate.dot_general(x, w, None, preferred_element_type=jnp.float32)
    want = emulate.dot_general(x, w, DN, preferred_element_type=jnp.float32)
    if dtype != jnp.int4:  # XLA:CPU cannot compile JAX's own int4 dot
        want = jax.lax.dot_general(x, w, None, preferred_element_type=jnp.float32)
    assert got.dtype == want.dtype and np.asarray(got).tobytes() == np.asarray(want).tobytes()


# --- issue 49: the fourth sweep -----------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "features"),
    [("int8", (0, 4)), ("int4", (4, 0))],
    ids=["int8-in_features=0", "int4-out_features=0"],
)
def test_an_empty_flax_linear_quantizes_and_runs_as_flax(scheme, features):
    # ZeroDivisionError before: the CPU kernel took K = 0, packing and the scales' layout
    # divided by an empty axis
    layer = nnx.Linear(*features, kernel_init=nnx.initializers.ones, rngs=nnx.Rngs(0))
    x = np.ones((2, features[0]), np.float32)
    want = layer(x)
    got = emulate.flax.quantize_model(layer, scheme)(x)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert np.asarray(got).tolist() == np.asarray(want).tolist()


def test_a_float4_result_of_plain_operands_is_the_sum_rounded_once():
    # issue 49: lax's own call (and emulate's pass-through) failed in XLA's verifier ("does
    # not support custom element sizes"); emulate's route rounds the exact f32 sum to e2m1
    x = np.array([[1.25, 1.25, 1.25], [0.5, 0.25, 0.0]], np.float32)
    w = np.ones((3, 2), np.float32)
    want = (x.astype(np.float64) @ w).astype(ml_dtypes.float4_e2m1fn)  # 3.75 -> 4, 0.75 -> 1
    f4 = ml_dtypes.float4_e2m1fn
    gs = np.array([2])
    for got in (
        emulate.dot_general(x, w, DN, preferred_element_type=f4),
        emulate.ragged_dot(x, w[None], gs, preferred_element_type=f4),
        # issue 49's sweep: polyfill bound such equations as they were, into XLA's verifier
        emulate.polyfill(lambda a, b: lax.dot_general(a, b, DN, preferred_element_type=f4))(x, w),
        emulate.polyfill(lambda a, b: lax.ragged_dot(a, b, gs, preferred_element_type=f4))(
            x, w[None]
        ),
    ):
        assert got.dtype == f4
        assert np.asarray(got).view(np.uint8).tolist() == want.view(np.uint8).tolist()
