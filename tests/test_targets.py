"""Tests for emulate.targets: native pairs, JAX's TPU table, aliases, detection, the
current-target context, and what XLA's CPU backend really compiles."""

from __future__ import annotations

import dataclasses
import itertools
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from emulate import formats, profiles, targets

TPUS = [t.name for t in targets.all_targets() if t.kind == "tpu"]
#: The generations libtpu 0.0.42.1 offers compile-only devices for (design.md).
PROBED = ["tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x"]
DN = (((1,), (0,)), ((), ()))


# ---------------------------------------------------------------------------------------
# Facts about native pairs


def test_table_order_and_names():
    assert targets.names() == (
        "tpu_v2",
        "tpu_v3",
        "tpu_v4",
        "tpu_v4i",
        "tpu_v5e",
        "tpu_v5p",
        "tpu_v6e",
        "tpu_v7",
        "tpu_v7x",
        "tpu_v8i",
        "cpu",
        "gpu_sm80",
        "gpu_sm89",
        "gpu_sm90",
        "gpu_sm100",
    )
    assert tuple(t.name for t in targets.all_targets()) == targets.names()


def test_tpu_facts_follow_the_compiler():
    # Measured with the real compiler (design.md, "The real TPU compiler"): Mosaic with its
    # compatibility mode off accepts same-type pairs only, e4m3fn on v5e/v5p/v6e too, and
    # refuses unsigned integers (Pallas) and int8 on v4 and 7x.
    v4, v5e, v7x = targets.get("tpu_v4"), targets.get("tpu_v5e"), targets.get("tpu_v7x")
    assert all(targets.get(t).rules == "compiler" for t in PROBED)
    assert not v4.supports("bfloat16", "int8")
    assert not v4.supports("int8", "int8")
    assert not v4.has_int8_matmul
    assert v5e.supports("int8", "int8") and v5e.has_int8_matmul
    assert v5e.supports("int4", "int4") and v5e.has_int4_matmul
    assert not v5e.supports("int8", "uint8")
    assert not v5e.supports("uint8", "uint8")
    assert v5e.supports("float8_e4m3fn", "float8_e4m3fn")
    assert v5e.supports("float8_e5m2", "float8_e5m2")
    assert not v7x.supports("bfloat16", "float8_e4m3fn")
    assert v7x.supports("float8_e4m3fn", "float8_e4m3fn")
    assert not v7x.supports("float8_e4m3fn", "float8_e5m2")
    assert not v7x.supports("int8", "int8")
    assert targets.get("tpu_v2").native_pairs == {("float32", "float32")}
    assert targets.get("tpu_v3").native_pairs == {("float32", "float32")}
    for t in TPUS:
        tgt = targets.get(t)
        assert not any("float4_e2m1fn" in pair for pair in tgt.native_pairs), t
        assert not any(f.startswith("float6") for pair in tgt.native_pairs for f in pair), t
        if tgt.rules == "compiler":
            assert all(a == b for a, b in tgt.native_pairs), t  # mixed: refused without compat


def test_tpu_table_pairs_keep_jax_s_table():
    v4, v5e, v7x = targets.get("tpu_v4"), targets.get("tpu_v5e"), targets.get("tpu_v7x")
    assert ("bfloat16", "int8") in v4.table_pairs
    assert ("int8", "uint8") in v5e.table_pairs
    assert ("float8_e4m3fn", "float8_e4m3fn") not in v5e.table_pairs
    assert ("bfloat16", "float8_e4m3fn") in v7x.table_pairs
    unprobed = [t for t in TPUS if t not in PROBED]
    assert unprobed == ["tpu_v4i", "tpu_v7", "tpu_v8i"]
    for t in unprobed:
        assert targets.get(t).rules == "table" and targets.get(t).table_pairs is None


