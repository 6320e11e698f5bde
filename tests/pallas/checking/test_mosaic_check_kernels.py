"""emulate.pallas.check on Pallas TPU kernels from public repositories, against the
compiler's own verdict (issue 14).

The kernels are vendored under tests/kernels/ (origin, commit and license in each header):

- JAX's megablox grouped matmul (jax_megablox/gmm.py), bf16 and f32 operands;
- pytorch/xla's w8a8 quantized matmul (torch_xla_quantized_matmul.py), int8 x int8 with
  an int32 accumulator, and f32 x int8 without activation quantization;
- tpu-inference's emit_pipeline grouped matmul (tpu_inference_gmm_v2.py), which reads
  ``pltpu.get_tpu_info()`` while it is traced (MXU width, int8/fp8 throughput,
  ``is_matmul_supported``) and so lowers a different program per generation;
- and two of emulate's own test kernels (tests/_pallas_kernels.py) for issue 28: an
  in-kernel activation quantizer (a bf16 -> int8 cast that needs compatibility mode on
  v4 to v6e) and a ``pl.kernel`` kernel on a TensorCore mesh made while it is traced.

One or two targets of each kernel by default (CASES; _LONG_CASES says which are long and
why), every listed target under EMULATE_LONG_TESTS=1. Each case is compiled directly, with
:func:`emulate.compiler.check_both`, with compatibility mode on and off; check must give
the same verdict (ok, or refused with the same first line of the message), and it must
report compat-only findings (at a matmul or at another operation) exactly when the
compiler refuses, with compatibility mode off, a program it compiles with it on, one of
them with the compiler's message.
"""

from __future__ import annotations

import functools
import pathlib
import sys
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import pytest
from _sweeps import LONG

import emulate.pallas
from emulate import compiler
from emulate.pallas.checking import mosaic_check
from emulate.pallas.checking.sites import MatmulSite

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"
sys.path.insert(0, str(KERNELS))
sys.path.insert(0, str(KERNELS.parent))
import _pallas_kernels as own  # noqa: E402
import torch_xla_quantized_matmul as xla_qmm  # noqa: E402
import tpu_inference_gmm_v2 as gmm_v2  # noqa: E402
from jax_megablox import gmm as megablox  # noqa: E402

# libtpu is a test dependency (jax[tpu] in the test extra): without it these tests fail.
assert compiler.available(), "the real TPU compiler (libtpu) is needed: pip install -e .[test]"

S = jax.ShapeDtypeStruct


def _lines(path: pathlib.Path, text: str) -> set[str]:
    """``path:line`` of every line of ``path`` that contains ``text``."""
    rows = path.read_text().splitlines()
    found = {f"{path}:{i + 1}" for i, row in enumerate(rows) if text in row}
    assert found, (path, text)
    return found


# The kernels' matmul lines: where every finding with a site must point.
MEGABLOX_DOT = _lines(KERNELS / "jax_megablox" / "gmm.py", "acc_scratch[...] += lax.dot_general(")
XLA_QMM_DOT = _lines(KERNELS / "torch_xla_quantized_matmul.py", "acc = jax.lax.dot_general(")
GMM_V2_DOT = _lines(KERNELS / "tpu_inference_gmm_v2.py", "block_acc = jnp.matmul(")
QUANTIZE_DOT = _lines(KERNELS.parent / "_pallas_kernels.py", "# site: quantize-dot")
MESH_DOT = _lines(KERNELS.parent / "_pallas_kernels.py", "# site: mesh")


# Module-level callers (a compat-off compile pickles them by reference).


def megablox_gmm(lhs, rhs, group_sizes):
    return megablox.gmm(lhs, rhs, group_sizes, tiling=(128, 128, 128))


def xla_w8a8(x, w, scale):
    return xla_qmm.quantized_matmul_int8(
        x, w, scale, quantize_activation=True,
        batch_block_size=128, out_block_size=128, in_block_size=128,
    )  # fmt: skip


def xla_w8(x, w, scale):
    # One block along k: with several, the kernel's own f32 accumulator scratch does not
    # take its bf16 partial sums (a tracing error in the kernel, not a Mosaic verdict).
    return xla_qmm.quantized_matmul_int8(
        x, w, scale, quantize_activation=False,
        batch_block_size=128, out_block_size=128, in_block_size=256,
    )  # fmt: skip


def tpu_inference_gmm(lhs, rhs, group_sizes):
    return gmm_v2.gmm_v2(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16)


