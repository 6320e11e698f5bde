"""emulate.pallas.check and check-kernel: the Mosaic module of each kernel, lowered for TPU on
the CPU, and the tpu.matmul operand types each target rejects; emulate.pallas.dot and
emulate.pallas.matmul lower to pairs every target runs.

One TPU target of each family by default for the per-target sweeps (FAMILIES; the kernel's
pairs: half of them on each family target, in turn), and a few of the probe sample a
stratum (2 compiled, 4 by the recorded rules);
every target, every pair and the full sample under EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import contextlib
import functools
import io
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest
from _sweeps import examples

import emulate
import emulate.pallas
from emulate import cli, compiler, formats, mosaic, targets
from emulate.numerics.storage import Packed

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import _pallas_kernels as kernels  # noqa: E402

from emulate.pallas.checking import mosaic_check

KERNELS = pathlib.Path(kernels.__file__)
TPUS = [n for n in targets.names() if targets.get(n).kind == "tpu"]
I8 = jax.ShapeDtypeStruct((256, 256), jnp.int8)
RAW_MESSAGE = (
    "E2001: CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on target: "
    "vector<128x128xi8>"
)
AUTO_CONVERSION = (
    "Automatic int->float or f4 -> f8 conversion for matmuls requires compatibility mode."
)
HAVE_COMPILER = compiler.libtpu_version() is not None and compiler.available()


def _line(marker: str) -> int:
    lines = KERNELS.read_text().splitlines()
    (found,) = [i + 1 for i, line in enumerate(lines) if f"# site: {marker}" in line]
    return found


PROBED = list(mosaic.recorded().topologies)
UNPROBED = [t for t in TPUS if t not in PROBED]
# One target of each family by default (v2/v3 f32, v4 bf16 decode, v5e native int8, v7x
# bf16 decode on a 256-wide MXU); every TPU target under EMULATE_LONG_TESTS=1.
FAMILIES = {"tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v7x"}


def _families(names, keep=FAMILIES):
    return [pytest.param(n, marks=[] if n in keep else [pytest.mark.long]) for n in names]


@pytest.fixture
def recorded_rules(monkeypatch):
    """Decide by the recorded rules, as on a machine without libtpu."""
    monkeypatch.setattr(mosaic_check, "_compiler_here", lambda: False)
    monkeypatch.setattr(mosaic_check, "_warned", set())


def _expected(target, lhs, rhs, acc, compat):
    """(kind, message) that check must report for a one-site kernel, from the probe."""
    v = mosaic.verdict(target, lhs, rhs, acc=acc, compat=compat)
    assert v is not None, (target, lhs, rhs, acc, compat)
    if not v.ok:
        return ("refused", v.message)
    off = mosaic.verdict(target, lhs, rhs, acc=acc, compat=False)
    if compat and off is not None and not off.ok:
        return ("compat-only", off.message)
    return None


@pytest.mark.parametrize("target", PROBED)
def test_raw_int8_kernel_gets_the_compilers_verdict(target):
    findings = emulate.pallas.check(kernels.raw_int8, I8, I8, target=target)
    want = _expected(target, "int8", "int8", "int32", True)
    if want is None:
        assert findings == []
        return
    (f,) = findings
    assert (f.kind, f.message) == want
    assert f.target == target
    assert f.basis == ("compiler" if HAVE_COMPILER else "recorded")
    assert f.site.kernel == "_raw_int8_kernel"
    assert (f.site.lhs_type, f.site.rhs_type, f.site.acc_type) == (
        "vector<256x256xi8>",
        "vector<256x256xi8>",
        "vector<256x256xi32>",
    )
    assert f.site.location == f"{KERNELS}:{_line('raw')}"
    head = str(f).splitlines()[0]
    if f.kind == "refused":
        assert head == (
            f"{KERNELS}:{_line('raw')}: kernel '_raw_int8_kernel' on {target}: "
            f"Mosaic failed to compile TPU kernel: {f.message}"
        )
    else:
        assert head.endswith(
            f"compiles only in Mosaic's compatibility mode (with it off: {f.message})"
        )
    assert "emulate.pallas.dot(a, b, preferred_element_type=jnp.int32)" in f.fix


def test_the_issue_targets():
    (v4,) = emulate.pallas.check(kernels.raw_int8, I8, I8, target="tpu_v4")
    assert (v4.kind, v4.operand, v4.message) == ("refused", "RHS", RAW_MESSAGE)
    assert "to bfloat16 x bfloat16 with a float32 accumulator (exact)" in v4.fix
    for target in ("tpu_v5e", "tpu_v6e"):
        assert emulate.pallas.check(kernels.raw_int8, I8, I8, target=target) == []
    # 7x: compat mode converts int8 to bf16 and sums in f32; with it off, refused.
    (v7x,) = emulate.pallas.check(kernels.raw_int8, I8, I8, target="tpu_v7x")
    assert v7x.kind == "compat-only"
    assert v7x.message == AUTO_CONVERSION
    assert "int8 to bf16 (exact) and sums in f32 instead of int32" in v7x.note
    assert "below 2**24" in v7x.note
    (off,) = emulate.pallas.check(kernels.raw_int8, I8, I8, target="tpu_v7x", compat=False)
    assert (off.kind, off.message) == ("refused", AUTO_CONVERSION)
    assert off.note.startswith("compiles with compatibility mode on (the default)")


def test_recorded_rules_without_libtpu_say_so_once(recorded_rules):
    with pytest.warns(mosaic_check.RecordedRulesWarning, match="not available here"):
        (f,) = emulate.pallas.check(kernels.raw_int8, I8, I8, target="tpu_v4")
    assert (f.basis, f.kind, f.message) == ("recorded", "refused", RAW_MESSAGE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (f,) = emulate.pallas.check(kernels.raw_int8, I8, I8, target="tpu_v7x")
    assert (f.basis, f.kind) == ("recorded", "compat-only")


@pytest.mark.parametrize("target", UNPROBED)
def test_targets_without_a_topology_use_jax_table(target):
    findings = emulate.pallas.check(kernels.raw_int8, I8, I8, target=target)
    assert {f.basis for f in findings} <= {"table"}
    assert bool(findings) != targets.get(target).supports("int8", "int8")


@pytest.mark.parametrize("target", _families(TPUS))
def test_dot_kernel_lowers_to_a_pair_the_target_runs(target):
    t = targets.get(target)
    sites = emulate.pallas.matmul_sites(kernels.fixed_int8, I8, I8, target=target)
    assert emulate.pallas.check(kernels.fixed_int8, I8, I8, target=target) == []
    expect = {"int8": "i8", "bfloat16": "bf16", "float32": "f32"}
    native = t.supports("int8", "int8")
    compute = "int8" if native else "bfloat16" if t.supports("bfloat16", "bfloat16") else "float32"
    e = expect[compute]
    acc = "i32" if native else "f32"
    # K = 256 is within one exact chunk on every route; a decoded pair is decoded (and
    # multiplied) a K-slice of the MXU width at a time: two slices on 128-wide MXUs
    step = 256 if native else t.mxu_column_size
    assert len(sites) == 256 // step
    for site in sites:
        assert (site.lhs_type, site.rhs_type, site.acc_type) == (
            f"vector<256x{step}x{e}>",
            f"vector<{step}x256x{e}>",
            f"vector<256x256x{acc}>",
        )
        assert t.supports(site.lhs, site.rhs)


def test_current_target_is_the_default():
    with emulate.target("tpu_v4"):
        (f,) = emulate.pallas.check(kernels.raw_int8, I8, I8)
        assert f.target == "tpu_v4"
        sites = emulate.pallas.matmul_sites(kernels.fixed_int8, I8, I8)
        assert [s.lhs for s in sites] == ["bfloat16"] * 2  # two K-slices of 128


def test_sites_inside_jit_scan_and_a_kernel_loop_are_found():
    x = jax.ShapeDtypeStruct((128, 256), jnp.int8)
    w = jax.ShapeDtypeStruct((256, 128), jnp.int8)
    sites = emulate.pallas.matmul_sites(kernels.looped_int8, x, w)
    assert [s.lhs_type for s in sites] == ["vector<128x128xi8>"]
    assert sites[0].location == f"{KERNELS}:{_line('looped')}"
    (f,) = emulate.pallas.check(kernels.looped_int8, x, w, target="tpu_v4")
    assert (f.kind, f.message) == ("refused", RAW_MESSAGE)
    assert f.site == sites[0]


def _mixed(lhs, rhs):
    a = jax.ShapeDtypeStruct((128, 128), lhs)
    b = jax.ShapeDtypeStruct((128, 128), rhs)
    return a, b


# v4 (f32) and v7x (bf16) conversions by default; v5e under EMULATE_LONG_TESTS=1
@pytest.mark.parametrize(
    "target", _families(["tpu_v4", "tpu_v5e", "tpu_v7x"], keep={"tpu_v4", "tpu_v7x"})
)
def test_int_float_mixes_compile_only_in_compatibility_mode(target):
    # bf16 x int8: compat mode converts the int8 side (to f32; on 7x to bf16).
    for lhs, rhs in ((jnp.bfloat16, jnp.int8), (jnp.int8, jnp.bfloat16)):
        (f,) = emulate.pallas.check(kernels.mixed, *_mixed(lhs, rhs), target=target)
        assert f.kind == "compat-only"
        assert f.site.location == f"{KERNELS}:{_line('mixed')}"
        assert f.note.startswith("compatibility mode converts")
        (g,) = emulate.pallas.check(kernels.mixed, *_mixed(lhs, rhs), target=target, compat=False)
        assert (g.kind, g.message) == ("refused", f.message)


def test_v2_refuses_bf16_x_int8():
    (f,) = emulate.pallas.check(kernels.mixed, *_mixed(jnp.bfloat16, jnp.int8), target="tpu_v2")
    want = mosaic.verdict("tpu_v2", "bfloat16", "int8", acc="float32", compat=True)
    assert want is not None and (f.kind, f.message) == ("refused", want.message)


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"^fn: expected a callable, got int$"):
        emulate.pallas.check(3, I8, target="tpu_v4")
    with pytest.raises(ValueError, match=r"^target: the check predicts Mosaic's TPU compiler, "):
        emulate.pallas.check(kernels.raw_int8, I8, I8, target="cpu")
    with pytest.raises(ValueError, match=r"^target: unknown target 'tpu_v9'"):
        emulate.pallas.check(kernels.raw_int8, I8, I8, target="tpu_v9")


# --------------------------------------------------------------------------- the kernel

_MATMUL_PAIRS = [
    ("bfloat16", "int4"),
    ("bfloat16", "float8_e4m3fn"),
    ("bfloat16", "float6_e3m2fn"),
    ("float32", "int4"),
    ("int8", "int8"),
    ("int8", "int4"),
    ("float4_e2m1fn", "float4_e2m1fn"),
    ("uint8", "uint8"),
    ("float8_e5m2", "float8_e5m2"),
    ("float8_e4m3fn", "float8_e4m3fn"),
]


def _matmul_args(lhs: str, rhs: str, m=64, k=1024, n=512):
    lf, rf = formats.get(lhs), formats.get(rhs)
    x_dtype = lf.dtype if not lf.is_low_precision else jnp.uint8
    x = jax.ShapeDtypeStruct((m, k), x_dtype)
    if rf.packable and rf.bits != 6:  # a 6-bit Packed weight wants prepare_weight (K-planar)
        w = Packed(jax.ShapeDtypeStruct((rf.bits * k // 8, n), jnp.uint8), rf.name, -2, k)
    else:
        w = jax.ShapeDtypeStruct((k, n), jnp.uint8)
    out = jnp.int32 if lf.is_integer and rf.is_integer else jnp.float32
    x_format = lf.name if lf.is_low_precision else None
    w_format = None if isinstance(w, Packed) else rf.name

    def fn(x, w):
        return emulate.pallas.matmul(
            x, w, out_dtype=out, interpret=False, x_format=x_format, w_format=w_format
        )

    return fn, x, w


def _pair_cases() -> list:
    """(target, pairs): every pair on every TPU target under EMULATE_LONG_TESTS=1; by
    default the family targets (FAMILIES), each with every other pair, in turn (each pair
    on two of the four, each target five pairs: each lowering traces a kernel of its own),
    the other half of each family's pairs and the other targets long."""
    fam = [t for t in TPUS if t in FAMILIES]
    cases = []
    for target in TPUS:
        if target not in FAMILIES:
            cases.append(pytest.param(target, "all", marks=pytest.mark.long))
            continue
        half = fam.index(target) % 2
        cases.append(pytest.param(target, f"half{half}"))
        cases.append(pytest.param(target, f"half{1 - half}", marks=pytest.mark.long))
    return cases