def test_supports_takes_names_dtypes_and_formats():
    v5e = targets.get("tpu_v5e")
    assert v5e.supports(np.int8, jnp.int8)
    assert v5e.supports(ml_dtypes.int4, formats.get("int4"))
    assert v5e.supports("s8", "s8")
    assert not v5e.supports("s8", "u8")
    assert not v5e.supports(jnp.bfloat16, np.int8)
    with pytest.raises(ValueError, match="unknown format"):
        v5e.supports("int9", "int8")


def test_accumulator_and_native_formats():
    v5e = targets.get("tpu_v5e")
    assert v5e.accumulator("int8", "int8") == "int32"
    assert v5e.accumulator("float8_e5m2", "float8_e5m2") == "float32"
    assert v5e.accumulator("bfloat16", "float8_e5m2") is None
    assert v5e.accumulator("float8_e4m3fn", "float8_e4m3fn") == "float32"
    assert targets.get("tpu_v4").accumulator("bfloat16", "int8") is None
    assert targets.get("tpu_v7").native_formats == (
        "float8_e4m3fn",
        "float8_e5m2",
        "bfloat16",
        "float32",
    )


def test_rates():
    v4, v5e, v6e, v7x = (targets.get(n) for n in ("tpu_v4", "tpu_v5e", "tpu_v6e", "tpu_v7x"))
    assert v4.int8_ops_per_second == 0 and v4.fp8_ops_per_second == 0
    assert v5e.int8_ops_per_second == 2 * v5e.bf16_ops_per_second
    assert v5e.int4_ops_per_second == 4 * v5e.bf16_ops_per_second
    assert v6e.fp8_ops_per_second == v6e.bf16_ops_per_second
    assert v7x.fp8_ops_per_second == 2_300_000_000_000_000
    assert v7x.int8_ops_per_second == 0
    for name in TPUS:
        t = targets.get(name)
        assert t.f32_ops_per_second == t.bf16_ops_per_second // targets.TPU_F32_PASSES
        assert t.mxu_column_size in (128, 256)
        assert t.vmem_capacity_bytes and t.vmem_capacity_bytes >= 16 * 1024 * 1024
    cpu = targets.get("cpu")
    assert cpu.bf16_ops_per_second is None and cpu.mem_bw_bytes_per_second is None
    assert targets.get("gpu_sm90").fp8_ops_per_second == 1_979_000_000_000_000
    assert targets.get("gpu_sm80").fp8_ops_per_second == 0


def test_gpu_facts():
    wide = ("float32", "bfloat16", "float16")
    e4, e5 = "float8_e4m3fn", "float8_e5m2"
    for name in ("gpu_sm80", "gpu_sm89", "gpu_sm90", "gpu_sm100"):
        t = targets.get(name)
        assert all(t.supports(a, b) for a, b in itertools.product(wide, wide))
        assert t.has_int8_matmul and not t.has_int4_matmul
        assert not t.supports("float4_e2m1fn", "float4_e2m1fn")
        assert not t.supports("bfloat16", e4)
        assert not t.supports(e5, e5)
        assert (
            t.supports(e4, e4) == t.supports(e4, e5) == t.supports(e5, e4) == (name != "gpu_sm80")
        )
    assert targets.get("gpu_sm90").compute_capability == "9.0"


def test_target_is_frozen_and_short_repr():
    t = targets.get("tpu_v5e")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.name = "x"  # type: ignore[misc]
    assert repr(t) == "Target('tpu_v5e')"


# ---------------------------------------------------------------------------------------
# JAX's TPU table and the builtin copy


def test_tpu_rows_come_from_jax():
    assert all(targets.get(t).source == "jax" for t in TPUS)
    assert all(t.source == "builtin" for t in targets.all_targets() if t.kind != "tpu")