def tpu_inference_gmm_scaled(lhs, rhs, group_sizes, rhs_scale):
    # tile_n 128: this libtpu refuses the kernel's zero-stride load of a 256-wide scale
    # tile ("The last dim size is not 128 in original base memref"), a non-matmul op.
    tiles = gmm_v2.TileSizes(tile_m=128, tile_k=256, tile_n=128, bucket_base=128)
    return gmm_v2.gmm_v2(
        lhs, rhs, group_sizes, rhs_scale, preferred_element_type=jnp.bfloat16, tile_info=tiles
    )


def tpu_inference_gmm_scaled_wide(lhs, rhs, group_sizes, rhs_scale):
    return gmm_v2.gmm_v2(lhs, rhs, group_sizes, rhs_scale, preferred_element_type=jnp.bfloat16)


_GROUPS = S((2,), jnp.int32)


def _gmm_args(dtype, lhs=jnp.bfloat16):
    return (S((256, 256), lhs), S((2, 256, 256), dtype), _GROUPS)


def _scaled_args(dtype):
    return (*_gmm_args(dtype), S((2, 2, 1, 256), jnp.float32))


_QMM_ARGS = (S((256, 256), jnp.bfloat16), S((256, 256), jnp.int8), S((256,), jnp.float32))
_QMM_F32_ARGS = (S((256, 256), jnp.float32), S((256, 256), jnp.int8), S((256,), jnp.float32))

# (id, fn, args, targets, the dot lines)
_KERNEL_CASES = [
    ("megablox-bf16", megablox_gmm, _gmm_args(jnp.bfloat16), ("tpu_v2", "tpu_v4", "tpu_v5e",
                                                              "tpu_v7x"), MEGABLOX_DOT),
    ("xla-w8a8-int8", xla_w8a8, _QMM_ARGS, ("tpu_v4", "tpu_v5e", "tpu_v7x"), XLA_QMM_DOT),
    ("xla-w8-f32xint8", xla_w8, _QMM_F32_ARGS, ("tpu_v5e", "tpu_v7x"), XLA_QMM_DOT),
    ("gmm_v2-bf16", tpu_inference_gmm, _gmm_args(jnp.bfloat16), ("tpu_v7x",), GMM_V2_DOT),
    ("gmm_v2-int8", tpu_inference_gmm_scaled, _scaled_args(jnp.int8),
     ("tpu_v4", "tpu_v5e", "tpu_v7x"), GMM_V2_DOT),
    ("gmm_v2-fp8", tpu_inference_gmm_scaled, _scaled_args(jnp.float8_e4m3fn),
     ("tpu_v4", "tpu_v5e", "tpu_v7x"), GMM_V2_DOT),
    ("gmm_v2-int8-unscaled", tpu_inference_gmm, _gmm_args(jnp.int8), ("tpu_v7x",), GMM_V2_DOT),
    ("gmm_v2-int8-wide-scale", tpu_inference_gmm_scaled_wide, _scaled_args(jnp.int8),
     ("tpu_v5e",), GMM_V2_DOT),
    ("quantizer", own.quantize_int8, (S((256, 256), jnp.bfloat16), S((256, 256), jnp.int8)),
     ("tpu_v4", "tpu_v5e", "tpu_v7x"), QUANTIZE_DOT),
    ("pl-kernel", own.mesh_int8, (S((128, 128), jnp.int8),) * 2,
     ("tpu_v4", "tpu_v5e", "tpu_v7x"), MESH_DOT),
]  # fmt: skip
# By default each kernel on the targets where its verdict or program differs most (the
# default COMPAT_OFF cases among them), one target where a second adds no new verdict (the
# bf16 megablox and unscaled int8 gmm_v2 programs, the quantizer, the plain kernel); these
# under EMULATE_LONG_TESTS=1 as well. Only the selected cases are compiled. gmm_v2's
# programs take some 6 s each to compile (the others about 1 s): by default its wide scale
# tile on v5e (refused at an operation other than a matmul, with compatibility mode on and
# off: COMPAT_OFF); long: its programs that compile in both settings (bf16 and fp8 on v7x, as
# megablox-bf16-tpu_v4 does), the int8 one on v4 (refused with compatibility mode off at
# the matmul for its mixed types: xla-w8-f32xint8-tpu_v5e's verdict) and on v5e
# (compat-only at an operation other than a matmul: xla-w8a8-int8-tpu_v5e's and
# quantizer-tpu_v5e's verdict, at their casts).
_LONG_CASES = {
    "gmm_v2-bf16-tpu_v7x",
    "gmm_v2-fp8-tpu_v7x",
    "gmm_v2-int8-tpu_v4",
    "gmm_v2-int8-tpu_v5e",
    "megablox-bf16-tpu_v2",
    "megablox-bf16-tpu_v5e",
    "megablox-bf16-tpu_v7x",
    "xla-w8a8-int8-tpu_v4",
    "xla-w8-f32xint8-tpu_v7x",
    "gmm_v2-int8-tpu_v7x",
    "gmm_v2-int8-unscaled-tpu_v7x",
    "gmm_v2-fp8-tpu_v4",
    "gmm_v2-fp8-tpu_v5e",
    "quantizer-tpu_v4",
    "quantizer-tpu_v7x",
    "pl-kernel-tpu_v4",
    "pl-kernel-tpu_v5e",
}
CASES = [
    pytest.param(
        fn,
        args,
        target,
        dots,
        id=f"{name}-{target}",
        marks=[pytest.mark.long] if f"{name}-{target}" in _LONG_CASES else [],
    )
    for name, fn, args, targets, dots in _KERNEL_CASES
    for target in targets
]
SELECTED = [p for p in CASES if LONG or p.id not in _LONG_CASES]


