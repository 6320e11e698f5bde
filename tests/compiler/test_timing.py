"""emulate.compiler.timing: a program's time from its schedule, on the checked-in schedules
of tests/compiler/schedules (counts worked out by hand in test_replay) and through libtpu
(one small compile in the dumping subprocess)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from emulate import compiler
from emulate.compiler import generation, timing
from tests.compiler._schedules import LIBTPU, SCHEDULES, spec, tiny_matmul

#: What the hand count of test_replay gives for the v5e schedule: bundles issued, bytes.
ISSUED, READ, WRITTEN = 1670, 16 * 65536, 4 * 65536


def test_the_checked_in_program_as_estimated():
    g = dataclasses.replace(generation("tpu_v5e", calibrated=False), clock_hz=1e9)
    t = compiler.estimate_dump(SCHEDULES / "tpu_v5e", "tpu_v5e", constants=g)
    assert (t.target, t.generation, t.xla, t.xla_optimal_seconds) == ("tpu_v5e", g, (), None)
    k = t.kernel()
    assert (k.name, k.kind, k.calls, k.bundles, k.grid, k.steps) == (
        "tiny_matmul.1",
        "kernel",
        1,
        227,
        (2, 2, 2),
        8,
    )
    assert (k.issued, k.hbm_read_bytes, k.hbm_write_bytes) == (ISSUED, READ, WRITTEN)
    assert k.compute_seconds == pytest.approx(ISSUED * 1e-9)
    assert k.dma_seconds == pytest.approx((READ + WRITTEN) / 820e9)
    assert k.seconds == pytest.approx(k.compute_seconds + k.stall_seconds)
    assert k.bundles_per_step == ISSUED / 8 and k.bound == "compute"
    assert t.kernel("tiny_matmul") is k and t.kernel_seconds == k.seconds
    assert t.seconds == pytest.approx(t.top_level_seconds + k.seconds)
    assert t.hbm_bytes == READ + WRITTEN
    assert "call of <late-initialization>: not in the dump, 0 cycles" in t.unresolved
    first, header, row = t.table().splitlines()
    assert first == f"tpu_v5e (1.000 GHz, HBM 820 GB/s, uncalibrated): {t.seconds * 1e6:.1f} us"
    assert header.split() == ["program", "kind", "calls", "bundles", "steps", "b/step", "us",
                              "DMA", "MB", "DMA", "us", "bound"]  # fmt: skip
    assert row.split()[:6] == ["tiny_matmul.1", "kernel", "1", "227", "8", "209"]


def test_a_slower_bandwidth_makes_the_kernel_memory_bound():
    g = dataclasses.replace(
        generation("tpu_v5e", calibrated=False), clock_hz=1e9, hbm_bytes_per_second=1e9
    )
    k = compiler.estimate_dump(SCHEDULES / "tpu_v5e", "tpu_v5e", constants=g).kernel()
    assert k.bound == "memory" and k.dma_seconds == pytest.approx((READ + WRITTEN) / 1e9)
    # the DMAs one after another set the time; at most the bundles' cycles come on top
    assert k.dma_seconds < k.seconds < k.dma_seconds + ISSUED * 1e-9


def test_naming_a_kernel_the_program_lacks():
    t = compiler.estimate_dump(SCHEDULES / "tpu_v5e", "tpu_v5e")
    with pytest.raises(ValueError) as e:
        t.kernel("attention")
    assert str(e.value) == "name: no kernel named 'attention'; the program's kernels: tiny_matmul.1"
    xla_only = dataclasses.replace(t, kernels=())
    with pytest.raises(ValueError) as e:
        xla_only.kernel()
    assert str(e.value) == (
        "the program has no Mosaic kernel (no tpu_custom_call): it is XLA's alone; "
        "its fusions: none"
    )
    two = dataclasses.replace(t, kernels=t.kernels * 2)
    with pytest.raises(ValueError, match=r"^name: several kernels match None; the program's"):
        two.kernel()


def test_a_directory_without_one_top_level_program(tmp_path):
    with pytest.raises(ValueError) as e:
        compiler.estimate_dump(tmp_path, "tpu_v5e")
    assert str(e.value).startswith(
        f"directory: expected one top-level program's final bundles (*-TLP-*final_bundles.txt) "
        f"in {str(tmp_path)!r}, found 0; dump with LIBTPU_INIT_ARGS="
    )


def _uint8_dot(x, w):
    from jax.experimental import pallas as pl

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.int32))(x, w)


def test_estimate_through_libtpu():
    t = compiler.estimate(tiny_matmul, spec(), spec(), target="tpu_v5e", calibrated=False)
    k = t.kernel()
    assert (k.grid, k.steps, k.calls, k.kind) == ((2, 2, 2), 8, 1, "kernel")
    assert (k.hbm_read_bytes, k.hbm_write_bytes) == (READ, WRITTEN)
    assert t.libtpu == compiler.libtpu_version()
    if t.libtpu == LIBTPU:  # the libtpu that wrote the checked-in schedule
        assert (k.bundles, k.issued) == (227, ISSUED)
    # the program the compiler refuses
    u8 = jax.ShapeDtypeStruct((128, 128), jnp.uint8)
    with pytest.raises(compiler.ProgramRefused) as e:
        compiler.estimate(_uint8_dot, u8, u8, target="tpu_v5e")
    assert e.value.verdict.stage == "lower" and str(e.value).startswith(
        "the program did not compile (lower): "
    )


def test_estimate_refuses_before_compiling():
    with pytest.raises(
        ValueError, match=r"^target: the TPU compiler compiles for TPU targets only, got 'cpu'"
    ):
        compiler.estimate(tiny_matmul, spec(), spec(), target="cpu")
    with pytest.raises(
        TypeError, match=r"^fn: reading the compiler's schedule compiles in a subprocess"
    ):
        compiler.estimate(lambda x: x, spec(), target="tpu_v5e")
    with pytest.raises(TypeError, match=r"^arg_specs: expected leaves with shape and dtype"):
        compiler.estimate(functools.partial(tiny_matmul), 3, target="tpu_v5e")
    assert timing.machine(generation("tpu_v2")).delay_slots == 1


@pytest.mark.parametrize(
    ("donate", "error", "message"),
    [
        ("0", TypeError, "donate_argnums: expected a tuple of ints (indices of positional "
         "arguments), got '0'"),
        ((None,), TypeError, "donate_argnums: expected a tuple of ints (indices of "
         "positional arguments), got (None,)"),
        (5, ValueError, "donate_argnums: (5,) names an argument past the 2 positional "
         "argument(s) of arg_specs"),
    ],
)  # fmt: skip
def test_estimate_refuses_a_bad_donate_argnums_before_any_process_starts(donate, error, message):
    # issue 49's sweep: the job went to the dumping subprocess, whose jax.jit refused it
    # there (ProgramRefused after seconds), or tuple() of it failed unnamed
    with pytest.raises(error) as e:
        compiler.estimate(tiny_matmul, spec(), spec(), target="tpu_v5e", donate_argnums=donate)
    assert str(e.value) == message