@pytest.mark.parametrize("name", TPUS)
def test_builtin_copy_agrees_with_jax(name):
    from jax.experimental.pallas import tpu as pltpu

    builtin = targets.Target(**{t.name: t for t in profiles.BUILTIN}[name]._asdict())
    chip = pltpu.ChipVersion(profiles.JAX_CHIP[name])
    info = pltpu.get_tpu_info_for_chip(chip, 1)
    # formats numpy has a type for (the P3109 records travel as uint8 codes, which JAX's
    # table would read as uint8)
    typed = [n for n in formats.names() if formats.get(n).has_dtype]
    for a, b in itertools.product(typed, repeat=2):
        want = info.is_matmul_supported(formats.get(a).dtype, formats.get(b).dtype)
        assert builtin.supports(a, b) == want, (name, a, b)
    assert builtin.generation == info.generation
    assert builtin.bf16_ops_per_second == info.bf16_ops_per_second
    assert builtin.int8_ops_per_second == info.int8_ops_per_second
    assert builtin.fp8_ops_per_second == info.fp8_ops_per_second
    assert builtin.int4_ops_per_second == info.int4_ops_per_second
    assert builtin.mem_bw_bytes_per_second == info.mem_bw_bytes_per_second
    assert builtin.vmem_capacity_bytes == info.vmem_capacity_bytes
    assert builtin.mxu_column_size == info.mxu_column_size
    assert builtin.cores_per_chip == chip.num_physical_tensor_cores_per_chip
    row = targets.get(name)
    if row.rules == "compiler":  # JAX's table is kept beside the compiler's pairs
        row = dataclasses.replace(
            row, native_pairs=row.table_pairs, rules="table", table_pairs=None
        )
    assert dataclasses.replace(row, source="builtin") == builtin


def test_every_jax_chip_has_a_profile():
    from jax.experimental.pallas import tpu as pltpu

    assert {c.value for c in pltpu.ChipVersion} == set(profiles.JAX_CHIP.values())


def test_falls_back_to_builtin_when_jax_table_is_missing(monkeypatch):
    from jax.experimental.pallas import tpu as pltpu

    monkeypatch.delattr(pltpu, "get_tpu_info_for_chip")
    table = targets.build_table()
    assert all(t.source == "builtin" for t in table.values())
    for built, row in zip(table.values(), profiles.BUILTIN, strict=True):
        builtin = targets.Target(**row._asdict())
        assert (built.table_pairs or built.native_pairs) == builtin.native_pairs
        assert (
            dataclasses.replace(
                built, native_pairs=builtin.native_pairs, rules="table", table_pairs=None
            )
            == builtin
        )


def test_falls_back_when_jax_table_changes_shape(monkeypatch):
    from jax.experimental.pallas import tpu as pltpu

    class Renamed:
        generation = 5

    monkeypatch.setattr(pltpu, "get_tpu_info_for_chip", lambda chip, cores: Renamed())
    assert all(t.source == "builtin" for t in targets.build_table().values())


# ---------------------------------------------------------------------------------------
# Aliases and errors

ALIASES = [
    ("tpu_v4", "tpu_v4"),
    ("v4", "tpu_v4"),
    ("TPU v4", "tpu_v4"),
    ("tpu v4", "tpu_v4"),
    ("TPU-V4", "tpu_v4"),
    ("TPU v4 lite", "tpu_v4i"),
    ("v4i", "tpu_v4i"),
    ("v2", "tpu_v2"),
    ("TPU v3", "tpu_v3"),
    ("v5e", "tpu_v5e"),
    ("TPU v5e", "tpu_v5e"),
    ("TPU v5 lite", "tpu_v5e"),
    ("v5p", "tpu_v5p"),
    ("TPU v5", "tpu_v5p"),
    ("TPU v5p", "tpu_v5p"),
    ("v6e", "tpu_v6e"),
    ("TPU v6e", "tpu_v6e"),
    ("TPU v6 lite", "tpu_v6e"),
    ("Trillium", "tpu_v6e"),
    ("v7", "tpu_v7"),
    ("TPU7", "tpu_v7"),
    ("tpu7", "tpu_v7"),
    ("7x", "tpu_v7x"),
    ("v7x", "tpu_v7x"),
    ("TPU7x", "tpu_v7x"),
    ("ironwood", "tpu_v7x"),
    ("TPU8i", "tpu_v8i"),
    ("v8i", "tpu_v8i"),
    ("cpu", "cpu"),
    ("CPU", "cpu"),
    ("sm80", "gpu_sm80"),
    ("A100", "gpu_sm80"),
    ("sm_89", "gpu_sm89"),
    ("sm90", "gpu_sm90"),
    ("H100", "gpu_sm90"),
    ("sm100", "gpu_sm100"),
    ("  GPU_SM100 ", "gpu_sm100"),
]