# The cases check also decides with compatibility mode off (a compat-off check compiles
# in a subprocess), those of them that are selected: one or more per kernel, with a
# refusal at a matmul, a compat-only matmul and a non-matmul refusal.
COMPAT_OFF = {
    "megablox-bf16-tpu_v4",
    "xla-w8-f32xint8-tpu_v5e",
    "xla-w8a8-int8-tpu_v5e",
    "xla-w8a8-int8-tpu_v7x",
    "gmm_v2-int8-tpu_v4",
    "gmm_v2-int8-tpu_v5e",
    "gmm_v2-int8-wide-scale-tpu_v5e",
    "quantizer-tpu_v5e",
    "pl-kernel-tpu_v7x",
}


def _key(fn, args, target):
    return (fn.__name__, tuple((a.shape, str(a.dtype)) for a in args), target)


# Each case is compiled once per setting and each check is made once: the compiles of all
# the cases share one call (one subprocess for the setting this process lacks), which
# keeps the module at seconds rather than a subprocess per case.


@functools.cache
def _compiler_verdicts() -> dict[bool, dict]:
    """The compiler's verdict on every case, compiled directly, with compatibility mode on
    and off (the two settings compile at the same time)."""
    jobs = [compiler.Job(fn, args, target) for fn, args, target, _ in (p.values for p in SELECTED)]
    got = compiler.check_both({True: jobs, False: jobs})
    return {
        compat: {
            _key(j.fn, j.arg_specs, j.target): v for j, v in zip(jobs, got[compat], strict=True)
        }
        for compat in (True, False)
    }


# compat-off compiles asked for (jobs per call; a call is one subprocess), by the check
# with compatibility mode on / off: of kernels (check_many) and of single operations
_SUBPROCESSES: dict[tuple[str, bool], list[int]] = {
    (what, c): [] for what in ("kernels", "ops") for c in (True, False)
}


@functools.cache
def _check_findings(compat: bool) -> dict:
    """emulate.pallas.check's findings (check is check_many of one job): with compatibility
    mode on for every case, off for the COMPAT_OFF ones; recorded-rule fallbacks fail.
    The compat-off compiles it asks for are counted in _SUBPROCESSES."""
    cases = [p.values for p in SELECTED if compat or p.id in COMPAT_OFF]
    jobs = [(fn, args, target) for fn, args, target, _ in cases]
    check_many, check_both = compiler.check_many, compiler.check_both
    mode = compat

    def counted_many(cjobs, *, compat=True):
        if not compat:
            _SUBPROCESSES["kernels", mode].append(len(cjobs))
        return check_many(cjobs, compat=compat)

    def counted_both(cjobs):
        if cjobs.get(False):
            _SUBPROCESSES["ops", mode].append(len(cjobs[False]))
        return check_both(cjobs)

    with (
        warnings.catch_warnings(),
        mock.patch.object(compiler, "check_many", counted_many),
        mock.patch.object(compiler, "check_both", counted_both),
    ):
        warnings.simplefilter("error", mosaic_check.RecordedRulesWarning)
        results = mosaic_check.check_many(jobs, compat=compat)
    return {_key(*job): findings for job, findings in zip(jobs, results, strict=True)}


def _verdict(fn, args, target, compat):
    return _compiler_verdicts()[compat][_key(fn, args, target)]


