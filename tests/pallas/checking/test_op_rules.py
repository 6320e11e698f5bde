"""emulate.pallas.checking.op_rules and what check does with it: an operation other than tpu.matmul
that needs Mosaic's compatibility mode is a finding at its own source line, with a fix for
that operation (issue 28); pl.kernel kernels, a bf16 accumulator, interpret mode and the
site a compiler error concerns (issues 25 and 28). Verdicts come from the real compiler
(libtpu, a test dependency); the compilations are shared in module-scoped fixtures. The
CLI's compat-off run of the quantizer is long (EMULATE_LONG_TESTS=1; the comment above it
names the default tests that cover what it checks)."""

from __future__ import annotations

import contextlib
import io
import pathlib
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest

import emulate.pallas
from emulate import cli, compiler, mosaic
from emulate.pallas.checking import findings, mosaic_check, op_rules
from emulate.pallas.checking.sites import KernelOp, KernelScan, MatmulSite

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import _pallas_kernels as kernels  # noqa: E402

assert compiler.available(), "the real TPU compiler (libtpu) is needed: pip install -e .[test]"

KERNELS = pathlib.Path(kernels.__file__)
S = jax.ShapeDtypeStruct
BF16 = S((256, 256), jnp.bfloat16)
I8 = S((256, 256), jnp.int8)
I8_128 = S((128, 128), jnp.int8)
FPTOSI = (
    "On this target float-to-integer conversions can only happen on 32-bit values. Enable "
    "compatibility mode or upcast to float32, cast to int32 and truncate to desired bitwidth."
)
V4_INT8 = (
    "E2001: CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on target: "
    "vector<128x128xi8>"
)
CAST_FIX = (
    "convert through 32-bit types: x.astype(jnp.float32).astype(jnp.int32).astype(jnp.int8) "
    "instead of x.astype(jnp.int8) on bfloat16 values"
)
CAST_COST = (
    "compatibility mode performs fptosi in 32-bit types, widening the operands and "
    "narrowing the result (extra vector work)"
)


def _at(marker: str) -> str:
    lines = KERNELS.read_text().splitlines()
    (found,) = [i + 1 for i, line in enumerate(lines) if f"# site: {marker}" in line]
    return f"{KERNELS}:{found}"


@pytest.fixture(scope="module")
def quantizer():
    """check's findings for the in-kernel quantizer (and, keyed by "transpose", for a
    kernel that transposes an int8 tile), and the compiler's own verdicts."""
    jobs = [(kernels.quantize_int8, (BF16, I8), t) for t in ("tpu_v4", "tpu_v5e")]
    jobs.append((kernels.transposed_int8, (I8, I8), "tpu_v5e"))
    keys = ["tpu_v4", "tpu_v5e", "transpose"]
    on = mosaic_check.check_many(jobs, compat=True)
    off = mosaic_check.check_many(jobs, compat=False)
    cjobs = [compiler.Job(fn, args, t) for fn, args, t in jobs]
    verdicts = compiler.check_both({True: cjobs, False: cjobs})
    return {
        (key, c): (found[i], verdicts[c][i])
        for c, found in ((True, on), (False, off))
        for i, key in enumerate(keys)
    }


def test_an_in_kernel_quantizer_is_compat_only_at_its_cast_on_v5e(quantizer):
    (f,), verdict = quantizer[("tpu_v5e", True)]
    assert verdict.ok  # the compiler compiles it, with compatibility mode on
    assert (f.kind, f.basis, f.message, f.location) == (
        "compat-only",
        "compiler",
        FPTOSI,
        _at("quantize-cast"),
    )
    assert isinstance(f.site, KernelOp)
    assert (f.site.name, f.site.operand_types, f.site.result_types) == (
        "arith.fptosi",
        ("vector<256x256xbf16>",),
        ("vector<256x256xi8>",),
    )
    assert (f.fix, f.note) == (CAST_FIX, CAST_COST)
    assert str(f).splitlines() == [
        f"{_at('quantize-cast')}: kernel '_quantize_int8_kernel' on tpu_v5e: compiles only "
        f"in Mosaic's compatibility mode (with it off: {FPTOSI})",
        "  arith.fptosi vector<256x256xbf16> -> vector<256x256xi8>",
        f"  fix: {CAST_FIX}",
        f"  note: {CAST_COST}",
    ]