@pytest.mark.parametrize(("alias", "name"), ALIASES)
def test_aliases(alias, name):
    assert targets.get(alias).name == name


def test_get_returns_targets_as_they_are():
    t = targets.get("v5e")
    assert targets.get(t) is t
    assert targets.get("tpu_v5e") is t
    custom = dataclasses.replace(t, name="custom")
    assert targets.get(custom) is custom


def test_unknown_target_message():
    known = (
        "tpu_v2, tpu_v3, tpu_v4, tpu_v4i, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x, tpu_v8i, "
        "cpu, gpu_sm80, gpu_sm89, gpu_sm90, gpu_sm100"
    )
    with pytest.raises(ValueError) as info:
        targets.get("tpu_v9")
    assert str(info.value) == f"target: unknown target 'tpu_v9'; known targets: {known}"
    with pytest.raises(TypeError, match=r"^target: expected a target name or Target, got int 4$"):
        targets.get(4)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Detection

DEVICE_KINDS = [
    ("TPU v2", "tpu_v2"),
    ("TPU v3", "tpu_v3"),
    ("TPU v4", "tpu_v4"),
    ("TPU v4 lite", "tpu_v4i"),
    ("TPU v5e", "tpu_v5e"),
    ("TPU v5 lite", "tpu_v5e"),
    ("TPU v5", "tpu_v5p"),
    ("TPU v5p", "tpu_v5p"),
    ("TPU v6e", "tpu_v6e"),
    ("TPU v6 lite", "tpu_v6e"),
    ("TPU7", "tpu_v7"),
    ("TPU7x", "tpu_v7x"),
    ("TPU8i", "tpu_v8i"),
]


@pytest.mark.parametrize(("kind", "name"), DEVICE_KINDS)
def test_detect_tpu(kind, name):
    from jax._src.pallas.mosaic import tpu_info

    assert targets.detect("tpu", kind).name == name
    assert tpu_info.chip_version_from_device_kind(kind).value == profiles.JAX_CHIP[name]


def test_detect_covers_every_device_kind_of_the_table():
    listed = {k for t in targets.all_targets() if t.kind == "tpu" for k in t.device_kinds}
    assert listed == {k for k, _ in DEVICE_KINDS}


@pytest.mark.parametrize(
    ("platform", "cc", "name"),
    [
        ("gpu", "8.0", "gpu_sm80"),
        ("gpu", "8.6", "gpu_sm80"),
        ("gpu", "8.9", "gpu_sm89"),
        ("cuda", "9.0", "gpu_sm90"),
        ("gpu", "10.0", "gpu_sm100"),
        ("gpu", "12.0", "gpu_sm100"),
        ("gpu", "7.0", "gpu_sm80"),
        ("gpu", None, "gpu_sm80"),
        ("cpu", None, "cpu"),
        ("CPU", None, "cpu"),
    ],
)
def test_detect_gpu_and_cpu(platform, cc, name):
    assert targets.detect(platform, "some device", cc).name == name


def test_detect_errors():
    with pytest.raises(ValueError, match=r"^device_kind: unknown TPU device kind 'TPU v9';"):
        targets.detect("tpu", "TPU v9")
    with pytest.raises(ValueError, match=r"^platform: no target profile for platform 'rocm'"):
        targets.detect("rocm", "MI300X")
    with pytest.raises(ValueError, match=r"^compute_capability: expected 'major.minor'"):
        targets.detect("gpu", "", "sm90")


