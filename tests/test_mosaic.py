"""Tests for emulate.mosaic: the recorded probe of the real TPU compiler, read without a
compiler, and the one rule that answers from it (mosaic.verdict, Target.compiles).

The oracle for the read-back tests is the JSON file itself, parsed here with ``json``
alone; tests/compiler/test_probing.py compiles the cases again with the real compiler.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

from emulate import mosaic, targets
from emulate.compiler import TOPOLOGIES, probe_cases

OFFERED = ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x")
UNPROBED = ("tpu_v4i", "tpu_v7", "tpu_v8i")
MIXED = "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."
AUTO_CONVERT = (
    "Automatic int->float or f4 -> f8 conversion for matmuls requires compatibility mode."
)


def _v(target: str, lhs: str, rhs: str, acc: str | None = None, compat: bool = True):
    v = mosaic.verdict(target, lhs, rhs, acc=acc, compat=compat)
    assert v is not None, (target, lhs, rhs, acc, compat)
    return v


def _file_rows() -> list[tuple[str, str, str, str, bool, bool, str]]:
    """(target, lhs, rhs, acc, compat, ok, message) per row of the shipped JSON file."""
    data = json.loads(mosaic.PROBE_PATH.read_text(encoding="utf-8"))
    messages = [m["message"] for m in data["messages"]]
    return [
        (t, lhs, rhs, acc, bool(compat), ref is None, "" if ref is None else messages[ref])
        for t, lhs, rhs, acc, compat, ref in data["rows"]
    ]


FILE_ROWS = _file_rows()


# ---------------------------------------------------------------------------------------
# the recorded probe


def test_recorded_probe_shape():
    data = mosaic.recorded()
    assert data.libtpu and data.jax and data.jaxlib
    assert data.shape == (128, 128)
    assert tuple(data.topologies) == OFFERED
    assert data.topologies == {t: TOPOLOGIES[t] for t in OFFERED}
    cases = [r.case for r in data.rows]
    assert cases == list(probe_cases(OFFERED))
    assert len(cases) == len(set(cases)) == 7 * 2 * 76 == len(FILE_ROWS)
    for r in data.rows:
        v = r.verdict
        assert v.ok == (v.stage == "") == (v.message == "")
        assert v.stage in ("", "lower", "compile", "crash")
    assert mosaic.Probe.from_json(data.to_json()) == data
    assert dict(data.verdicts()) == {r.case: r.verdict for r in data.rows}


# ---------------------------------------------------------------------------------------
# the one rule: every recorded verdict read back


@pytest.mark.parametrize("compat", [True, False])
def test_every_recorded_verdict_reads_back_through_verdict(compat):
    rows = [r for r in FILE_ROWS if r[4] == compat]
    assert len(rows) == 7 * 76
    for t, lhs, rhs, acc, _, ok, message in rows:
        v = mosaic.verdict(t, lhs, rhs, acc=acc, compat=compat)
        assert v is not None and (v.ok, v.message) == (ok, message), (t, lhs, rhs, acc)


@pytest.mark.parametrize("compat", [True, False])
def test_every_recorded_verdict_reads_back_through_target_compiles(compat):
    for t, lhs, rhs, acc, c, ok, _ in FILE_ROWS:
        if c == compat:
            assert targets.get(t).compiles(lhs, rhs, acc=acc, compat=compat) is ok, (t, lhs, rhs)


def test_native_pairs_are_the_compat_off_verdicts_at_the_natural_accumulator():
    for t in OFFERED:
        natural = {
            (lhs, rhs)
            for target, lhs, rhs, acc, compat, ok, _ in FILE_ROWS
            if target == t and not compat and ok and acc == mosaic.natural_accumulator(lhs, rhs)
        }
        assert mosaic.native_pairs(t) == natural
        on = {
            (lhs, rhs)
            for target, lhs, rhs, acc, compat, ok, _ in FILE_ROWS
            if target == t and compat and ok and acc == mosaic.natural_accumulator(lhs, rhs)
        }
        assert mosaic.compat_only_pairs(t) == on - natural
        assert targets.get(t).native_pairs == {
            p for p in natural if set(p) <= set(targets.OPERANDS)
        }


def test_verdict_defaults_and_spellings():
    # natural accumulator, compat off, formats as aliases and dtypes
    assert mosaic.verdict("tpu_v5e", "s8", jnp.int8) == _v(
        "tpu_v5e", "int8", "int8", "int32", False
    )
    assert mosaic.verdict("tpu_v5e", "bf16", "int8") == _v(
        "tpu_v5e", "bfloat16", "int8", compat=False
    )
    assert mosaic.ProbeCase.of("tpu_v4", "e4m3", "e4m3", compat=True) == mosaic.ProbeCase(
        "tpu_v4", "float8_e4m3fn", "float8_e4m3fn", "float32", True
    )


def test_verdict_is_none_without_a_record():
    for t in (*UNPROBED, "cpu", "gpu_sm90", "v5e"):  # aliases are Target.compiles' business
        assert mosaic.verdict(t, "int8", "int8") is None
    assert mosaic.verdict("tpu_v5e", "int8", "float6_e2m3fn") is None
    assert mosaic.verdict("tpu_v5e", "float6_e2m3fn", "float6_e2m3fn", acc="int32") is None


def test_verdict_names_the_bad_argument():
    with pytest.raises(ValueError) as e:
        mosaic.verdict("tpu_v5e", "int8", "int7")
    assert str(e.value).startswith("rhs: unknown format 'int7'; known formats: int4, ")
    with pytest.raises(ValueError, match=r"^lhs: unknown format 'x'; known formats: "):
        mosaic.verdict("tpu_v5e", "x", "int8")
    with pytest.raises(TypeError, match=r"^acc: expected a format name, a dtype or a Format"):
        mosaic.verdict("tpu_v5e", "int8", "int8", acc=3)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Target.compiles without a record: the table


@pytest.mark.parametrize("target", UNPROBED)
def test_unprobed_tpus_answer_from_their_table(target):
    t = targets.get(target)
    assert t.rules == "table"
    for lhs in targets.OPERANDS:
        for rhs in targets.OPERANDS:
            native = (lhs, rhs) in t.native_pairs
            assert t.compiles(lhs, rhs, compat=True) is native
            # without compatibility mode Mosaic refuses mixed element types
            assert t.compiles(lhs, rhs) is (native and lhs == rhs)


def test_unprobed_cases_of_probed_tpus_answer_from_the_table():
    v5e = targets.get("tpu_v5e")
    assert ("int8", "float6_e2m3fn") not in v5e.native_pairs
    assert not v5e.compiles("int8", "float6_e2m3fn", compat=True)
    assert targets.get("cpu").compiles("bfloat16", "float32")  # no Mosaic: the table
    assert not targets.get("cpu").compiles("int4", "int4")
    assert targets.get("v7x").compiles("int8", "int8", compat=True)  # aliases
    assert not targets.get("ironwood").compiles("int8", "int8")


# ---------------------------------------------------------------------------------------
# what the recorded compiler says (design.md, "The real TPU compiler")


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
    rows = [r for r in mosaic.recorded().rows if r.case.acc == "bfloat16"]
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
    data = mosaic.recorded()
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
    for r in mosaic.recorded().rows:
        if "uint" in r.case.lhs or "uint" in r.case.rhs:
            assert r.verdict.stage == "lower"
            assert r.verdict.message.startswith("Unsigned integer dtype uint")
