"""Tests for emulate.compiler: compile-only TPU devices per target, compiling with the
real XLA:TPU and Mosaic compilers (libtpu, a declared test dependency), the recorded probe
and what it says, and a reprobe that fails on any difference from the recorded data.

The reprobe compiles a third of the probe cases (every case where the installed compiler
is not the recorded one: about a minute on 2 cores); the rest take seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import sys
import types

import jax
import jax.numpy as jnp
import pytest

from emulate import compiler, targets

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
MIXED = "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."
AUTO_CONVERT = (
    "Automatic int->float or f4 -> f8 conversion for matmuls requires compatibility mode."
)


def _v(target: str, lhs: str, rhs: str, acc: str | None = None, compat: bool = True):
    return compiler.verdict(target, lhs, rhs, acc, compat=compat)


def _spec(fmt: str, shape: tuple[int, int] = (128, 128)) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(fmt))


def _probe_fn(acc: str) -> functools.partial[jax.Array]:
    return functools.partial(compiler._probe_matmul, acc=acc)


def _abort(x: jax.Array) -> jax.Array:
    """Kills the process that traces it: stands for a compiler that aborts."""
    os.abort()


# ---------------------------------------------------------------------------------------
# libtpu and the compile-only devices


def test_libtpu_is_installed_and_offers_seven_generations():
    assert compiler.libtpu_version() is not None
    assert compiler.available()
    assert compiler.generations() == OFFERED


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
    monkeypatch.setattr(compiler, "libtpu_version", lambda: None)
    expected = (
        "the real TPU compiler is unavailable: libtpu is not installed; install it with "
        "pip install 'jax[tpu]' (or emulate[tpu]). The recorded probe "
        "(emulate.compiler.recorded(), verdict()) needs no compiler."
    )
    with pytest.raises(compiler.CompilerUnavailable) as e:
        compiler._devices.__wrapped__()
    assert str(e.value) == expected
    assert isinstance(e.value, RuntimeError)

    def unavailable():
        raise compiler._unavailable("libtpu is not installed")

    monkeypatch.setattr(compiler, "_devices", unavailable)
    assert not compiler.available()
    with pytest.raises(compiler.CompilerUnavailable, match="^the real TPU compiler is"):
        compiler.device("tpu_v5e")
    with pytest.raises(compiler.CompilerUnavailable):
        compiler.generations()
    # the recorded data needs no compiler
    assert compiler.verdict("tpu_v5e", "int8", "int8").ok


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
    assert compiler._setting_from(init_args) is setting


def test_child_env_sets_the_flag_once():
    env = compiler._child_env(False)
    assert env["LIBTPU_INIT_ARGS"].split().count("--xla_mosaic_compat_mode=false") == 1
    assert "--xla_mosaic_compat_mode=true" not in env["LIBTPU_INIT_ARGS"]
    assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"


# ---------------------------------------------------------------------------------------
# compiling


def test_compile_runs_the_real_compiler():
    """An XLA-level int8 dot compiles on v4 (XLA:TPU converts by itself); the result is a
    compiled program with the compiler's cost estimate."""

    def f(x, w):
        return jax.lax.dot(x, w, preferred_element_type=jnp.int32)

    compiled = compiler.compile(f, _spec("int8"), _spec("int8"), target="tpu_v4")
    assert isinstance(compiled, jax.stages.Compiled)
    assert compiled.cost_analysis()["flops"] > 0
    assert "dot" in compiled.as_text()


def test_compile_raises_the_compilers_error():
    with pytest.raises(Exception, match="Unsupported matmul RHS type on target"):
        compiler.compile(_probe_fn("int32"), _spec("int8"), _spec("int8"), target="tpu_v4")


def test_compile_rejects_leaves_without_shape():
    with pytest.raises(TypeError, match=r"^arg_specs: expected leaves with shape and dtype"):
        compiler.compile(_probe_fn("float32"), 3, _spec("float32"), target="tpu_v4")