def test_with_compat_off_the_refusal_is_at_the_cast_not_the_matmul(quantizer):
    for target in ("tpu_v4", "tpu_v5e"):
        (f,), verdict = quantizer[(target, False)]
        assert (verdict.ok, verdict.message) == (False, FPTOSI)
        assert (f.kind, f.message, f.location, f.fix) == (
            "refused",
            FPTOSI,
            _at("quantize-cast"),
            CAST_FIX,
        )
        assert f.note == "compiles with compatibility mode on (the default), where " + CAST_COST


TRANSPOSE = (
    "Unsupported transpose with element type bitwidth smaller than supported minimum. "
    "Enable compatibility mode to allow this.8 vs 16"
)


def test_a_narrow_transpose_is_compat_only_at_its_line(quantizer):
    # issue 49: an int8 tile transposed in the kernel compiles only with compatibility mode
    # on (v4 to v6e; 4-bit ones on v7x); check said nothing
    (f,), verdict = quantizer[("transpose", True)]
    assert verdict.ok
    assert (f.kind, f.basis, f.message, f.location) == (
        "compat-only",
        "compiler",
        TRANSPOSE,
        _at("transpose"),
    )
    assert isinstance(f.site, KernelOp)
    assert (f.site.name, f.site.operand_types) == ("tpu.transpose", ("vector<256x256xi8>",))
    assert f.fix.startswith("contract the operand as stored instead (emulate.pallas.dot(a, b, ")
    assert f.note == op_rules.op_cost(f.site)
    (f,), verdict = quantizer[("transpose", False)]
    assert (verdict.ok, verdict.message, f.kind, f.message) == (
        False,
        TRANSPOSE,
        "refused",
        TRANSPOSE,
    )
    assert f.location == _at("transpose")


def test_on_v4_the_matmul_is_refused_and_the_cast_is_compat_only(quantizer):
    (refused, cast), verdict = quantizer[("tpu_v4", True)]
    assert (verdict.ok, verdict.message) == (False, V4_INT8)
    assert (refused.kind, refused.message, refused.location) == (
        "refused",
        V4_INT8,
        _at("quantize-dot"),
    )
    assert isinstance(refused.site, MatmulSite)
    assert (cast.kind, cast.message, cast.location) == ("compat-only", FPTOSI, _at("quantize-cast"))


def _op(name: str, src: str, dst: str, loc: str = "k.py:1") -> KernelOp:
    return KernelOp("k", name, (f"vector<8x128x{src}>",), (f"vector<8x128x{dst}>",), loc)


def test_narrow_ops_keeps_narrow_conversions_and_comparisons_once():
    ops = [
        _op("arith.fptosi", "bf16", "i8"),
        _op("arith.fptosi", "bf16", "i8", "k.py:2"),  # the same types: asked once
        _op("arith.fptosi", "f32", "i32"),  # 32-bit: never compat
        _op("arith.sitofp", "i8", "bf16"),
        _op("arith.cmpf", "bf16", "i1"),
        _op("arith.cmpf", "f32", "i1"),
        _op("arith.addf", "bf16", "bf16"),  # not a checked op
        KernelOp("k", "arith.fptosi", ("bf16",), ("i8",), "k.py:3"),  # a scalar
    ]
    assert op_rules.narrow_ops(ops) == [ops[0], ops[3], ops[4]]


ELEMENTWISE_V5E = (
    "Compatibility mode disabled. Unsupported element type in elementwise op on hardware "
    "generation: 5."
)
SITOFP = (
    "On this target integer-to-float conversions can only happen on 32-bit values. Enable "
    "compatibility mode or upcast to int32, cast to float32 and truncate to desired bitwidth."
)


def test_the_compiler_decides_each_narrow_op_per_generation():
    # libtpu 0.0.42.1: v5e has neither bf16 comparisons nor int8 <-> bf16 conversions
    # without compatibility mode; v6e has both, but not int8 -> f32.
    ops = [
        _op("arith.cmpf", "bf16", "i1"),
        _op("arith.sitofp", "i8", "bf16"),
        _op("arith.sitofp", "i8", "f32"),
        _op("arith.extf", "bf16", "f32"),
    ]
    v5e = op_rules.compat_only_ops(ops, emulate.targets.get("tpu_v5e"))
    assert [op for op, _ in v5e] == ops[:3]
    assert v5e[0][1].startswith(ELEMENTWISE_V5E)
    assert [m for _, m in v5e[1:]] == [SITOFP, SITOFP]
    v6e = op_rules.compat_only_ops(ops, emulate.targets.get("tpu_v6e"))
    assert v6e == [(ops[2], SITOFP)]


