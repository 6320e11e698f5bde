"""Tests for emulate.pallas.checking.sites: the tpu.matmul sites read from the Mosaic modules JAX
ships for each pallas_call, lowered for TPU on the CPU."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

import emulate
import emulate.pallas
from emulate import formats
from emulate.pallas.checking import sites

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import _pallas_kernels as kernels  # noqa: E402

I8 = jax.ShapeDtypeStruct((256, 256), jnp.int8)


def test_int8_dot_is_bf16_on_v4_and_v7x_and_int8_on_v5e_and_v6e():
    # (element type, K per tpu.matmul): a decoded pair goes a K-slice of the MXU width at
    # a time, two of 128 on a v4, one of 256 on a v7x
    expect = {
        "tpu_v4": ("bf16", 128), "tpu_v7x": ("bf16", 256),
        "tpu_v5e": ("i8", 256), "tpu_v6e": ("i8", 256),
    }  # fmt: skip
    for target, (e, k) in expect.items():
        got = sites.matmul_sites(kernels.fixed_int8, I8, I8, target=target)
        assert len(got) == 256 // k, target
        for site in got:
            assert (site.lhs_type, site.rhs_type) == (
                f"vector<256x{k}x{e}>",
                f"vector<{k}x256x{e}>",
            ), target
            assert site.acc_type == f"vector<256x256x{'i32' if e == 'i8' else 'f32'}>"
            assert str(site).endswith(
                f"kernel {site.kernel!r}: tpu.matmul {site.lhs_type}, "
                f"{site.rhs_type} -> {site.acc_type}"
            )


def test_traces_are_fresh_for_each_target():
    # fixed_int8 reads the current target when traced; JAX would reuse a cached trace.
    order = ["tpu_v5e", "tpu_v4", "tpu_v5e", "tpu_v7x"]
    got = [sites.matmul_sites(kernels.fixed_int8, I8, I8, target=t)[0].lhs_type for t in order]
    assert got == [
        "vector<256x256xi8>",
        "vector<256x128xbf16>",
        "vector<256x256xi8>",
        "vector<256x256xbf16>",
    ]


def test_mlir_element_types_map_to_formats():
    for mlir, name in sites.MLIR_FORMATS.items():
        assert formats.get(name).name == name, mlir
    assert sites.element_format("vector<8x128xf8E4M3FN>") == "float8_e4m3fn"
    assert sites.element_format("vector<2x8x128xi4>") == "int4"
    assert sites.element_format("vector<8x128xi32>") is None
    assert sites.element_format("i8") is None
    assert sites.acc_format("vector<8x128xi32>") == "int32"
    assert sites.acc_format("vector<8x128xf32>") == "float32"
    assert sites.acc_format("vector<8x128xi8>") is None


def test_every_tpu_target_has_a_device_kind_and_others_are_refused():
    tpus = [t.name for t in emulate.targets.all_targets() if t.kind == "tpu"]
    assert list(sites.DEVICE_KINDS) == tpus
    assert sites.tpu_target("v5e").name == "tpu_v5e"
    with pytest.raises(ValueError) as e:
        sites.tpu_target("cpu")
    assert str(e.value) == (
        "target: the check predicts Mosaic's TPU compiler, and cpu is not a TPU; pass one of "
        + ", ".join(tpus)
    )


def test_a_refused_lowering_is_the_error_jax_raised():
    u8 = jax.ShapeDtypeStruct((128, 128), jnp.uint8)
    with pytest.raises(sites.LoweringRefused) as e:
        sites.lower(kernels.raw_int8, (u8, u8), emulate.targets.get("tpu_v5e"))
    assert "Unsigned integer dtype uint8 is not supported" in str(e.value.error)
    with pytest.raises(TypeError, match=r"^fn: expected a callable, got int$"):
        sites.lower(3, (), None)  # type: ignore[arg-type]