def test_check_in_process_gives_a_verdict():
    assert compiler.compat_mode() is True  # this process: libtpu's default
    ok = compiler.check(_probe_fn("float32"), _spec("float32"), _spec("float32"), target="v2")
    assert ok == compiler.Verdict(True)
    assert ok.verdict == "compiles"
    refused = compiler.check(_probe_fn("int32"), _spec("int8"), _spec("int8"), target="v4")
    assert refused.verdict == "refused"
    assert refused.stage == "compile"
    assert refused.message == (
        "E2001: CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on target: "
        "vector<128x128xi8>"
    )
    assert "tpu.matmul" in refused.detail
    unsigned = compiler.check(_probe_fn("int32"), _spec("uint8"), _spec("uint8"), target="v5e")
    assert unsigned.stage == "lower"
    assert unsigned.message.startswith("Unsigned integer dtype uint8 is not supported")


def test_check_with_the_other_compat_setting_runs_a_subprocess_and_survives_a_crash():
    jobs = [
        compiler.Job(_probe_fn("float32"), (_spec("bfloat16"), _spec("int8")), "tpu_v5e"),
        compiler.Job(_abort, (_spec("float32"),), "tpu_v5e"),
        compiler.Job(_probe_fn("float32"), (_spec("float8_e4m3fn"),) * 2, "tpu_v5e"),
    ]
    mixed, crashed, fp8 = compiler.check_many(jobs, compat=False)
    assert (mixed.ok, mixed.stage, mixed.message) == (False, "compile", MIXED)
    assert not crashed.ok and crashed.stage == "crash"
    assert crashed.message.startswith("the compiler process died (signal 6)")
    assert fp8 == compiler.Verdict(True)


def test_check_in_a_subprocess_needs_fn_by_reference():
    with pytest.raises(TypeError, match=r"^fn: compiling with compat=False runs in a subprocess"):
        compiler.check(lambda x: x, _spec("float32"), target="tpu_v5e", compat=False)


