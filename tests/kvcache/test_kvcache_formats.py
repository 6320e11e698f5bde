"""emulate.kvcache.formats: the named cache formats, their storage, and the checks of a
format built by hand."""

from __future__ import annotations

import numpy as np
import pytest

from emulate.kvcache import FORMATS, CacheFormat, cache_format


def test_the_named_formats_store_what_their_names_say() -> None:
    table = {
        n: (f.element, f.granularity, f.block, f.scale_format, f.scale_rule, f.bits)
        for n, f in FORMATS.items()
    }
    assert table == {
        "bfloat16": ("bfloat16", None, None, None, None, 16),
        "int8": ("int8", "token", None, "float32", "absmax", 8),
        "float8_e4m3fn": ("float8_e4m3fn", "token", None, "float32", "absmax", 8),
        "float8_e5m2": ("float8_e5m2", "token", None, "float32", "absmax", 8),
        "int8_per_head": ("int8", "head", None, "float32", None, 8),
        "float8_e4m3fn_per_head": ("float8_e4m3fn", "head", None, "float32", None, 8),
        "float8_e5m2_per_head": ("float8_e5m2", "head", None, "float32", None, 8),
        "q8_0": ("int8", "block", 32, "float16", "absmax", 8),
        "q4_0": ("int4", "block", 32, "float16", "absmax", 4),
        "mxfp4": ("float4_e2m1fn", "block", 32, "float8_e8m0fnu", "ocp_floor", 4),
    }
    assert FORMATS["q4_0"].code_dtype == np.uint8 and FORMATS["q4_0"].packed
    assert FORMATS["q4_0"].scale_dtype == np.uint16  # float16 bits: Mosaic loads no f16
    assert FORMATS["mxfp4"].scale_dtype == np.uint8
    assert str(FORMATS["float8_e5m2"].code_dtype) == "float8_e5m2"
    assert FORMATS["q4_0"].blocks(128) == 4 and FORMATS["int8"].blocks(128) == 1


@pytest.mark.parametrize(
    ("name", "per_token"),
    # Llama-3-8B's 8 KV heads of 128: bytes of one token of one layer, K and V
    [("bfloat16", 4096), ("int8", 2 * (1024 + 32)), ("int8_per_head", 2048),
     ("q8_0", 2 * (1024 + 64)), ("q4_0", 2 * (512 + 64)), ("mxfp4", 2 * (512 + 32))],
)  # fmt: skip
def test_bytes_per_token(name, per_token) -> None:
    assert FORMATS[name].bytes_per_token(8, 128) == per_token


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (("x", "int2", "token", None, "float32", "absmax"), "element: expected one of bfloat16"),
        (("x", "int8", None), "granularity: a int8 cache needs scales"),
        (("x", "bfloat16", "token", None, "float32", "absmax"), "stores no scales"),
        (("x", "int8", "block", None, "float16", "absmax"), "block: None with granularity 'block'"),
        (("x", "int8", "token", 32, "float32", "absmax"), "block: 32 with granularity 'token'"),
        (("x", "int8", "block", 12, "float16", "absmax"), "block: expected a positive multiple"),
        (("x", "int8", "token", None, "bfloat16", "absmax"), "scale_format: 'bfloat16'"),
        (("x", "int8", "head", None, "float16", None), "scale_format: 'float16' with gran"),
        (("x", "int8", "token", None, "float32", None), "scale_rule: None with granularity"),
        (("x", "int8", "head", None, "float32", "absmax"), "scale_rule: 'absmax' with gran"),
        (("x", "int4", "block", 32, "float8_e8m0fnu", "absmax"), "'absmax' scales are not powers"),
    ],
)  # fmt: skip
def test_a_format_built_by_hand_is_checked(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        CacheFormat(*fields)


def test_cache_format_resolves_names_and_records() -> None:
    own = CacheFormat("int4_per_token", "int4", "token", None, "float32", "absmax")
    assert cache_format(own) is own and own.packed
    assert cache_format("mxfp4") is FORMATS["mxfp4"]
    with pytest.raises(ValueError, match="format: unknown cache format 'fp8'; known: bfloat16"):
        cache_format("fp8")
    with pytest.raises(TypeError, match="format: expected a cache format name"):
        cache_format(8)