def _pairs(which: str) -> list[tuple[str, str]]:
    if which == "all":
        return _MATMUL_PAIRS
    return _MATMUL_PAIRS[int(which[-1]) :: 2]


@pytest.mark.parametrize("target, pairs", _pair_cases())
def test_matmul_kernel_lowers_to_pairs_every_target_runs(target, pairs, recorded_rules):
    # The pairs, by the recorded rules; tests/test_compiler.py compiles the kernel.
    t = targets.get(target)
    for lhs, rhs in _pairs(pairs):
        fn, x, w = _matmul_args(lhs, rhs)
        sites = emulate.pallas.matmul_sites(fn, x, w, target=target)
        assert sites, (lhs, rhs)
        for s in sites:
            assert s.kernel == "emulate_matmul"
            assert t.supports(s.lhs, s.rhs), (lhs, rhs, s)
        assert emulate.pallas.check(fn, x, w, target=target) == [], (lhs, rhs)


def test_matmul_kernel_operand_types_per_generation():
    fn, x, w = _matmul_args("int8", "int8")
    got = {}
    for t in ("tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v7x"):
        sites = emulate.pallas.matmul_sites(fn, x, w, target=t)
        got[t] = {(s.lhs, s.rhs, s.acc_type[-4:]) for s in sites}
    assert got == {
        "tpu_v2": {("float32", "float32", "f32>")},
        "tpu_v4": {("bfloat16", "bfloat16", "f32>")},
        "tpu_v5e": {("int8", "int8", "i32>")},
        "tpu_v7x": {("bfloat16", "bfloat16", "f32>")},
    }
    # Packed int4: one tpu.matmul per nibble plane, on (bm, bk/2) x (bk/2, bn) tiles.
    fn, x, w = _matmul_args("bfloat16", "int4", m=64, k=1024, n=512)
    sites = emulate.pallas.matmul_sites(fn, x, w, target="tpu_v5e")
    assert [(s.lhs_type, s.rhs_type) for s in sites] == [
        ("vector<64x512xbf16>", "vector<512x256xbf16>")
    ] * 2
    # e4m3fn x e4m3fn is native from v7 on: the codes go to the matrix unit as they are.
    fn, x, w = _matmul_args("float8_e4m3fn", "float8_e4m3fn")
    (s,) = emulate.pallas.matmul_sites(fn, x, w, target="tpu_v7x")
    assert (s.lhs, s.rhs) == ("float8_e4m3fn", "float8_e4m3fn")