def test_check_in_a_subprocess_reports_a_fn_it_cannot_import(monkeypatch):
    module = types.ModuleType("emulate_test_only_here")
    exec("def f(x):\n    return x\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(TypeError) as e:
        compiler.check(module.f, _spec("float32"), target="tpu_v5e", compat=False)
    assert str(e.value) == (
        "fn: the compiler subprocess could not unpickle the jobs (ModuleNotFoundError: "
        "No module named 'emulate_test_only_here')"
    )


# ---------------------------------------------------------------------------------------
# the recorded probe


def test_recorded_probe_shape():
    data = compiler.recorded()
    assert data.libtpu and data.jax and data.jaxlib
    assert data.shape == (128, 128)
    assert tuple(data.topologies) == OFFERED
    assert data.topologies == {t: compiler.TOPOLOGIES[t] for t in OFFERED}
    cases = [r.case for r in data.rows]
    assert cases == list(compiler.probe_cases(OFFERED))
    assert len(cases) == len(set(cases)) == 7 * 2 * 76
    for r in data.rows:
        v = r.verdict
        assert v.ok == (v.stage == "") == (v.message == "")
        assert v.stage in ("", "lower", "compile", "crash")
    assert compiler.Probe.from_json(data.to_json()) == data


def test_probe_covers_the_pairs_the_issue_names():
    pairs = {(c.lhs, c.rhs, c.acc) for c in compiler.probe_cases(["tpu_v5e"])}
    for lhs, rhs in [
        ("bfloat16", "int8"),
        ("bfloat16", "float8_e4m3fn"),
        ("bfloat16", "float8_e5m2"),
        ("bfloat16", "float32"),
        ("float32", "int8"),
        ("float4_e2m1fn", "float4_e2m1fn"),
        ("uint8", "uint8"),
    ]:
        assert (lhs, rhs, compiler.natural_accumulator(lhs, rhs)) in pairs
    for fmt in ("int8", "int4"):
        assert {(fmt, fmt, "int32"), (fmt, fmt, "float32")} <= pairs
    for fmt in ("float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert {(fmt, fmt, acc) for acc in ("float32", "int32", "bfloat16")} <= pairs
    for fmt in targets.OPERANDS:
        assert (fmt, fmt, compiler.natural_accumulator(fmt, fmt)) in pairs


def test_e4m3fn_compiles_on_v5_and_v6e_even_with_compat_off():
    for t in ("tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x"):
        for compat in (True, False):
            assert _v(t, "float8_e4m3fn", "float8_e4m3fn", compat=compat).ok
    v4 = _v("tpu_v4", "e4m3fn", "e4m3fn")
    assert v4.message == (
        "E2001: CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on target: "
        "vector<128x128xf8E4M3FN>"
    )


def test_int_operands_with_a_float_accumulator_are_refused_before_7x():
    for t in OFFERED[:-1]:
        for compat in (True, False):
            v = _v(t, "int8", "int8", "float32", compat=compat)
            assert (v.ok, v.message) == (False, "float acc with int lhs. Expected float lhs.")
    assert _v("tpu_v7x", "int8", "int8", "float32").ok  # compat mode converts
    assert _v("tpu_v7x", "int8", "int8", "float32", compat=False).message == AUTO_CONVERT


def test_float8_with_an_int32_accumulator_is_refused_on_v5_and_v6e():
    for t in ("tpu_v5e", "tpu_v5p", "tpu_v6e"):
        v = _v(t, "float8_e4m3fn", "float8_e4m3fn", "int32")
        assert v.message == "int acc with float lhs. Expected int lhs."


def test_a_bf16_accumulator_is_refused_everywhere_by_pallas():
    rows = [r for r in compiler.recorded().rows if r.case.acc == "bfloat16"]
    assert len(rows) == 7 * 2 * 6
    for r in rows:
        assert r.verdict.stage == "lower"
        assert r.verdict.message.endswith("'tpu.matmul' op Expected matmul acc to be 32-bit")


def test_bf16_x_int8_needs_compat_mode_everywhere():
    for t in OFFERED:
        assert not _v(t, "bfloat16", "int8", compat=False).ok
    for t in OFFERED[:-1]:
        assert _v(t, "bfloat16", "int8", compat=False).message == MIXED
    # on 7x the int -> float conversion is named, not the mixed types
    assert _v("tpu_v7x", "bfloat16", "int8", compat=False).message == AUTO_CONVERT
    for t in OFFERED[2:]:
        assert _v(t, "bfloat16", "int8").ok
    # v2, v3: compat mode converts int8 to bf16, which their matrix unit lacks
    for t in ("tpu_v2", "tpu_v3"):
        assert _v(t, "bfloat16", "int8").message.startswith("LLO_CHECK failure")


def test_v2_and_v3_run_only_f32_x_f32():
    data = compiler.recorded()
    for t in ("tpu_v2", "tpu_v3"):
        for compat, expected in [
            (False, {("float32", "float32", "float32")}),
            # compat mode converts an int8 rhs to f32
            (True, {("float32", "float32", "float32"), ("float32", "int8", "float32")}),
        ]:
            ok = {
                (r.case.lhs, r.case.rhs, r.case.acc)
                for r in data.rows
                if r.case.target == t and r.case.compat == compat and r.verdict.ok
            }
            assert ok == expected
        assert _v(t, "bf16", "bf16").message == (
            "E2001: CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on "
            "target: vector<128x128xbf16>"
        )


def test_7x_integer_and_fp4_kernels_compile_only_through_compat_mode():
    for lhs, rhs in [("int8", "int8"), ("int4", "int4"), ("e2m1", "e2m1")]:
        assert _v("tpu_v7x", lhs, rhs).ok
        assert _v("tpu_v7x", lhs, rhs, compat=False).message == AUTO_CONVERT
    for t in OFFERED[:-1]:
        assert _v(t, "e2m1", "e2m1").message.startswith("Bad lhs/rhs type: ")


def test_unsigned_operands_are_refused_by_pallas():
    for r in compiler.recorded().rows:
        if "uint" in r.case.lhs or "uint" in r.case.rhs:
            assert r.verdict.stage == "lower"
            assert r.verdict.message.startswith("Unsigned integer dtype uint")


def test_verdict_lookup_and_its_errors():
    assert _v("v5e", "s8", "s8") == _v("tpu_v5e", jnp.int8, jnp.dtype("int8"), "int32")
    with pytest.raises(ValueError) as e:
        _v("tpu_v4i", "int8", "int8")
    assert str(e.value) == (
        f"target: the probe (libtpu {compiler.recorded().libtpu}) has no verdicts for "
        "'tpu_v4i'; probed: tpu_v2, tpu_v3, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7x"
    )
    with pytest.raises(ValueError) as e:
        _v("tpu_v5e", "int8", "float6_e2m3fn")
    assert str(e.value) == (
        "lhs, rhs, acc: int8 x float6_e2m3fn -> float32 is not a probed case; "
        "see emulate.compiler.probe_cases()"
    )
    with pytest.raises(ValueError, match="^rhs: "):
        _v("tpu_v5e", "int8", "int7")


def test_disagreements_with_jax_table():
    off = {(d.target, d.lhs, d.rhs): d for d in compiler.disagreements(compat=False)}
    # JAX says e4m3fn is not native on v5e/v5p/v6e; the compiler runs it without converting
    for t in ("tpu_v5e", "tpu_v5p", "tpu_v6e"):
        assert not off[t, "float8_e4m3fn", "float8_e4m3fn"].jax_native
    # JAX says bf16 x e5m2 is native on 7x; without compat mode the compiler refuses it
    d = off["tpu_v7x", "bfloat16", "float8_e5m2"]
    assert d.jax_native and d.verdict.message == MIXED
    assert ("tpu_v5e", "int8", "int8") not in off
    on = {(d.target, d.lhs, d.rhs) for d in compiler.disagreements(compat=True)}
    assert ("tpu_v7x", "int8", "int8") in on  # compat mode converts; JAX says not native


def test_cli_summary_and_errors(capsys):
    assert compiler._main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"libtpu {compiler.recorded().libtpu}, jax ")
    assert "tpu_v7x  compat on: 40/76 compile; compat off: 4/76 compile" in out
    assert compiler._main(["--probe", "--targets", "tpu_v7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: target: libtpu ")


# ---------------------------------------------------------------------------------------
# the reprobe


def _reprobe_cases(data: compiler.Probe) -> list[compiler.ProbeCase] | None:
    """Every case (None) when the installed compiler is not the one the probe was recorded
    with; else, per (target, compat) stratum, the first case of each distinct recorded
    verdict and every 8th case: each kind of refusal and acceptance, at a third of the
    full reprobe's minute of compiling."""
    installed = (compiler.libtpu_version(), jax.__version__, importlib.metadata.version("jaxlib"))
    if installed != (data.libtpu, data.jax, data.jaxlib):
        return None
    strata: dict[tuple[str, bool], list[compiler.ProbeRow]] = {}
    for r in data.rows:
        strata.setdefault((r.case.target, r.case.compat), []).append(r)
    picked = []
    for rows in strata.values():
        seen = set()
        for i, r in enumerate(rows):
            kind = (r.verdict.ok, r.verdict.stage, r.verdict.message)
            if kind not in seen or i % 8 == 0:
                picked.append(r.case)
            seen.add(kind)
    return picked


def test_reprobe_matches_the_recorded_probe():
    """The probe cases, compiled again with the installed compiler, compat on and off,
    have the recorded verdict and message: every case when the compiler (libtpu, jax,
    jaxlib) is not the recorded one, else a sample that holds every distinct verdict of
    every target and setting."""
    data = compiler.recorded()
    cases = _reprobe_cases(data)
    new = compiler.probe(cases=cases)
    if cases is not None:
        assert len(new.rows) == len(cases) < len(data.rows) // 2
        assert {r.case.target for r in new.rows} == set(OFFERED)
        chosen = set(cases)
        data = dataclasses.replace(data, rows=tuple(r for r in data.rows if r.case in chosen))
    changed = compiler.differences(new, data)
    assert not changed, (
        f"the compiler (libtpu {new.libtpu}, jax {new.jax}) differs from the recorded probe "
        f"(libtpu {data.libtpu}, jax {data.jax}) on {len(changed)} cases; re-record with "
        "python -m emulate.compiler --probe --out emulate/data/mosaic_probe.json and "
        "review:\n" + "\n".join(changed[:40])
    )
    assert new.libtpu == compiler.libtpu_version()


def test_probe_takes_targets_or_cases_not_both():
    case = compiler.probe_cases(["tpu_v4"])[0]
    with pytest.raises(ValueError, match=r"^targets: pass targets or cases, not both; got "):
        compiler.probe(["tpu_v4"], cases=[case])
