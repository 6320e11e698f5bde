"""benchmarks.kv_attention without compiling: the shape flag, the abstract cache it
measures and its table."""

from __future__ import annotations

import pytest

from benchmarks import harness, kv_attention


def test_the_shape_flag_and_the_cache_it_makes():
    assert kv_attention._shape(None) == (16, 8, 4, 128, 4096)
    assert kv_attention._shape("2,1,4,64,256") == (2, 1, 4, 64, 256)
    with pytest.raises(harness.FlagError, match=r"--shape: expected B,KV,G,HD,S .* got '2,1'"):
        kv_attention._shape("2,1")
    q, cache = kv_attention.specs("q4_0", (2, 1, 4, 64, 256))
    assert q.shape == (2, 1, 4, 64)
    # 4-bit codes two a token-byte, a float16 scale per 32 elements, K and V, + lengths
    assert cache.nbytes == 2 * (2 * 256 * 64 // 2 + 2 * 2 * 256 * 2) + 2 * 4


def test_the_table_has_a_row_per_measurement():
    row = {
        "generation": "tpu_v2", "cache": "int8", "stored": 3 << 20, "kernel_over_ideal": 1.0012,
        "temp_over_cache": 0.0004, "xla_over_ideal": None,
    }  # fmt: skip
    text = kv_attention.markdown({"command": "c", "libtpu": "x", "wall_s": 2, "results": [row]})
    assert text.splitlines()[-1] == "| tpu_v2 | int8 | 3.0 | 1.0012 | 0.04% | ? |"