# --------------------------------------------------------------------------- command line


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


SHAPES = ["--shapes", "256x256:int8,256x256:int8"]
BASIS = "compiler" if HAVE_COMPILER else "recorded rules"


def test_cli_flags_v4_and_passes_v5e():
    code, out, _ = _cli(["check-kernel", f"{KERNELS}:raw_int8", "--target", "v4", *SHAPES])
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"tpu_v4: 1 tpu.matmul, 1 finding ({BASIS}, compat on)"
    assert lines[1] == (
        f"{KERNELS}:{_line('raw')}: kernel '_raw_int8_kernel' on tpu_v4: "
        f"Mosaic failed to compile TPU kernel: {RAW_MESSAGE}"
    )
    assert lines[3].startswith("  fix: call emulate.pallas.dot(")
    code, out, _ = _cli(["check-kernel", f"{KERNELS}:raw_int8", "--target", "tpu_v5e", *SHAPES])
    assert (code, out) == (0, f"tpu_v5e: 1 tpu.matmul, ok ({BASIS}, compat on)\n")


@pytest.mark.long  # per target by default: test_cli_flags_v4_and_passes_v5e
def test_cli_all_targets_and_the_fixed_kernel():
    code, out, _ = _cli(["check-kernel", f"{KERNELS}:raw_int8", "--target", "all", *SHAPES])
    assert code == 1
    verdicts = [ln for ln in out.splitlines() if ln.startswith("tpu_")]
    assert [v.split(":")[0] for v in verdicts] == TPUS
    ok = {v.split(":")[0] for v in verdicts if ", ok (" in v}
    assert ok == {"tpu_v5e", "tpu_v5p", "tpu_v6e"}
    code, out, _ = _cli(["check-kernel", f"{KERNELS}:fixed_int8", "--target", "all", *SHAPES])
    assert code == 0
    assert out.count(", ok (") == len(TPUS)


