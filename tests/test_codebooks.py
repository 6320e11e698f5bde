"""The built-in codebooks against independent derivations, and user tables' checks."""

from __future__ import annotations

import gguf.quants
import ml_dtypes
import numpy as np
import pytest
from scipy.stats import norm

import emulate
from emulate import codebooks


def test_iq4_nl_is_ggml_table():
    # the gguf package's own decoder table (gguf-py gguf/quants.py, class IQ4_NL)
    assert codebooks.IQ4_NL.values == tuple(gguf.quants.IQ4_NL.kvalues)
    assert codebooks.IQ4_NL.dtype == np.int8 and codebooks.IQ4_NL.bits == 4


def test_nf4_is_the_qlora_construction():
    # QLoRA (Dettmers et al. 2023), as bitsandbytes' create_normal_map builds it: 8
    # positive and 7 negative normal quantiles from linspace(offset, 0.5), a zero, sorted
    # and divided by the largest, in float32.
    offset = 0.9677083
    pos = norm.ppf(np.linspace(offset, 0.5, 9, dtype=np.float32)[:-1])
    neg = -norm.ppf(np.linspace(offset, 0.5, 8, dtype=np.float32)[:-1])
    v = np.sort(np.concatenate([pos, [0.0], neg]).astype(np.float32))
    v = v / v.max()
    table = codebooks.NF4.array()
    assert table.dtype == np.float32 and table.shape == (16,)
    np.testing.assert_allclose(table, v, rtol=0, atol=3e-7)
    assert table[7] == 0 and table[0] == -1 and table[15] == 1


@pytest.mark.parametrize(
    ("table", "bits"),
    [
        (np.arange(4, dtype=np.int16), 2),
        (np.linspace(-1, 1, 8).astype(ml_dtypes.bfloat16), 3),
        (np.arange(256, dtype=np.uint8), 8),
    ],
)
def test_user_tables_keep_values_and_dtype(table, bits):
    cb = codebooks.codebook(table)
    assert cb.bits == bits and cb.dtype == table.dtype
    np.testing.assert_array_equal(cb.array(), table)
    assert hash(cb) == hash(codebooks.codebook(table.copy()))  # static, hashable
    assert cb.nbytes == table.nbytes


@pytest.mark.parametrize(
    ("table", "exc", "message"),
    [
        ([1.0, 2.0], TypeError, r"^codebook: expected a 1-D array of 2\*\*bits entries"),
        (np.zeros(4, np.float64), TypeError, r"^codebook: dtype float64 is not accepted"),
        (np.zeros(12, np.float32), ValueError, r"^codebook: expected a 1-D table of 2, 4"),
        (np.zeros((4, 4), np.int8), ValueError, r"got shape \(4, 4\)$"),
        (np.zeros(512, np.int16), ValueError, r"got shape \(512,\)$"),
    ],
)
def test_bad_tables_name_the_argument(table, exc, message):
    with pytest.raises(exc, match=message):
        codebooks.codebook(table)


def test_equality_is_by_table_and_the_hash_agrees():
    """A QArray built from NF4's values holds a codebook equal to NF4 (issue 40); the name
    is a label, not compared."""
    nf4 = codebooks.codebook(codebooks.NF4.array())
    q = emulate.QArray.from_parts(
        np.zeros((4, 2), np.uint8),
        np.ones((1, 2), np.float32),
        block_shape=(4, 1),
        codebook=codebooks.NF4.array(),
    )
    assert nf4 == codebooks.NF4 and q.codebook == codebooks.NF4 and nf4.name == "NF4"
    assert hash(nf4) == hash(codebooks.NF4) and len({nf4, codebooks.NF4}) == 1
    renamed = codebooks.codebook(codebooks.NF4.array(), name="mine")
    assert renamed == codebooks.NF4 and renamed.name == "mine"
    assert codebooks.NF4 != codebooks.codebook(codebooks.NF4.array().astype(np.float16))
    assert codebooks.NF4 != codebooks.IQ4_NL and codebooks.NF4 != codebooks.NF4.values
    nan = np.array([np.nan, 1.0], np.float32)
    assert codebooks.codebook(nan) == codebooks.codebook(nan.copy())
    assert codebooks.codebook(np.array([0.0, 1.0], np.float32)) != codebooks.codebook(
        np.array([-0.0, 1.0], np.float32)
    )
