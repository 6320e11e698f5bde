"""Tests for emulate.pallas.checking.findings: the finding for one tpu.matmul site, decided
without a compiler by Target.compiles (the recorded probe, else the target's table)."""

from __future__ import annotations

import pytest

from emulate import mosaic, targets
from emulate.pallas.checking import findings
from emulate.pallas.checking.sites import MLIR_FORMATS, MatmulSite

MIXED = "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."
AUTO_CONVERSION = (
    "Automatic int->float or f4 -> f8 conversion for matmuls requires compatibility mode."
)


def _site(lhs: str, rhs: str, acc: str, shape: str = "128x128") -> MatmulSite:
    def vec(e: str) -> str:
        return f"vector<{shape}x{e}>"

    return MatmulSite(
        "k", vec(lhs), vec(rhs), vec(acc), MLIR_FORMATS.get(lhs), MLIR_FORMATS.get(rhs), "k.py:3"
    )


def test_recorded_sites_carry_the_probes_message_at_any_shape():
    site = _site("i8", "i8", "i32", "256x512")
    v4 = findings.diagnose(site, "tpu_v4")
    want = mosaic.verdict("tpu_v4", "int8", "int8", compat=True)
    assert want is not None and not want.ok
    assert v4 is not None
    assert (v4.kind, v4.basis, v4.operand, v4.message) == (
        "refused",
        "recorded",
        "RHS",
        want.message,
    )
    assert v4.note == ""
    assert findings.diagnose(site, "tpu_v5e") is None
    v7x = findings.diagnose(site, "v7x")
    assert v7x is not None
    assert (v7x.kind, v7x.basis, v7x.message) == ("compat-only", "recorded", AUTO_CONVERSION)
    assert v7x.note.startswith("compatibility mode converts int8 to bf16 (exact) and sums in f32")
    off = findings.diagnose(site, "v7x", compat=False)
    assert off is not None and (off.kind, off.message) == ("refused", AUTO_CONVERSION)
    assert off.note == findings.refused_note(targets.get("v7x"), site, False)
    assert off.note.startswith("compiles with compatibility mode on (the default), where ")


@pytest.mark.parametrize("target", ["tpu_v4i", "tpu_v7", "tpu_v8i"])
def test_unprobed_targets_answer_by_their_table(target):
    t = targets.get(target)
    for lhs, rhs in [("i8", "i8"), ("bf16", "bf16"), ("f8E4M3FN", "f8E4M3FN"), ("bf16", "i8")]:
        for compat in (True, False):
            site = _site(lhs, rhs, "f32")
            f = findings.diagnose(site, target, compat=compat)
            ok = t.compiles(site.lhs, site.rhs, acc="float32", compat=compat)
            assert (f is None) is ok, (lhs, rhs, compat)
            if f is None:
                continue
            assert (f.kind, f.basis) == ("refused", "table")
            if lhs != rhs and not compat:
                assert (f.operand, f.message) == ("", MIXED)
            else:
                vtype = site.rhs_type if f.operand == "RHS" else site.lhs_type
                assert f.message == (
                    f"E2001: CompileTimeMosaicUnsupported{f.operand.capitalize()}Type: "
                    f"Unsupported matmul {f.operand} type on target: {vtype}"
                )


def test_an_element_type_without_a_format_is_refused_by_the_table():
    site = _site("i32", "i32", "i32")
    f = findings.diagnose(site, "tpu_v5e")
    assert f is not None and (f.basis, f.operand) == ("table", "RHS")  # same type: the RHS
    assert f.fix.startswith("convert the operands to a pair the target runs")


def test_named_operand():
    assert findings.named_operand("Unsupported matmul RHS type on target: x") == "RHS"
    assert findings.named_operand("Bad lhs type") == "LHS"
    assert findings.named_operand("Bad lhs/rhs type: x") == ""
    assert findings.named_operand(MIXED) == ""


def test_fix_names_the_route():
    fix = findings.fix_text(targets.get("tpu_v4"), _site("i8", "i8", "i32"))
    assert fix.startswith("call emulate.pallas.dot(a, b, preferred_element_type=jnp.int32) here")
    assert "on tpu_v4 it decodes the operands in registers to bfloat16 x bfloat16" in fix
    assert findings.fix_text(targets.get("tpu_v4"), None).startswith("see the message; ")


def test_conversion_costs():
    int8 = _site("i8", "i8", "i32")
    assert findings.conversion_cost(int8, AUTO_CONVERSION).endswith(
        "(for full-range int8 x int8, K up to 1024)"
    )
    assert findings.conversion_cost(_site("bf16", "i8", "f32"), MIXED).startswith(
        "compatibility mode converts the integer operand to f32 (exact)"
    )
    assert findings.conversion_cost(_site("bf16", "f8E5M2", "f32"), MIXED).startswith(
        "compatibility mode lets a bfloat16 x float8_e5m2 matmul through"
    )


def test_str_reads_like_the_compiler():
    f = findings.diagnose(_site("i8", "i8", "i32"), "tpu_v4")
    assert f is not None
    assert str(f).splitlines()[:2] == [
        f"k.py:3: kernel 'k' on tpu_v4: Mosaic failed to compile TPU kernel: {f.message}",
        "  tpu.matmul vector<128x128xi8>, vector<128x128xi8> -> vector<128x128xi32>",
    ]