def test_cli_module_path_form(monkeypatch):
    monkeypatch.syspath_prepend(str(KERNELS.parent))
    code, out, _ = _cli(["check-kernel", "_pallas_kernels:raw_int8", "--target", "v7x", *SHAPES])
    assert code == 1 and out.startswith(f"tpu_v7x: 1 tpu.matmul, 1 finding ({BASIS}, compat on)\n")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            [f"{KERNELS}:raw_int8", "--target", "v4", "--shapes", "256x256:int9"],
            "--shapes: unknown dtype 'int9'",
        ),
        (
            [f"{KERNELS}:raw_int8", "--target", "v4", "--shapes", "256xa:int8"],
            "--shapes: shape '256xa' is not positive integers joined by x",
        ),
        (
            [f"{KERNELS}:raw_int8", "--target", "v4", "--shapes", "256x256"],
            "--shapes: '256x256' is not SHAPE:DTYPE (e.g. 256x256:int8)",
        ),
        (
            [f"{KERNELS}:nothing", "--target", "v4", *SHAPES],
            f"'{KERNELS}' has no attribute 'nothing'",
        ),
        (["no_such_module_xyz:f", "--target", "v4"], "cannot import 'no_such_module_xyz': "),
        (["raw_int8", "--target", "v4"], "expected MODULE:FUNCTION, got 'raw_int8'"),
        ([f"{KERNELS}:raw_int8", "--target", "cpu", *SHAPES], "not a TPU target: 'cpu'"),
    ],
)
def test_cli_bad_arguments_are_one_line(argv, message):
    code, out, err = _cli(["check-kernel", *argv])
    assert code == 2 and out == ""
    assert err.startswith(f"emulate check-kernel: error: {message}")
    assert err.count("\n") == 1


