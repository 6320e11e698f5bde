"""The convolution validator (emulate.engine.conv_args): the record of a call, its refusals
with their exact types and messages, and a QArray kernel."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import emulate
from emulate import mx
from emulate.engine import conv_args

E4 = ml_dtypes.float8_e4m3fn


def _q(shape=(64, 8), axis=0):
    return emulate.quantize(np.ones(shape, np.float32), mx.MXFP4, axis=axis)


# --- conv_general_dilated ----------------------------------------------------------------

IMG = np.ones((2, 6, 6, 4), E4)  # NHWC
KER = np.ones((3, 2, 2, 6), E4)  # HWIO, two groups of 2 input features
NHWC = ("NHWC", "HWIO", "NHWC")


def test_conv_record():
    call = conv_args.conv_args(
        IMG,
        KER,
        [np.int64(1), 2],
        "same",
        None,
        [1, np.int32(2)],
        NHWC,
        feature_group_count=2,
        precision=["highest", "highest"],
        preferred_element_type="bfloat16",
        target="tpu_v5e",
    )
    assert call.window_strides == (1, 2) and call.rhs_dilation == (1, 2)
    assert call.padding == "same" and call.lhs_dilation is None
    assert call.feature_group_count == 2 and call.batch_group_count == 1
    assert (call.window, call.k) == (6, 12)
    want = lax.conv_general_dilated(
        IMG.astype(np.float32), KER.astype(np.float32), (1, 2), "SAME", None, (1, 2), NHWC, 2
    )
    assert call.out_shape == want.shape
    assert call.result == "bfloat16" and call.precision == ("highest", "highest")
    assert call.tag().flops == 2 * math.prod(want.shape) * 12
    rank2 = conv_args.conv_args(np.ones((2, 5), E4), np.ones((3, 5), E4), (), "VALID")
    assert (rank2.window, rank2.k, rank2.out_shape) == (1, 5, (2, 3))


def test_conv_refusals():
    with pytest.raises(
        TypeError,
        match=r"^lhs, rhs: convolution operands need the same rank, got 4 and 3; lhs "
        r"float8_e4m3fn\[2, 6, 6, 4\], rhs float8_e4m3fn\[2, 2, 6\], target cpu$",
    ):
        conv_args.conv_args(IMG, KER[0], (1, 1), "SAME", target="cpu")
    with pytest.raises(
        ValueError,
        match=r"^lhs, rhs: lhs has 4 input features, rhs expects 2 x feature_group_count 1; ",
    ):
        conv_args.conv_args(IMG, KER, (1, 1), "SAME", dimension_numbers=NHWC)
    with pytest.raises(
        TypeError, match=r"^preferred_element_type: an integer result \(int32\) needs integer"
    ):
        conv_args.conv_args(
            IMG,
            KER,
            (1, 1),
            "SAME",
            dimension_numbers=NHWC,
            feature_group_count=2,
            preferred_element_type="int32",
        )
    with pytest.raises(conv_args.PaddingError) as e:
        conv_args.check_conv_params(2, (1, 1), "JUNK", None, None, 1, 1)
    assert isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)
    assert (
        str(e.value) == "padding: expected 'VALID', 'SAME', 'SAME_LOWER' or 2 (low, high) "
        "pairs, got 'JUNK'"
    )


def test_conv_qarray_kernel():
    q = emulate.quantize(jnp.ones((3, 3, 4, 2)), mx.MXFP8_E4M3, axis=2)
    x = np.ones((1, 5, 5, 4), np.float32)
    call = conv_args.conv_args(x, q, (1, 1), "SAME", dimension_numbers=NHWC)
    assert call.rhs is q and call.result == "float32" and call.k == 36
    assert call.tag().rhs.startswith("float8_e4m3fn[3,3,4,2]:")
    with pytest.raises(
        ValueError,
        match=r"^preferred_element_type: the result of a convolution with a QArray kernel "
        r"must be float32, bfloat16 or float16, got int32$",
    ):
        conv_args.conv_args(
            x, q, (1, 1), "SAME", dimension_numbers=NHWC, preferred_element_type="int32"
        )
    with pytest.raises(
        ValueError,
        match=r"^lhs, rhs: convolution operands need the same rank, at least 3; lhs "
        r"float32\[1, 5\], rhs float4_e2m1fn\[32, 5\], target ",
    ):
        conv_args.conv_args(np.ones((1, 5), np.float32), _q((32, 5), 0), (), "VALID")
    with pytest.raises(TypeError, match=r"^lhs: a QArray input is not built for convolutions"):
        conv_args.conv_args(q, q, (1, 1), "SAME", dimension_numbers=NHWC)
