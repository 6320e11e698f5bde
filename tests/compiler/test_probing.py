"""Tests for emulate.compiler.probing: the probe cases, compiling them with the real
compiler (libtpu, a declared test dependency), and a reprobe that fails on any difference
from the recorded data (emulate/data/mosaic_probe.json).

The reprobe is long (EMULATE_LONG_TESTS=1): a sample holding every distinct verdict of
every target and setting, and every case (about a minute on 2 cores); by default
tests/cli/test_cli_targets.py reprobes a sample of one target of each family through the
command line. The rest take seconds.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata

import jax
import pytest

from emulate import compiler, mosaic, targets

OFFERED = ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x")
MIXED = "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."
AUTO_CONVERT = (
    "Automatic int->float or f4 -> f8 conversion for matmuls requires compatibility mode."
)


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
        assert (lhs, rhs, mosaic.natural_accumulator(lhs, rhs)) in pairs
    for fmt in ("int8", "int4"):
        assert {(fmt, fmt, "int32"), (fmt, fmt, "float32")} <= pairs
    for fmt in ("float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert {(fmt, fmt, acc) for acc in ("float32", "int32", "bfloat16")} <= pairs
    for fmt in targets.OPERANDS:
        assert (fmt, fmt, mosaic.natural_accumulator(fmt, fmt)) in pairs
    assert len(pairs) == 76


@pytest.mark.parametrize(
    "target, lhs, rhs, acc, compat, message",
    [
        ("tpu_v5e", "int8", "int8", None, False, ""),
        ("v7x", "int8", "int8", None, False, AUTO_CONVERT),
        ("tpu_v7x", "s8", "s8", None, True, ""),
        ("tpu_v4", "bfloat16", "int8", "float32", False, MIXED),
    ],
)
def test_compiles_asks_the_real_compiler_what_target_compiles_reads(
    target, lhs, rhs, acc, compat, message
):
    v = compiler.compiles(target, lhs, rhs, acc=acc, compat=compat)
    assert (v.ok, v.message) == (message == "", message)
    assert targets.get(target).compiles(lhs, rhs, acc=acc, compat=compat) is v.ok


def test_compiles_names_bad_arguments():
    with pytest.raises(ValueError, match=r"^rhs: unknown format 'int7'"):
        compiler.compiles("tpu_v5e", "int8", "int7")
    with pytest.raises(ValueError, match=r"^target: libtpu .* offers no compile-only topology"):
        compiler.compiles("tpu_v8i", "int8", "int8")


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


def test_report_of_the_recorded_probe():
    data = mosaic.recorded()
    text, changed = compiler.report(data)
    assert changed == []
    lines = text.splitlines()
    assert lines[0] == (
        f"libtpu {data.libtpu}, jax {data.jax}: {len(data.rows)} cases in {data.seconds:.1f} s"
    )
    assert "  tpu_v7x  compat on: 40/76 compile; compat off: 4/76 compile" in lines
    assert lines[-1] == (
        f"differences from the recorded probe (libtpu {data.libtpu}), for the targets probed: 0"
    )


def test_differences_name_each_changed_case():
    data = mosaic.recorded()
    first = data.rows[0]
    changed = dataclasses.replace(
        data, rows=(mosaic.ProbeRow(first.case, mosaic.Verdict(True)),) + data.rows[1:-1]
    )
    c, last = first.case, data.rows[-1].case
    assert first.verdict.ok is False
    assert compiler.differences(changed, data) == [
        f"{c.target} {c.lhs} x {c.rhs} -> {c.acc} compat {'on' if c.compat else 'off'}: now "
        f"compiles; recorded refused ({first.verdict.stage}: {first.verdict.message})",
        f"{last.target} {last.lhs} x {last.rhs} -> {last.acc} compat "
        f"{'on' if last.compat else 'off'}: now not probed; recorded "
        + (
            "compiles"
            if data.rows[-1].verdict.ok
            else f"refused ({data.rows[-1].verdict.stage}: {data.rows[-1].verdict.message})"
        ),
    ]


# ---------------------------------------------------------------------------------------
# the reprobe


# The sample's targets: every offered target (the test is long). The suite's default
# reprobe is tests/cli/test_cli_targets.py's: the same sample of one target of each family
# through `emulate targets --probe`, in one probe (each starts two compiler subprocesses).
SAMPLED = OFFERED


def _reprobe_cases(data: mosaic.Probe, *, every: bool) -> list[mosaic.ProbeCase] | None:
    """Every case (None) when ``every`` or when the installed compiler is not the one the
    probe was recorded with; else, per (target, compat) stratum of the SAMPLED targets,
    the first case of each distinct recorded verdict (ok, stage, message): each kind of
    refusal and acceptance, about a fifth of the full reprobe's compiling."""
    installed = (compiler.libtpu_version(), jax.__version__, importlib.metadata.version("jaxlib"))
    if every or installed != (data.libtpu, data.jax, data.jaxlib):
        return None
    strata: dict[tuple[str, bool], list[mosaic.ProbeRow]] = {}
    for r in data.rows:
        if r.case.target not in SAMPLED:
            continue
        strata.setdefault((r.case.target, r.case.compat), []).append(r)
    picked = []
    for rows in strata.values():
        seen = set()
        for r in rows:
            kind = (r.verdict.ok, r.verdict.stage, r.verdict.message)
            if kind not in seen:
                picked.append(r.case)
            seen.add(kind)
    return picked


@pytest.mark.long  # by default: tests/cli/test_cli_targets.py (SAMPLED's comment)
@pytest.mark.parametrize("every", [False, True], ids=["sample", "every_case"])
def test_reprobe_matches_the_recorded_probe(every):
    """The probe cases, compiled again with the installed compiler, compat on and off,
    have the recorded verdict and message: every case when the compiler (libtpu, jax,
    jaxlib) is not the recorded one or in the long sweep (``every_case``,
    EMULATE_LONG_TESTS=1), else a sample that holds every distinct verdict of every target
    and setting."""
    data = mosaic.recorded()
    cases = _reprobe_cases(data, every=every)
    new = compiler.probe(cases=cases)
    if cases is not None:
        assert len(new.rows) == len(cases) < len(data.rows) // 4
        assert {r.case.target for r in new.rows} == set(SAMPLED)
        chosen = set(cases)
        data = dataclasses.replace(data, rows=tuple(r for r in data.rows if r.case in chosen))
    else:
        assert len(new.rows) == len(data.rows)
    changed = compiler.differences(new, data)
    assert not changed, (
        f"the compiler (libtpu {new.libtpu}, jax {new.jax}) differs from the recorded probe "
        f"(libtpu {data.libtpu}, jax {data.jax}) on {len(changed)} cases; re-record with "
        "python -m emulate targets --probe --out emulate/data/mosaic_probe.json and "
        "review:\n" + "\n".join(changed[:40])
    )
    assert new.libtpu == compiler.libtpu_version()


def test_probe_takes_targets_or_cases_not_both():
    case = compiler.probe_cases(["tpu_v4"])[0]
    with pytest.raises(ValueError, match=r"^targets: pass targets or cases, not both; got "):
        compiler.probe(["tpu_v4"], cases=[case])