def test_op_fixes_name_the_32_bit_route():
    assert op_rules.op_fix(_op("arith.fptosi", "f32", "i8")) == (
        "convert through 32-bit types: x.astype(jnp.int32).astype(jnp.int8) instead of "
        "x.astype(jnp.int8) on float32 values"
    )
    assert op_rules.op_fix(_op("arith.sitofp", "i8", "bf16")) == (
        "convert through 32-bit types: x.astype(jnp.int32).astype(jnp.float32)"
        ".astype(jnp.bfloat16) instead of x.astype(jnp.bfloat16) on int8 values"
    )
    assert op_rules.op_fix(_op("arith.cmpf", "bf16", "i1")) == (
        "compare in 32 bits: convert the bfloat16 operands to jnp.float32 first"
    )
    assert op_rules.op_fix(_op("arith.truncf", "f32", "bf16")) == (
        "do this float32 -> bfloat16 conversion through 32-bit types (float32 or int32), "
        "converting to bfloat16 last"
    )


def test_pl_kernel_on_a_tensorcore_mesh_gets_the_compilers_verdict():
    targets = ("tpu_v4", "tpu_v5e", "tpu_v7x")
    jobs = [(kernels.mesh_int8, (I8_128, I8_128), t) for t in targets]
    results = mosaic_check.check_many(jobs)
    verdicts = compiler.check_many([compiler.Job(f, a, t) for f, a, t in jobs])
    assert [v.ok for v in verdicts] == [False, True, True]
    v4, v5e, v7x = results
    assert [(f.kind, f.message, f.location) for f in v4] == [
        ("refused", verdicts[0].message, _at("mesh"))
    ]
    assert verdicts[0].message == V4_INT8
    assert v5e == []
    want = mosaic.verdict("tpu_v7x", "int8", "int8", acc="int32", compat=False)
    assert want is not None
    assert [(f.kind, f.message, f.location) for f in v7x] == [
        ("compat-only", want.message, _at("mesh"))
    ]


def test_a_bf16_accumulator_is_fixed_by_preferred_element_type():
    b = S((128, 128), jnp.bfloat16)
    (f,) = emulate.pallas.check(kernels.bf16_sum, b, b, target="tpu_v5e")
    assert f.kind == "refused" and f.site is None
    assert f.message.endswith("Error details: 'tpu.matmul' op Expected matmul acc to be 32-bit")
    assert f.location == _at("bf16-sum")
    assert f.fix == (
        "pass preferred_element_type=jnp.float32 to this dot (jnp.int32 for integer operands) "
        "and cast the result afterwards: Mosaic's matmul accumulates in 32 bits, and this one "
        "asks for bfloat16"
    )
    assert "<unknown location>" not in str(f)


INTERPRETED = (
    "no tpu.matmul to check: the pallas_call of _mixed_kernel at {}:{} runs in interpret mode "
    "(interpret=...), which turns the kernel into plain XLA operations that Mosaic never "
    "sees; check the kernel with interpret=False"
)


def _kernel_def(name: str) -> int:
    lines = KERNELS.read_text().splitlines()
    (found,) = [i + 1 for i, line in enumerate(lines) if line.startswith(f"def {name}(")]
    return found


def test_zero_sites_warn_and_say_why():
    a, b = S((128, 128), jnp.bfloat16), S((128, 128), jnp.float8_e4m3fn)
    want = "tpu_v4: " + INTERPRETED.format(KERNELS, _kernel_def("_mixed_kernel"))
    with pytest.warns(mosaic_check.NoMatmulWarning) as caught:
        assert emulate.pallas.check(kernels.interpreted_mixed, a, b, target="tpu_v4") == []
    assert [str(w.message) for w in caught] == [want]
    with pytest.warns(mosaic_check.NoMatmulWarning) as caught:
        assert emulate.pallas.check(lambda x: x @ x, BF16, target="tpu_v4") == []
    assert [str(w.message) for w in caught] == [
        "tpu_v4: no tpu.matmul to check: fn calls no pallas_call (XLA-level dots compile on "
        "every TPU; XLA converts their operands itself)"
    ]


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_cli_warns_on_zero_sites():
    argv = ["check-kernel", f"{KERNELS}:interpreted_mixed", "--target", "v4"]
    code, out, _ = _cli([*argv, "--shapes", "128x128:bf16,128x128:e4m3"])
    assert code == 0
    assert out.splitlines() == [
        "tpu_v4: 0 tpu.matmul, ok (compiler, compat on)",
        "  warning: " + INTERPRETED.format(KERNELS, _kernel_def("_mixed_kernel")),
    ]