def test_from_device_on_this_backend():
    dev = jax.devices()[0]
    t = targets.from_device(dev)
    if dev.platform == "cpu":
        assert t.name == "cpu"


# ---------------------------------------------------------------------------------------
# The current target


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("EMULATE_TARGET", raising=False)


def test_current_target_detects_by_default(no_env):
    assert targets.current_target() == targets.from_device(jax.devices()[0])


def test_use_target_nests_and_restores(no_env):
    base = targets.current_target()
    assert targets.target is targets.use_target
    with targets.use_target("tpu_v4") as t4:
        assert t4.name == "tpu_v4" and targets.current_target() is t4
        with targets.target("v5e"):
            assert targets.current_target().name == "tpu_v5e"
            assert targets.current_target("cpu").name == "cpu"  # explicit wins
        assert targets.current_target().name == "tpu_v4"
        with pytest.raises(RuntimeError), targets.use_target("tpu_v7x"):
            raise RuntimeError
        assert targets.current_target().name == "tpu_v4"
    assert targets.current_target() == base


def test_use_target_rejects_unknown_before_entering(no_env):
    with pytest.raises(ValueError, match="unknown target 'nope'"), targets.use_target("nope"):
        pass
    assert targets.current_target() == targets.from_device(jax.devices()[0])


def test_use_target_does_not_leak_across_threads(monkeypatch):
    monkeypatch.setenv("EMULATE_TARGET", "gpu_sm90")
    seen: dict[str, str] = {}
    inside = threading.Barrier(2)
    checked = threading.Barrier(2)

    def worker():
        seen["start"] = targets.current_target().name
        with targets.use_target("tpu_v5e"):
            inside.wait()
            checked.wait()
            seen["inside"] = targets.current_target().name
        seen["after"] = targets.current_target().name

    with targets.use_target("tpu_v4"):
        thread = threading.Thread(target=worker)
        thread.start()
        inside.wait()
        seen["main"] = targets.current_target().name
        checked.wait()
        thread.join()
        assert targets.current_target().name == "tpu_v4"
    assert seen == {"start": "gpu_sm90", "main": "tpu_v4", "inside": "tpu_v5e", "after": "gpu_sm90"}
    assert targets.current_target().name == "gpu_sm90"


def test_env_var(monkeypatch):
    monkeypatch.setenv("EMULATE_TARGET", "TPU v5 lite")
    assert targets.current_target().name == "tpu_v5e"
    with targets.use_target("tpu_v4"):
        assert targets.current_target().name == "tpu_v4"
    assert targets.current_target("v7x").name == "tpu_v7x"
    monkeypatch.setenv("EMULATE_TARGET", "tpu_v99")
    with pytest.raises(ValueError, match=r"^EMULATE_TARGET: unknown target 'tpu_v99'; known"):
        targets.current_target()
    monkeypatch.setenv("EMULATE_TARGET", "")
    assert targets.current_target() == targets.from_device(jax.devices()[0])


# ---------------------------------------------------------------------------------------
# What XLA's CPU backend compiles (pins: these fail when XLA changes)


def _cpu_dot(a: np.ndarray, b: np.ndarray, pref) -> np.ndarray:
    cpu = jax.devices("cpu")[0]
    a, b = jax.device_put(a, cpu), jax.device_put(b, cpu)
    return np.asarray(
        jax.jit(lambda x, y: lax.dot_general(x, y, DN, preferred_element_type=pref))(a, b)
    )


@pytest.mark.parametrize(
    ("fmt", "pref"), [("int4", jnp.int32), ("uint4", jnp.int32), ("float4_e2m1fn", jnp.float32)]
)
def test_cpu_sub_byte_dot_still_fails_to_compile(fmt, pref):
    x = np.ones((2, 4), formats.get(fmt).dtype)
    with pytest.raises(Exception, match="custom element sizes on non-sub-byte types"):
        _cpu_dot(x, x.T, pref)
    assert not targets.get("cpu").supports(fmt, fmt)