def _assert_same_verdict(findings, verdict, dots):
    refused = [f for f in findings if f.kind == "refused"]
    assert all(f.basis == "compiler" for f in findings), findings
    assert len(refused) <= 1, refused  # the compiler stops at its first error
    if verdict.ok:
        assert refused == [], refused
    else:
        assert [f.message for f in refused] == [verdict.message]
    files = {d.rsplit(":", 1)[0] for d in dots}
    for f in findings:
        if isinstance(f.site, MatmulSite):
            assert f.site.location in dots, f.site.location
        elif f.site is not None:  # another operation of the same kernel file
            assert f.site.location.rsplit(":", 1)[0] in files, f.site.location
    if refused and refused[0].site is None:
        # Only a refusal that does not concern a matmul (or happens before Mosaic) has
        # no site: its message names no tpu.matmul.
        assert "tpu.matmul" not in verdict.detail


@pytest.mark.parametrize("fn, args, target, dots", CASES)
def test_check_equals_the_compiler_on_public_kernels(fn, args, target, dots):
    findings = _check_findings(True)[_key(fn, args, target)]
    on = _verdict(fn, args, target, True)
    _assert_same_verdict(findings, on, dots)
    # compat-only findings: exactly when the compiler, with compatibility mode off,
    # refuses a program it compiles with it on; the first one is what it says.
    compat_only = [f for f in findings if f.kind == "compat-only"]
    assert all(f.site is not None for f in compat_only)
    if on.ok:
        off = _verdict(fn, args, target, False)
        assert bool(compat_only) == (not off.ok), (off, compat_only)
        if compat_only:
            # a matmul or another operation (the w8a8 kernel's bf16 -> int8 cast on v5e)
            assert off.message in {f.message for f in compat_only}


SELECTED_OFF = [p for p in SELECTED if p.id in COMPAT_OFF]


def test_check_equals_the_compiler_with_compat_off():
    assert {p.id for p in CASES} >= COMPAT_OFF
    cases = [p.values for p in SELECTED_OFF]
    # the selected compat-off cases hold an ok program and refused ones
    verdicts = [_verdict(fn, args, target, False) for fn, args, target, _ in cases]
    assert any(v.ok for v in verdicts) and not all(v.ok for v in verdicts)
    for fn, args, target, dots in cases:
        findings = _check_findings(False)[_key(fn, args, target)]
        assert all(f.kind == "refused" for f in findings), findings
        _assert_same_verdict(findings, _verdict(fn, args, target, False), dots)


def test_check_many_compiles_the_operations_of_all_kernels_together():
    # compat on: the kernels compile in this process; their narrow conversions and
    # comparisons compile with compat off in one subprocess for all the cases (none when
    # an earlier test of this process compiled them all), not one per kernel (11 before).
    _check_findings(True)
    assert _SUBPROCESSES["kernels", True] == []
    assert len(_SUBPROCESSES["ops", True]) <= 1, _SUBPROCESSES["ops", True]
    # compat off: all the kernels in one subprocess; the operations a refusal is at, in
    # at most one more (none when the compat-on check compiled them first)
    _check_findings(False)
    assert _SUBPROCESSES["kernels", False] == [len(SELECTED_OFF)]
    assert len(_SUBPROCESSES["ops", False]) <= 1, _SUBPROCESSES["ops", False]


def test_check_of_one_kernel_is_check_many_of_one():
    fn, args, target, _ = next(p.values for p in CASES if p.id == "quantizer-tpu_v5e")
    assert (
        emulate.pallas.check(fn, *args, target=target)
        == _check_findings(True)[_key(fn, args, target)]
    )


def test_gmm_v2_lowers_per_generation():
    """The emit_pipeline kernel reads pltpu.get_tpu_info() while traced: check traces it
    for the target, so each generation gets its own matmuls."""
    pairs = {}
    for target in ("tpu_v4", "tpu_v5e", "tpu_v7x"):
        sites = mosaic_check.matmul_sites(
            tpu_inference_gmm_scaled, *_scaled_args(jnp.int8), target=target
        )
        pairs[target] = {(s.lhs, s.rhs, s.acc_type.rsplit("x", 1)[1]) for s in sites}
        assert {s.location for s in sites} <= GMM_V2_DOT
    # v4: no int8 MXU, bf16 x int8 (compat mode converts); v5e: the activations are
    # quantized to int8; v7x: 128-wide quant blocks are narrower than its 256-wide MXU,
    # so the weights are dequantized to bf16 first.
    assert pairs == {
        "tpu_v4": {("bfloat16", "int8", "f32>")},
        "tpu_v5e": {("int8", "int8", "i32>")},
        "tpu_v7x": {("bfloat16", "bfloat16", "f32>")},
    }
