"""Tests for emulate.compiler.compiling: compiling with the real XLA:TPU and Mosaic
compilers (libtpu, a declared test dependency), in this process or a subprocess."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import emulate
import emulate.pallas
from emulate import compiler
from emulate.mosaic import ProgramFacts, Verdict
from tests.compiler._programs import matmul, spec

MIXED = "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."


def _probe_fn(acc: str) -> functools.partial[jax.Array]:
    return functools.partial(matmul, acc=acc)


def _for_v5e_only(x):
    """``x + 1`` traced for tpu_v5e; a ValueError naming the target traced for otherwise."""
    if emulate.current_target().name != "tpu_v5e":
        raise ValueError(f"traced for {emulate.current_target().name}")
    return x + 1


def _kernel_matmul(x, w):
    return emulate.pallas.matmul(x, w)


def test_compile_traces_for_its_target():
    """A program compiled for a target is traced for it (issue 49): emulate's kernel inside
    plans for tpu_v5e without an emulate.target block around the call, in this process
    (and, in test_check_with_the_other_compat_setting_runs_a_subprocess, in the
    subprocess of the other compat setting)."""
    compiled = compiler.compile(
        _kernel_matmul, spec("bfloat16", (8, 256)), spec("int8", (256, 128)), target="v5e"
    )
    assert 'custom_call_target="tpu_custom_call"' in compiled.as_text()
    job = compiler.Job(_for_v5e_only, (spec("float32"),), "tpu_v5e")
    assert compiler.check_many([job]) == [Verdict(True)]
    assert emulate.current_target().name == "cpu"  # restored


def test_compile_runs_the_real_compiler():
    """An XLA-level int8 dot compiles on v4 (XLA:TPU converts by itself); the result is a
    compiled program with the compiler's cost estimate."""

    def f(x, w):
        return jax.lax.dot(x, w, preferred_element_type=jnp.int32)

    compiled = compiler.compile(f, spec("int8"), spec("int8"), target="tpu_v4")
    assert isinstance(compiled, jax.stages.Compiled)
    assert compiled.cost_analysis()["flops"] > 0
    assert "dot" in compiled.as_text()


def test_compile_donates_a_kv_cache():
    """A donated cache (1 MiB of bf16) updated in place is the program's input-output
    alias: its bytes are the alias, and the program writes no copy of it."""
    cache = jax.ShapeDtypeStruct((4, 1024, 128), jnp.bfloat16)
    row = jax.ShapeDtypeStruct((4, 1, 128), jnp.bfloat16)

    def step(c, r):
        return jax.lax.dynamic_update_slice(c, r, (0, 5, 0))

    kept = compiler.compile(step, cache, row, target="tpu_v5e")
    for donated in (
        compiler.compile(step, cache, row, target="tpu_v5e", donate_argnums=0),
        compiler.compile(step, cache, row, target="tpu_v5e", donate_argnames="c"),
    ):
        assert donated.memory_analysis().alias_size_in_bytes == 4 * 1024 * 128 * 2
        assert "input_output_alias={ {}: (0, {}" in donated.as_text()
    assert kept.memory_analysis().alias_size_in_bytes == 0
    assert "input_output_alias" not in kept.as_text()


def test_compile_raises_the_compilers_error():
    with pytest.raises(Exception, match="Unsupported matmul RHS type on target"):
        compiler.compile(_probe_fn("int32"), spec("int8"), spec("int8"), target="tpu_v4")


def test_compile_rejects_leaves_without_shape():
    with pytest.raises(TypeError, match=r"^arg_specs: expected leaves with shape and dtype"):
        compiler.compile(_probe_fn("float32"), 3, spec("float32"), target="tpu_v4")


def test_check_in_process_gives_a_verdict():
    assert compiler.compat_mode() is True  # this process: libtpu's default
    ok = compiler.check(_probe_fn("float32"), spec("float32"), spec("float32"), target="v2")
    assert ok == Verdict(True)
    assert ok.verdict == "compiles"
    # the one-block kernel: its custom call, nothing else
    assert ok.program == ProgramFacts(tpu_custom_calls=1, xla_contractions=0, temp_bytes=0)
    refused = compiler.check(_probe_fn("int32"), spec("int8"), spec("int8"), target="v4")
    assert refused.verdict == "refused"
    assert refused.stage == "compile"
    assert refused.message == (
        "E2001: CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on target: "
        "vector<128x128xi8>"
    )
    assert "tpu.matmul" in refused.detail
    assert refused.program is None


def test_check_with_the_other_compat_setting_runs_a_subprocess():
    jobs = [
        compiler.Job(_probe_fn("float32"), (spec("bfloat16"), spec("int8")), "tpu_v5e"),
        compiler.Job(_probe_fn("float32"), (spec("float8_e4m3fn"),) * 2, "tpu_v5e"),
        compiler.Job(_for_v5e_only, (spec("float32"),), "tpu_v5e"),  # traced for its target
    ]
    mixed, fp8, traced = compiler.check_many(jobs, compat=False)
    assert (mixed.ok, mixed.stage, mixed.message) == (False, "compile", MIXED)
    assert fp8 == traced == Verdict(True)
    with pytest.raises(TypeError, match=r"^fn: compiling with compat=False runs in a subprocess"):
        compiler.check(lambda x: x, spec("float32"), target="tpu_v5e", compat=False)


def test_check_both_compiles_each_setting():
    job = compiler.Job(_probe_fn("float32"), (spec("bfloat16"), spec("int8")), "tpu_v5e")
    got = compiler.check_both({True: [job], False: [job]})
    assert got[True] == [Verdict(True)]
    assert [(v.ok, v.message) for v in got[False]] == [(False, MIXED)]


def test_check_many_names_a_target_without_a_device_before_compiling():
    job = compiler.Job(_probe_fn("float32"), (spec("float32"),) * 2, "tpu_v7")
    with pytest.raises(ValueError, match=r"^target: libtpu .* offers no compile-only topology"):
        compiler.check_many([job], compat=False)