# long (EMULATE_LONG_TESTS=1; its fresh compat-off process takes some 10 s): by default the
# CLI's compat-off run is test_mosaic_check.py's test_cli_no_compat_refuses_int8_on_v7x,
# this refusal at the cast with compatibility mode off
# test_with_compat_off_the_refusal_is_at_the_cast_not_the_matmul, the lines an op finding
# prints test_an_in_kernel_quantizer_is_compat_only_at_its_cast_on_v5e and the float32
# cast's fix test_op_fixes_name_the_32_bit_route
@pytest.mark.long
def test_cli_no_compat_asks_the_compiler_for_an_in_kernel_quantizer():
    # The file is loaded beside the tests' own import of it, so its functions do not
    # pickle for the API's compat-off subprocess (the recorded rules answered "ok" there,
    # blind to the cast): the CLI runs again in a process with compat off, which loads the
    # file itself, and the compiler refuses the f32 -> int8 cast at its line.
    argv = ["check-kernel", f"{KERNELS}:quantize_int8", "--target", "v5e", "--no-compat"]
    code, out, _ = _cli([*argv, "--shapes", "256x256:float32,256x256:int8"])
    assert code == 1
    assert out.splitlines() == [
        "tpu_v5e: 1 tpu.matmul, 1 finding (compiler, compat off)",
        f"{_at('quantize-cast')}: kernel '_quantize_int8_kernel' on tpu_v5e: Mosaic failed "
        f"to compile TPU kernel: {FPTOSI}",
        "  arith.fptosi vector<256x256xf32> -> vector<256x256xi8>",
        "  fix: convert through 32-bit types: x.astype(jnp.int32).astype(jnp.int8) instead "
        "of x.astype(jnp.int8) on float32 values",
        "  note: compiles with compatibility mode on (the default), where compatibility mode "
        "performs fptosi in 32-bit types, widening the operands and narrowing the result "
        "(extra vector work)",
    ]


def test_cli_says_what_the_recorded_rules_cannot_see(monkeypatch):
    # Without libtpu the recorded rules decide: they see tpu.matmul types only, and the
    # line after the verdict says which operations go unchecked.
    monkeypatch.setattr(compiler, "libtpu_version", lambda: None)
    argv = ["check-kernel", f"{KERNELS}:quantize_int8", "--target", "v5e", "--no-compat"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mosaic_check.RecordedRulesWarning)
        code, out, _ = _cli([*argv, "--shapes", "256x256:float32,256x256:int8"])
    assert (code, out.splitlines()) == (
        0,
        [
            "tpu_v5e: 1 tpu.matmul, ok (recorded rules, compat off)",
            "  note: decided without the compiler, by rules that see each tpu.matmul's operand "
            "and accumulator types only: conversions, comparisons and transposes on types "
            "narrower than 32 bits (arith.fptosi, arith.sitofp, arith.truncf, arith.extf, "
            "arith.extsi, arith.trunci, arith.cmpf, arith.cmpi, tpu.transpose; an in-kernel "
            "activation quantizer's f32 -> "
            "int8 astype is an arith.fptosi) are not checked; install libtpu (pip install "
            "'jax[tpu]') for the compiler's verdict",
        ],
    )


def test_cli_shapes_cannot_give_keyword_only_arguments():
    ref = f"{KERNELS.parent / 'kernels' / 'jax_matmul.py'}:matmul"
    code, out, err = _cli(
        ["check-kernel", ref, "--target", "v5e", "--shapes", "256x256:int8,256x256:int8"]
    )
    assert (code, out) == (2, "")
    assert err == (
        f"emulate check-kernel: error: --shapes: {ref!r} has required keyword-only "
        "argument(s) (block_shape), which --shapes cannot give; check a module-level "
        "function of the arrays alone that passes them, e.g. def f(x, y): return fn(x, y, "
        "block_shape=...)\n"
    )