def _small_values(fmt: str) -> np.ndarray:
    """Finite values of ``fmt`` that are multiples of 1/4 with magnitude at most 8."""
    f = formats.get(fmt)
    if f.bits > 8:
        return np.arange(-32, 33) / 4.0
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        v = codes.view(f.dtype).astype(np.float64)
    ok = np.isfinite(v) & (np.abs(v) <= 8)
    ok[ok] &= np.mod(v[ok] * 4, 1) == 0
    return np.unique(v[ok])


@pytest.mark.parametrize("pair", sorted(targets.get("cpu").native_pairs))
def test_cpu_native_pairs_compile_exactly(pair):
    """Sums up to 2048 in steps of 1/16: exact in f32/int32, but not in any 8- or 16-bit
    type, so a dot that rounded into the operand type or accumulated narrowly would fail."""
    a, b = (formats.get(n) for n in pair)
    pref = jnp.int32 if a.is_integer and b.is_integer else jnp.float32
    rng = np.random.default_rng(0)
    x = rng.choice(_small_values(a.name), (4, 32))
    y = rng.choice(_small_values(b.name), (32, 3))
    got = _cpu_dot(x.astype(a.dtype), y.astype(b.dtype), pref)
    assert got.dtype == pref
    np.testing.assert_array_equal(got.astype(np.float64), x @ y)


def test_cpu_int8_dot_wraps_like_int32():
    k = 200_000
    x = np.full((1, k), -128, np.int8)
    got = _cpu_dot(x, x.T.copy(), jnp.int32)
    assert int(got[0, 0]) == (16384 * k + 2**31) % 2**32 - 2**31


def test_cpu_mixed_pairs_are_converted_by_jax_before_xla():
    """Why the cpu profile lists no mixed pair with a low-precision operand."""
    a = jnp.zeros((4, 32), jnp.int8)
    b = jnp.zeros((32, 3), jnp.uint8)
    text = jax.jit(lambda x, y: lax.dot_general(x, y, DN, preferred_element_type=jnp.int32))
    hlo = text.lower(a, b).as_text()
    assert "stablehlo.convert" in hlo and "tensor<4x32xi32>" in hlo
    assert not targets.get("cpu").supports("int8", "uint8")
    assert not targets.get("cpu").supports("bfloat16", "float8_e4m3fn")


def test_cpu_facts():
    cpu = targets.get("cpu")
    for f in ("float32", "bfloat16", "float16"):
        for g in ("float32", "bfloat16", "float16"):
            assert cpu.supports(f, g)
    assert cpu.has_int8_matmul and cpu.supports("uint8", "uint8")
    assert cpu.supports("float8_e4m3fn", "float8_e4m3fn")
    assert not cpu.supports("float8_e8m0fnu", "float8_e8m0fnu")
    assert not cpu.supports("float6_e2m3fn", "float6_e2m3fn")
    assert not cpu.has_int4_matmul


def test_building_for_tpu_reads_the_backend_default_device_and_abstract_mesh():
    from emulate import compiler

    assert targets.building_for_tpu() is False
    assert targets.building_for_tpu(jnp.ones(2), {"w": np.ones(2)}) is False
    with jax.default_device(compiler.device("tpu_v4")):
        assert targets.building_for_tpu() is True
    device = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=device)):
        assert targets.building_for_tpu() is True
    assert targets.building_for_tpu() is False


def test_tpu_branch_builds_for_a_tpu_inside_the_block_only():
    assert targets.building_for_tpu() is False
    with targets.tpu_branch():
        assert targets.building_for_tpu() is True
        with targets.tpu_branch():
            assert targets.building_for_tpu() is True
        assert targets.building_for_tpu() is True
    assert targets.building_for_tpu() is False
    with pytest.raises(KeyError), targets.tpu_branch():
        raise KeyError("left by an exception")
    assert targets.building_for_tpu() is False