def test_parse_shapes():
    args = cli.parse_shapes("256x128:int8, 8:bf16,:float32,2x3x4:e4m3")
    assert [(a.shape, jnp.dtype(a.dtype).name) for a in args] == [
        ((256, 128), "int8"),
        ((8,), "bfloat16"),
        ((), "float32"),
        ((2, 3, 4), "float8_e4m3fn"),
    ]
    with pytest.raises(ValueError, match=r"^float6_e2m3fn arrays cannot be XLA arguments"):
        cli.parse_shapes("8:e2m3")


@pytest.mark.long  # the CLI's verdicts and exit codes run by default in-process (_cli)
def test_python_dash_m_exit_status():
    done = subprocess.run(
        [sys.executable, "-m", "emulate", "check-kernel", f"{KERNELS}:raw_int8"]
        + ["--target", "tpu_v4", "tpu_v5e", *SHAPES],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[0] == f"tpu_v4: 1 tpu.matmul, 1 finding ({BASIS}, compat on)"
    assert f"tpu_v5e: 1 tpu.matmul, ok ({BASIS}, compat on)" in done.stdout


# ------------------------------------------------------------- the probe, case by case


def _probe_sample(per_stratum: int):
    """Probe rows, every (target, compat) stratum, evenly spaced within it: a few a
    stratum by default, more under EMULATE_LONG_TESTS=1."""
    rows: dict = {}
    for r in mosaic.recorded().rows:
        rows.setdefault((r.case.target, r.case.compat), []).append(r)
    picked = []
    for stratum in rows.values():
        step = max(1, len(stratum) // per_stratum)
        picked += stratum[::step]
    return picked


def _probe_job(case):
    spec = [jax.ShapeDtypeStruct((128, 128), formats.get(f).dtype) for f in (case.lhs, case.rhs)]
    return (functools.partial(kernels.probe_matmul, acc=case.acc), spec, case.target)


def _agrees(case, findings):
    want = _expected(case.target, case.lhs, case.rhs, case.acc, case.compat)
    got = [(f.kind, f.message) for f in findings]
    return got == ([] if want is None else [want])


@pytest.mark.parametrize("compat", [True, False])
def test_check_equals_the_compiler_on_the_probe(compat):
    assert HAVE_COMPILER, "libtpu is a test dependency: pip install -e .[test]"
    rows = [r for r in _probe_sample(examples(2, 14)) if r.case.compat == compat]
    results = mosaic_check.check_many([_probe_job(r.case) for r in rows], compat=compat)
    bad = [r.case for r, f in zip(rows, results, strict=True) if not _agrees(r.case, f)]
    assert bad == []
    assert {f.basis for fs in results for f in fs} <= {"compiler"}
    assert {r.case.target for r in rows} == set(PROBED)


def test_a_refusal_is_placed_at_the_matmul_mosaic_prints():
    # libtpu 0.0.42 prints the op with its attributes between the operands and the types;
    # the message names no type, and the kernel has several matmuls.
    detail = (
        "MosaicError: INTERNAL: Mosaic failed to compile TPU kernel: "
        f"{AUTO_CONVERSION}\n\nThe MLIR operation involved:\n"
        '  %65 = "tpu.matmul"(%62, %64, %1) <{dimension_numbers = #tpu.dot_dimension_numbers'
        "<[1], [1], [0], [0], [0, 0, 1, 0], [], []>, transpose_lhs = false, transpose_lhs_hint "
        "= false, transpose_rhs = false}> : (vector<128x128xi8>, vector<128x128xi8>, "
        "vector<128x128xi32>) -> vector<128x128xi32>\n"
    )
    verdict = mosaic.Verdict(False, "compile", AUTO_CONVERSION, detail)

    def site(element, acc, line):
        v, fmt = f"vector<128x128x{element}>", mosaic_check.MLIR_FORMATS[element]
        return mosaic_check.MatmulSite("k", v, v, f"vector<128x128x{acc}>", fmt, fmt, f"k:{line}")

    bf16, int8 = site("bf16", "f32", 1), site("i8", "i32", 2)
    found = mosaic_check.KernelScan(("k",), (bf16, int8, site("i8", "i32", 2)), ())
    assert mosaic_check.site_of(verdict, found) == (int8, "")


@pytest.mark.parametrize("compat", [True, False])
def test_recorded_rules_equal_the_probe(compat, recorded_rules):
    rows = [r for r in _probe_sample(examples(4, 20)) if r.case.compat == compat]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mosaic_check.RecordedRulesWarning)
        results = mosaic_check.check_many([_probe_job(r.case) for r in rows], compat=compat)
    bad = [r.case for r, f in zip(rows, results, strict=True) if not _agrees(r.case, f)]
    assert bad == []


def test_cli_no_compat_refuses_int8_on_v7x():
    code, out, _ = _cli(["check-kernel", f"{KERNELS}:raw_int8", "--target", "v7x", *SHAPES])
    assert code == 1
    assert "compiles only in Mosaic's compatibility mode" in out
    argv = ["check-kernel", f"{KERNELS}:raw_int8", "--target", "v7x", "--no-compat", *SHAPES]
    code, out, _ = _cli(argv)
    assert code == 1
    # This file is loaded beside the tests' own import of it, so its functions do not
    # pickle for the API's compat-off subprocess; the CLI runs again with compat off and
    # the compiler decides.
    assert out.splitlines()[0] == "tpu_v7x: 1 tpu.matmul, 1 finding (compiler, compat off)"
    assert out.splitlines()[1].endswith(f"Mosaic failed to compile TPU kernel: {AUTO_CONVERSION}")


def test_cli_exit_2_for_a_kernel_that_does_not_load_or_trace(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n")
    code, out, err = _cli(["check-kernel", f"{bad}:f", "--target", "v4"])
    assert (code, out) == (2, "")
    assert err == (
        f"emulate check-kernel: error: cannot import '{bad}': "
        "SyntaxError: invalid syntax (broken.py, line 1)\n"
    )
    raises = tmp_path / "raises.py"
    raises.write_text("import no_such_module_for_check_kernel\n")
    code, out, err = _cli(["check-kernel", f"{raises}:f", "--target", "v4"])
    assert code == 2 and err.count("\n") == 1
    assert "ModuleNotFoundError" in err or "No module named" in err
    shapes = tmp_path / "shapes.py"
    shapes.write_text(
        "import jax.numpy as jnp\n\ndef f(x):\n    return jnp.dot(x, jnp.ones((3, 3)))\n"
    )
    code, out, err = _cli(["check-kernel", f"{shapes}:f", "--target", "v4", "--shapes", "2x2:f32"])
    assert (code, out) == (2, "")
    assert err == (
        f"emulate check-kernel: error: cannot trace '{shapes}:f' for tpu_v4: TypeError: "
        "dot_general requires contracting dimensions to have the same shape, got (2,) and "
        "(3,).\n"
    )


def test_kernels_that_read_get_tpu_info_are_checked():
    x = jax.ShapeDtypeStruct((128, 128), jnp.int8)
    for target in ("tpu_v4", "tpu_v5e", "tpu_v7x", "tpu_v7"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mosaic_check.RecordedRulesWarning)
            findings = emulate.pallas.check(kernels.divided_int8, x, x, target=target)
        want = _expected(target, "int8", "int8", "int32", True) if target in PROBED else None
        if target in PROBED:
            assert [(f.kind, f.message) for f in findings] == ([] if want is None else [want])
        assert all(f.site.location == f"{KERNELS}:{_line('divided')}" for f in findings)


# ------------------------------------------------------ kernels from public repositories

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "kernels"))
import jax_matmul  # noqa: E402


def _jax_matmul(x, y):
    return jax_matmul.matmul(x, y, block_shape=(128, 128), block_k=128)


def test_jax_pallas_tpu_matmul_int8_gets_the_compilers_verdict():
    x = jax.ShapeDtypeStruct((256, 256), jnp.int8)
    for target in ("tpu_v4", "tpu_v5e", "tpu_v7x"):
        findings = emulate.pallas.check(_jax_matmul, x, x, target=target)
        want = _expected(target, "int8", "int8", "int32", True)
        assert [(f.kind, f.message) for f in findings] == ([] if want is None else [want])
        for f in findings:
            assert f.site.location.endswith("jax_matmul.py:38"), f.site.location