# ------------------------------------------------- which site a compiler error concerns

_MATMUL_DETAIL = (
    "MosaicError: INTERNAL: Mosaic failed to compile TPU kernel: Unsupported\n"
    "The MLIR operation involved:\n"
    '  %9 = "tpu.matmul"(%1, %2, %3) <{dimension_numbers = #tpu.dot_dimension_numbers<[1], '
    "[0], [0], [1], [0, 0, 1, 1], [], []>}> : (vector<128x128xbf16>, vector<128x128xf8E4M3FN>, "
    "vector<128x128xf32>) -> vector<128x128xf32>\n"
)


def _mm(shape: str, loc: str, rhs: str = "f8E4M3FN") -> MatmulSite:
    v = f"vector<{shape}x"
    return MatmulSite("k", v + "bf16>", v + rhs + ">", v + "f32>", "bfloat16", "float8_e4m3fn", loc)


def test_sixteen_same_typed_matmuls_on_one_line_are_placed_there():
    verdict = mosaic.Verdict(False, "compile", "Unsupported", _MATMUL_DETAIL)
    sites = [_mm(f"{8 * (i + 1)}x256", "gmm.py:40") for i in range(16)]
    site, note = mosaic_check.site_of(verdict, KernelScan(("k",), tuple(sites), ()))
    assert (site, note) == (sites[0], "")


def test_same_typed_matmuls_on_several_lines_are_ambiguous():
    verdict = mosaic.Verdict(False, "compile", "Unsupported", _MATMUL_DETAIL)
    sites = [_mm("256x256", "gmm.py:40"), _mm("64x256", "gmm.py:52"), _mm("8x8", "x.py:1", "bf16")]
    site, note = mosaic_check.site_of(verdict, KernelScan(("k",), tuple(sites), ()))
    assert site is None
    assert note == (
        "the error concerns one of 2 tpu.matmul with these element types, at gmm.py:40, gmm.py:52"
    )
    (f,) = mosaic_check.compiler_findings(
        emulate.targets.get("tpu_v4"), verdict, KernelScan(("k",), tuple(sites), ()), False, None
    )
    assert (f.site, f.note) == (None, note)


def test_an_error_at_another_op_is_placed_at_that_op():
    detail = (
        f"MosaicError: INTERNAL: Mosaic failed to compile TPU kernel: {FPTOSI}\n"
        "The MLIR operation involved:\n"
        '  %7 = "tpu.fptosi"(%6) <{rounding_mode = #tpu.rounding_mode<towards_zero>}> : '
        "(vector<256x256xbf16>) -> vector<256x256xi8>\n"
    )
    verdict = mosaic.Verdict(False, "compile", FPTOSI, detail)
    cast = KernelOp("k", "arith.fptosi", ("vector<256x256xbf16>",), ("vector<256x256xi8>",), "q:5")
    other = KernelOp("k", "arith.sitofp", ("vector<256x256xi8>",), ("vector<256x256xbf16>",), "q:7")
    matmul = MatmulSite(
        "k", "vector<256x256xi8>", "vector<256x256xi8>", "vector<256x256xi32>", "int8", "int8",
        "q:6",
    )  # fmt: skip
    site, note = mosaic_check.site_of(verdict, KernelScan(("k",), (matmul,), (other, cast)))
    assert (site, note) == (cast, "")


def test_fix_for_a_finding_without_a_site_reads_the_printed_matmul():
    t = emulate.targets.get("tpu_v5e")
    printed = (
        'see current operation: %7 = "tpu.matmul"(%2, %5, %6) <{transpose_lhs = false}> : '
        "(vector<128x128xbf16>, vector<128x128xbf16>, vector<128x128xbf16>) -> "
        "vector<128x128xbf16>"
    )
    assert findings.matmul_in(printed) == (
        "vector<128x128xbf16>",
        "vector<128x128xbf16>",
        "vector<128x128xbf16>",
    )
    assert findings.fix_text(t, None, "x", printed) == findings.accumulator_fix(
        "vector<128x128xbf16>"
    )
    assert findings.fix_text(t, None, "boom", "").startswith("see the message; ")
