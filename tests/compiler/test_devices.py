"""Tests for emulate.compiler.devices: libtpu (a declared test dependency) and the
compile-only TPU device per target."""

from __future__ import annotations

import pytest

from emulate import compiler, targets
from emulate.compiler import devices

OFFERED = ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x")
NO_TOPOLOGY = ("tpu_v4i", "tpu_v7", "tpu_v8i")
DEVICE_KINDS = {
    "tpu_v2": "TPU v2",
    "tpu_v3": "TPU v3",
    "tpu_v4": "TPU v4",
    "tpu_v5e": "TPU v5 lite",
    "tpu_v5p": "TPU v5",
    "tpu_v6e": "TPU v6 lite",
    "tpu_v7x": "TPU7x",
}


def test_libtpu_is_installed_and_offers_seven_generations():
    assert compiler.libtpu_version() is not None
    assert compiler.available()
    assert compiler.generations() == OFFERED
    assert tuple(devices.offered_devices()) == OFFERED


def test_topologies_cover_every_tpu_target_and_nothing_else():
    tpus = tuple(t.name for t in targets.all_targets() if t.kind == "tpu")
    assert tuple(compiler.TOPOLOGIES) == tpus
    assert tuple(t for t, n in compiler.TOPOLOGIES.items() if n is None) == NO_TOPOLOGY


@pytest.mark.parametrize("target", OFFERED)
def test_device_per_offered_target(target):
    dev = compiler.device(target)
    assert dev.platform == "tpu"
    assert dev.device_kind == DEVICE_KINDS[target]
    assert compiler.device(target) is dev  # cached
    assert compiler.device(targets.get(target)) is dev


@pytest.mark.parametrize(
    ("topology", "kind", "chips", "cores"),
    [
        ("v5e:2x4", "TPU v5 lite", 8, 1),
        ("v6e:2x4", "TPU v6 lite", 8, 1),
        ("v4:2x2x2", "TPU v4", 8, 2),
    ],
)
def test_topology_devices_of_an_eight_chip_topology(topology, kind, chips, cores):
    devs = compiler.topology_devices(topology)
    assert len(devs) == chips * cores
    assert {d.device_kind for d in devs} == {kind}
    assert len({tuple(d.coords) for d in devs}) == chips
    assert sorted({d.core_on_chip for d in devs}) == list(range(cores))


def test_topology_devices_names_a_refused_topology():
    with pytest.raises(ValueError, match=r"^topology: libtpu [\d.]+ refuses 'v9:1x1' \("):
        compiler.topology_devices("v9:1x1")


def test_device_accepts_aliases():
    assert compiler.device("v5e") is compiler.device("tpu_v5e")
    assert compiler.device("TPU v6 lite") is compiler.device("tpu_v6e")
    assert compiler.device("ironwood") is compiler.device("tpu_v7x")


@pytest.mark.parametrize("target", NO_TOPOLOGY)
def test_device_without_topology_names_the_target(target):
    expected = (
        f"target: libtpu {compiler.libtpu_version()} offers no compile-only topology for "
        f"'{target}'; accepted: tpu_v2, tpu_v3, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7x"
    )
    with pytest.raises(ValueError) as e:
        compiler.device(target)
    assert str(e.value) == expected


@pytest.mark.parametrize("target", ["cpu", "gpu_sm90"])
def test_device_for_a_non_tpu_target(target):
    expected = (
        f"target: the TPU compiler compiles for TPU targets only, got '{target}'; "
        "accepted: tpu_v2, tpu_v3, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7x"
    )
    with pytest.raises(ValueError) as e:
        compiler.device(target)
    assert str(e.value) == expected


def test_device_for_an_unknown_target():
    with pytest.raises(ValueError, match=r"^target: unknown target 'tpu_v9'; known targets: "):
        compiler.device("tpu_v9")


def test_without_libtpu_one_clear_message(monkeypatch):
    monkeypatch.setattr(devices, "libtpu_version", lambda: None)
    expected = (
        "the real TPU compiler is unavailable: libtpu is not installed; install it with "
        "pip install 'jax[tpu]' (or emulate[tpu]). The recorded probe "
        "(emulate.mosaic.recorded(), verdict()) needs no compiler."
    )
    with pytest.raises(compiler.CompilerUnavailable) as e:
        devices.offered_devices.__wrapped__()
    assert str(e.value) == expected
    assert isinstance(e.value, RuntimeError)

    def unavailable():
        raise compiler.CompilerUnavailable.because("libtpu is not installed")

    monkeypatch.setattr(devices, "offered_devices", unavailable)
    assert not compiler.available()
    with pytest.raises(compiler.CompilerUnavailable, match="^the real TPU compiler is"):
        compiler.device("tpu_v5e")
    with pytest.raises(compiler.CompilerUnavailable):
        compiler.generations()
    # the recorded data needs no compiler
    assert targets.get("tpu_v5e").compiles("int8", "int8")


@pytest.mark.parametrize(
    "init_args, setting",
    [
        ("", True),
        ("--xla_mosaic_compat_mode=false", False),
        ("--foo=1 --xla_mosaic_compat_mode=0", False),
        ("--xla_mosaic_compat_mode=false --xla_mosaic_compat_mode=true", True),
        ("--xla_mosaic_compat_mode", True),
    ],
)
def test_compat_setting_from_libtpu_init_args(init_args, setting):
    assert devices.compat_setting(init_args) is setting


def test_libtpu_noise_and_first_lines():
    assert devices.is_libtpu_noise("W0000 TPU_ACCELERATOR_TYPE is not set")
    assert devices.is_libtpu_noise("   ")
    assert not devices.is_libtpu_noise("E2001: Unsupported matmul RHS type")
    assert compiler.first_line(
        "\n  INTERNAL: Mosaic failed to compile TPU kernel: Bad lhs/rhs type\nmore"
    ) == ("Bad lhs/rhs type")
