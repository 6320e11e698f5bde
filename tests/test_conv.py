"""emulate.conv_general_dilated against an im2col oracle: the convolution written out as
patches (numpy) times weights, contracted by :func:`emulate.reference.dot_general`.

Hypothesis examples per case: 3 by default, 5 under EMULATE_LONG_TESTS=1 (the exact and
bounded classes); 2 and 4 (sliced exact); 2 and 3 (QArray kernels). By default the
examples of an exact-class case or a QArray scheme share its configuration (and result
type or target), the cases taking them in turn; each example draws them in the long run.
The patches cut by gathers: three configurations by default, every one under
EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import LONG, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import bounds, formats, program, reference, targets
from emulate import testing as et

TARGETS = ["tpu_v4", "tpu_v5e", "tpu_v2", "cpu"]
INTS = {"int4", "uint4", "int8", "uint8"}
GROUPED = (((2,), (1,)), ((0,), (0,)))  # reference.dot_general: (G, P, K) x (G, K, O)


# ----------------------------------------------------------------------------- oracle


def _perms(specs: tuple[str, str, str]) -> tuple[list[int], list[int], list[int]]:
    """Axis orders that bring lhs/rhs/out to (N, C, spatial...) / (O, I, spatial...).

    Spatial dimensions are matched by letter and ordered as in the rhs spec (lax's rule).
    """
    lhs_spec, rhs_spec, out_spec = specs
    spatial = [c for c in rhs_spec if c not in "OI"]
    lhs = [lhs_spec.index("N"), lhs_spec.index("C")] + [lhs_spec.index(c) for c in spatial]
    rhs = [rhs_spec.index("O"), rhs_spec.index("I")] + [rhs_spec.index(c) for c in spatial]
    out = [out_spec.index("N"), out_spec.index("C")] + [out_spec.index(c) for c in spatial]
    return lhs, rhs, out


def _pads(padding, in_sizes, kernel_sizes, strides) -> list[tuple[int, int]]:
    if padding == "VALID":
        return [(0, 0)] * len(in_sizes)
    if padding == "SAME":
        pads = []
        for n, k, s in zip(in_sizes, kernel_sizes, strides, strict=True):
            out = -(-n // s)
            total = max((out - 1) * s + k - n, 0)
            pads.append((total // 2, total - total // 2))
        return pads
    return [tuple(p) for p in padding]


def im2col(lhs, rhs, strides, padding, lhs_dil, rhs_dil, specs, groups):
    """Patches (G, N*P, Cg*T) and weights (G, Cg*T, Og), and how to fold the result back.

    P: output positions, T: window taps, Cg / Og: input / output features per group.
    """
    lp, rp, op = _perms(specs)
    x = np.asarray(lhs).transpose(lp)  # (N, C, S...)
    w = np.asarray(rhs).transpose(rp)  # (O, Cg, K...)
    nsp = x.ndim - 2
    lhs_dil = lhs_dil or (1,) * nsp
    rhs_dil = rhs_dil or (1,) * nsp
    # lhs dilation: zeros between the input elements.
    dil_sizes = [(n - 1) * d + 1 for n, d in zip(x.shape[2:], lhs_dil, strict=True)]
    xd = np.zeros(x.shape[:2] + tuple(dil_sizes), x.dtype)
    xd[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in lhs_dil)] = x
    eff_kernel = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], rhs_dil, strict=True)]
    pads = _pads(padding, dil_sizes, eff_kernel, strides)
    padded_sizes = [n + lo + hi for n, (lo, hi) in zip(dil_sizes, pads, strict=True)]
    xp = np.zeros(x.shape[:2] + tuple(padded_sizes), x.dtype)
    xp[
        (slice(None), slice(None)) + tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, dil_sizes))
    ] = xd
    out_sizes = [
        (n - k) // s + 1 for n, k, s in zip(padded_sizes, eff_kernel, strides, strict=True)
    ]
    positions = list(itertools.product(*(range(o) for o in out_sizes)))
    taps = list(itertools.product(*(range(k) for k in w.shape[2:])))
    n, c = x.shape[:2]
    patches = np.zeros((n, len(positions), c, len(taps)), x.dtype)
    for pi, pos in enumerate(positions):
        for ti, tap in enumerate(taps):
            idx = tuple(
                o * s + t * d for o, s, t, d in zip(pos, strides, tap, rhs_dil, strict=True)
            )
            patches[:, pi, :, ti] = xp[(slice(None), slice(None)) + idx]
    cg = c // groups
    o = w.shape[0]
    og = o // groups
    pg = patches.reshape(n, len(positions), groups, cg * len(taps)).transpose(2, 0, 1, 3)
    pg = pg.reshape(groups, n * len(positions), cg * len(taps))
    wg = w.reshape(groups, og, cg * len(taps)).transpose(0, 2, 1)

    def fold(res: np.ndarray) -> np.ndarray:
        """(G, N*P, Og) -> the output layout of ``specs``."""
        r = res.reshape(groups, n, len(positions), og).transpose(1, 0, 3, 2)
        r = r.reshape((n, o) + tuple(out_sizes))
        return r.transpose(np.argsort(op))

    return pg, wg, fold


def conv_reference(lhs, rhs, cfg, pet):
    pg, wg, fold = im2col(lhs, rhs, *cfg.oracle_args)
    return fold(reference.dot_general(pg, wg, GROUPED, preferred_element_type=pet))


# ----------------------------------------------------------------------------- configs


class Conv:
    """One convolution problem: shapes, layout and window parameters."""

    def __init__(
        self, lhs_shape, rhs_shape, strides, padding, specs, *, lhs_dil=None, rhs_dil=None, groups=1
    ):
        self.lhs_shape, self.rhs_shape = lhs_shape, rhs_shape
        self.strides, self.padding, self.specs = strides, padding, specs
        self.lhs_dil, self.rhs_dil, self.groups = lhs_dil, rhs_dil, groups

    @property
    def oracle_args(self):
        return (
            self.strides,
            self.padding,
            self.lhs_dil,
            self.rhs_dil,
            self.specs,
            self.groups,
        )

    def run(self, lhs, rhs, **kw):
        return emulate.conv_general_dilated(
            lhs,
            rhs,
            self.strides,
            self.padding,
            lhs_dilation=self.lhs_dil,
            rhs_dilation=self.rhs_dil,
            dimension_numbers=self.specs,
            feature_group_count=self.groups,
            **kw,
        )

    def lax(self, lhs, rhs, **kw):
        return jax.lax.conv_general_dilated(
            lhs,
            rhs,
            self.strides,
            self.padding,
            lhs_dilation=self.lhs_dil,
            rhs_dilation=self.rhs_dil,
            dimension_numbers=self.specs,
            feature_group_count=self.groups,
            **kw,
        )

    def __repr__(self):
        return f"Conv({self.lhs_shape}, {self.rhs_shape}, {self.specs}, {self.padding})"


NCH = ("NCH", "OIH", "NCH")
NWC = ("NWC", "WIO", "NWC")
NCHW = ("NCHW", "OIHW", "NCHW")
NHWC = ("NHWC", "HWIO", "NHWC")

# A fixed pool, so compiled programs are reused across examples.
CONFIGS = [
    Conv((2, 3, 7), (4, 3, 3), (1,), "VALID", NCH),
    Conv((1, 3, 9), (2, 3, 3), (2,), ((1, 2),), NCH, rhs_dil=(2,)),
    Conv((1, 5, 2), (3, 2, 4), (1,), ((2, 1),), NWC, lhs_dil=(2,)),
    Conv((1, 2, 5, 4), (3, 2, 3, 2), (1, 2), "SAME", NCHW, rhs_dil=(1, 2)),
    Conv((2, 4, 5, 3), (2, 3, 3, 2), (2, 1), ((1, 0), (0, 2)), NHWC),
    Conv((1, 4, 4, 4), (6, 2, 3, 3), (1, 1), "SAME", NCHW, groups=2),
    Conv((1, 2, 3, 3), (2, 2, 2, 2), (1, 1), ((1, 1), (0, 0)), NCHW, lhs_dil=(2, 1)),
    Conv((1, 4, 3, 2), (2, 2, 2, 3), (1, 1), "SAME", ("NHWC", "OIHW", "NCHW")),
]


def test_oracle_matches_lax_on_float32():
    # The oracle itself, against XLA's own f32 convolution on small integers (exact in f32).
    rng = np.random.default_rng(0)
    for cfg in CONFIGS:
        a = rng.integers(-8, 8, cfg.lhs_shape).astype(np.float32)
        b = rng.integers(-8, 8, cfg.rhs_shape).astype(np.float32)
        want = np.asarray(cfg.lax(a, b))
        got = conv_reference(a, b, cfg, np.float32)
        assert got.shape == want.shape, cfg
        assert got.tolist() == want.tolist(), cfg


# ----------------------------------------------------------------------------- exact classes


def same_bits(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.kind in "iu":
        return np.array_equal(got, want)
    g, w = got.astype(np.float32), want.astype(np.float32)
    both_nan = np.isnan(g) & np.isnan(w)
    # The sign of a zero result is not part of the contract.
    return bool(np.all(both_nan | (g == w)))


def out_types(lhs: str, rhs: str) -> list:
    if lhs in INTS and rhs in INTS:
        return [None, jnp.int32]
    res = formats.dot_result(lhs, rhs)
    return ([None] if res.xla_storable else []) + [jnp.float32, jnp.bfloat16]


def representative(lhs: str, rhs: str) -> list[str]:
    """Of TARGETS, one per distinct program (targets with the same plan run the same code)."""
    seen: dict[tuple, str] = {}
    for t in TARGETS:
        p = emulate.plan(lhs, rhs, target=t, preferred_element_type=out_types(lhs, rhs)[-1])
        key = (p.method, p.lhs_compute, p.rhs_compute, p.k_chunk, p.fallback and p.fallback.method)
        seen.setdefault(key, t)
    return list(seen.values())


EXACT_PAIRS = [
    ("int8", "int8"),
    ("int4", "int4"),
    ("float4_e2m1fn", "float4_e2m1fn"),
    ("float6_e2m3fn", "float6_e2m3fn"),
    ("int8", "int4"),
    ("float4_e2m1fn", "float6_e2m3fn"),
]
EXACT_CASES = [(a, b, t) for a, b in EXACT_PAIRS for t in representative(a, b)]


def _chosen(data, options: list, case: int, label: str, turn: int = 1):
    """One of ``options`` for an example: by default the case's own (the ``case //
    turn``-th, cyclically: the default cases take the options in turn, and every example
    of a case runs the same program), drawn by each example under
    EMULATE_LONG_TESTS=1."""
    if LONG:
        return data.draw(st.sampled_from(options), label=label)
    return options[(case // turn) % len(options)]


# By default every example of a case takes the case's own configuration and result type
# (the i-th case the i-th configuration, cyclically, and the result types in turn: one
# program a case); each example draws both under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize("lhs,rhs,target", EXACT_CASES)
@settings(max_examples=examples(3, 5))
@given(data=st.data())
def test_exact_classes_are_bit_identical(lhs, rhs, target, data):
    i = EXACT_CASES.index((lhs, rhs, target))
    cfg = _chosen(data, CONFIGS, i, "config")
    a = data.draw(et.arrays(lhs, cfg.lhs_shape, elements="finite"), label="lhs")
    b = data.draw(et.arrays(rhs, cfg.rhs_shape, elements="finite"), label="rhs")
    pet = _chosen(data, out_types(lhs, rhs), i, "pet", turn=len(CONFIGS))
    got = cfg.run(a, b, preferred_element_type=pet, target=target)
    want = conv_reference(a, b, cfg, pet)
    assert same_bits(got, want), (cfg, pet, np.asarray(got), want)


# ----------------------------------------------------------------------------- chunked path


def _e2m3(codes: np.ndarray) -> np.ndarray:
    return codes.astype(np.uint8).view(ml_dtypes.float6_e2m3fn)


@pytest.mark.parametrize("target", ["tpu_v4", "tpu_v2", "cpu"])
def test_chunked_fp6_conv_is_bit_identical(target):
    # e2m3 x e2m3 in f32 is exact for K <= 4660; here K = 600 features x 9 taps = 5400.
    p = emulate.plan("float6_e2m3fn", "float6_e2m3fn", target=target, preferred_element_type="f32")
    assert (p.k_chunk, p.accumulator) == (
        {"tpu_v4": 4660, "tpu_v2": 4660, "cpu": 596523}[target],
        {"tpu_v4": "float32", "tpu_v2": "float32", "cpu": "int32"}[target],
    )
    rng = np.random.default_rng(11)
    xc = rng.integers(0, 64, (1, 600, 4, 3))
    wc = rng.integers(0, 64, (2, 600, 3, 3))
    xc[:, :590] = 0x1F  # 7.5: partial sums grow past 2**24 quanta of 2**-6
    wc[:, :590] = 0x1F
    wc[1, :590] = 0x3F  # -7.5: a large negative sum as well
    x, w = _e2m3(xc), _e2m3(wc)
    cfg = Conv(x.shape, w.shape, (1, 1), "VALID", NCHW)
    exact = im2col(x, w, *cfg.oracle_args)
    big = reference.exact_dot_general(exact[0], exact[1], GROUPED)
    assert max(abs(v) for v in big.flat) * 2**6 > 2**24  # a plain f32 sum would round
    for pet in (jnp.float32, jnp.bfloat16):
        got = cfg.run(x, w, preferred_element_type=pet, target=target)
        assert same_bits(got, conv_reference(x, w, cfg, pet)), pet


def test_chunked_int8_conv_nhwc():
    # int8 x int8 on tpu_v4 decodes to bf16 with exact f32 chunks of K <= 1024; K = 1350.
    assert emulate.plan("int8", "int8", target="tpu_v4").k_chunk == 1024
    rng = np.random.default_rng(12)
    x = rng.integers(-128, 128, (2, 4, 3, 150)).astype(np.int8)
    w = rng.integers(-128, 128, (3, 3, 150, 2)).astype(np.int8)
    x[..., :100] = 127
    w[..., :100, 0] = 127
    w[..., :100, 1] = -128
    cfg = Conv(x.shape, w.shape, (1, 1), ((1, 1), (0, 1)), NHWC)
    for pet in (None, jnp.int32, jnp.float32):
        got = cfg.run(x, w, preferred_element_type=pet, target="tpu_v4")
        assert same_bits(got, conv_reference(x, w, cfg, pet)), pet


# ----------------------------------------------------------------------------- bounded pair


_ACT = st.one_of(
    st.floats(-1e4, 1e4, width=32, allow_nan=False),
    st.sampled_from([0.0, 1.0, -3.0, 2.0**-130, -(2.0**-133), 2.0**-120]),
)


def within_bound(got, a, b, cfg) -> bool:
    """``got`` lies between the roundings of exact -+ bound into its own format."""
    pg, wg, fold = im2col(a, b, *cfg.oracle_args)
    exact = fold(reference.exact_dot_general(pg, wg, GROUPED))
    bnd = fold(bounds.dot_general_bound(pg, wg, GROUPED))
    out = formats.get(np.asarray(got).dtype)
    g = np.asarray(got).astype(np.float64)
    assert exact.shape == g.shape
    for e, bd, v in zip(exact.flat, bnd.flat, g.flat, strict=True):
        if not isinstance(e, Fraction):  # NaN / Inf: IEEE
            if not (np.isnan(e) and np.isnan(v) or e == v):
                return False
            continue
        lo = _round(e - Fraction(bd), out)
        hi = _round(e + Fraction(bd), out)
        if not np.isfinite(v):
            if np.isfinite(lo) and np.isfinite(hi):
                return False
            continue
        if not (lo if np.isfinite(lo) else -np.inf) <= v <= (hi if np.isfinite(hi) else np.inf):
            return False
    return True


def _round(x: Fraction, out) -> float:
    den = x.denominator
    assert den & (den - 1) == 0
    return reference.round_exact(x.numerator, -(den.bit_length() - 1), out)


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=examples(3, 5))
@given(data=st.data())
def test_bf16_x_fp8_is_within_the_bound(target, data):
    cfg = data.draw(st.sampled_from(CONFIGS), label="config")
    a = data.draw(hnp.arrays(np.float32, cfg.lhs_shape, elements=_ACT)).astype(ml_dtypes.bfloat16)
    # Finite weights: where a NaN weight meets padding or lhs-dilation holes, XLA's CPU
    # convolution multiplies the padding in some configurations and skips it in others.
    b = data.draw(et.arrays("float8_e4m3fn", cfg.rhs_shape, elements="finite"), label="rhs")
    pet = data.draw(st.sampled_from([None, jnp.float32]), label="pet")
    got = cfg.run(a, b, preferred_element_type=pet, target=target)
    assert np.asarray(got).dtype == formats.dot_result("bfloat16", "float8_e4m3fn", pet).dtype
    assert within_bound(got, a, b, cfg)


@pytest.mark.parametrize("target", TARGETS)
def test_nan_and_inf_follow_ieee_in_a_valid_conv(target):
    # No padding, no dilation: every product is a real one. NaN weight -> NaN; Inf
    # activation times a positive weight -> Inf, times zero -> NaN; +Inf + -Inf -> NaN.
    cfg = CONFIGS[0]  # (2, 3, 7) x (4, 3, 3), VALID, NCH
    a = np.ones(cfg.lhs_shape, ml_dtypes.bfloat16)
    a[1, 0, 3] = np.inf
    b = np.ones(cfg.rhs_shape, ml_dtypes.float8_e4m3fn)
    b[0, 1, 1] = np.nan
    b[1, 0, :] = 0
    b[2, 0, 1] = -1
    b[2, 0, 2] = 0.5
    got = np.asarray(cfg.run(a, b, preferred_element_type=jnp.float32, target=target))
    assert within_bound(got, a, b, cfg)
    # Output o, batch n, position p sums a[n, c, p + t] * b[o, c, t]; the Inf (batch 1,
    # channel 0, index 3) meets taps t = 0, 1, 2 at positions p = 3, 2, 1.
    inf, nan = math.inf, math.nan
    want = np.array(
        [
            [[nan] * 5, [6.0] * 5, [6.5] * 5, [9.0] * 5],
            [[nan] * 5, [6, nan, nan, nan, 6], [6.5, inf, -inf, inf, 6.5], [9, inf, inf, inf, 9]],
        ]
    )
    assert same_bits(got, want.astype(np.float32))


# ----------------------------------------------------------------------------- programs


def _zeros(fmt: str, shape) -> np.ndarray:
    return np.zeros(shape, formats.get(fmt).dtype)


JAXPR_PAIRS = EXACT_PAIRS + [("bfloat16", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e4m3fn")]


@pytest.mark.parametrize("target", TARGETS)
def test_program_holds_only_native_pairs(target):
    t = targets.get(target)
    big = Conv((1, 600, 4, 3), (2, 600, 3, 3), (1, 1), "VALID", NCHW)  # chunked where exact
    for (lhs, rhs), cfg in itertools.product(JAXPR_PAIRS, (CONFIGS[5], big)):
        a, b = _zeros(lhs, cfg.lhs_shape), _zeros(rhs, cfg.rhs_shape)

        def f(a=a, b=b, cfg=cfg):
            return cfg.run(a, b, preferred_element_type=jnp.float32, target=t)

        sites = program.sites(jax.make_jaxpr(f)())
        assert sites, (lhs, rhs, cfg)
        for s in sites:
            assert s.primitive == "conv_general_dilated", s
            assert t.supports(s.lhs_dtype, s.rhs_dtype), (target, lhs, rhs, s)


def test_chunked_program_has_one_conv_per_feature_slice():
    # 600 features, 9 taps, K-chunk 4660: slices of 517 features, so two convolutions.
    cfg = Conv((1, 600, 4, 3), (2, 600, 3, 3), (1, 1), "VALID", NCHW)
    a, b = _zeros("float6_e2m3fn", cfg.lhs_shape), _zeros("float6_e2m3fn", cfg.rhs_shape)
    jaxpr = jax.make_jaxpr(
        lambda: cfg.run(a, b, preferred_element_type=jnp.float32, target="tpu_v4")
    )()
    sites = program.sites(jaxpr)
    assert [(s.primitive, s.lhs_shape, s.rhs_shape) for s in sites] == [
        ("conv_general_dilated", (1, 517, 4, 3), (2, 517, 3, 3)),
        ("conv_general_dilated", (1, 83, 4, 3), (2, 83, 3, 3)),
    ]
    assert {(s.lhs_dtype, s.rhs_dtype) for s in sites} == {("bfloat16", "bfloat16")}
    assert math.ceil(600 / (4660 // 9)) == 2


# ----------------------------------------------------------------------------- errors


def test_rank_mismatch():
    with pytest.raises(  # lax raises TypeError for it
        TypeError,
        match=r"^lhs, rhs: convolution operands need the same rank, got 3 and 4; "
        r"lhs int8\[1, 2, 5\], rhs int8\[3, 2, 3, 3\], target tpu_v4$",
    ):
        emulate.conv_general_dilated(
            np.zeros((1, 2, 5), np.int8),
            np.zeros((3, 2, 3, 3), np.int8),
            (1,),
            "VALID",
            target="tpu_v4",
        )


def test_rank_2_is_a_dot_over_features():
    # No spatial dimensions: as in JAX, a (N, C) x (O, C) contraction over the features.
    rng = np.random.default_rng(11)
    a = rng.integers(-8, 8, (2, 5)).astype(ml_dtypes.int4)
    b = rng.integers(-8, 8, (3, 5)).astype(ml_dtypes.int4)
    got = emulate.conv_general_dilated(
        a, b, (), "VALID", preferred_element_type=np.int32, target="cpu"
    )
    want = a.astype(np.int64) @ b.astype(np.int64).T
    assert got.dtype == np.int32
    assert np.asarray(got).tolist() == want.tolist()
    with pytest.raises(
        ValueError,
        match=r"^lhs, rhs: convolution operands need the same rank, at least 2; "
        r"lhs int4\[5\], rhs int4\[5\], target cpu$",
    ):
        emulate.conv_general_dilated(a[0], b[0], (), "VALID", target="cpu")


def test_feature_mismatch():
    with pytest.raises(
        ValueError,
        match=r"^lhs, rhs: lhs has 4 input features, rhs expects 3 x feature_group_count 1; "
        r"lhs float4_e2m1fn\[1, 4, 5\], rhs float4_e2m1fn\[2, 3, 3\], target tpu_v5e$",
    ):
        emulate.conv_general_dilated(
            _zeros("float4_e2m1fn", (1, 4, 5)),
            _zeros("float4_e2m1fn", (2, 3, 3)),
            (1,),
            "VALID",
            target="tpu_v5e",
        )


def test_feature_mismatch_with_groups_nhwc():
    with pytest.raises(
        ValueError,
        match=r"^lhs, rhs: lhs has 6 input features, rhs expects 2 x feature_group_count 2; "
        r"lhs int8\[1, 4, 4, 6\], rhs int8\[3, 3, 2, 4\], target tpu_v4$",
    ):
        emulate.conv_general_dilated(
            np.zeros((1, 4, 4, 6), np.int8),
            np.zeros((3, 3, 2, 4), np.int8),
            (1, 1),
            "SAME",
            dimension_numbers=NHWC,
            feature_group_count=2,
            target="tpu_v4",
        )


def test_window_longer_than_the_exact_chunk():
    # 4900 taps > the 4660-term chunk of e2m3 x e2m3 in f32 (tpu_v4): the windows are
    # taken as patches and contracted in exact chunks.
    rng = np.random.default_rng(9)
    a = _e2m3(rng.integers(0, 64, (1, 1, 71, 70)))
    b = _e2m3(rng.integers(0, 64, (2, 1, 70, 70)))
    cfg = Conv(a.shape, b.shape, (1, 1), "VALID", NCHW)
    got = cfg.run(a, b, preferred_element_type=jnp.float32, target="tpu_v4")
    assert same_bits(got, conv_reference(a, b, cfg, np.float32))


def test_grouped_conv_needing_chunks():
    # K = 128 * 9 = 1152 > the 1024-term f32 chunk of int8 x int8 on tpu_v4, two groups.
    rng = np.random.default_rng(10)
    a = rng.integers(-128, 128, (1, 256, 3, 3)).astype(np.int8)
    b = rng.integers(-128, 128, (4, 128, 3, 3)).astype(np.int8)
    cfg = Conv(a.shape, b.shape, (1, 1), ((1, 0), (0, 1)), NCHW, groups=2)
    for pet in (jnp.float32, jnp.int32):
        got = cfg.run(a, b, preferred_element_type=pet, target="tpu_v4")
        assert same_bits(got, conv_reference(a, b, cfg, pet))


# ----------------------------------------------------------------------------- mode exact, sliced

# (lhs, rhs, target, configs): each pair on a few fixed configurations (programs compile once).
SLICED_CONV_CASES = [
    ("float8_e4m3fn", "float8_e4m3fn", "tpu_v5e", (0, 3, 5)),
    ("float8_e5m2", "float8_e4m3fn", "tpu_v2", (1, 4)),
    ("bfloat16", "float8_e4m3fn", "tpu_v4", (2, 6, 7)),
    # float16 rows x bfloat16 (both sides wide) under EMULATE_LONG_TESTS=1: configs 0 and 5
    # run above, the wide per-row slicing in bfloat16 x float8_e4m3fn.
    pytest.param("float16", "bfloat16", "tpu_v5e", (0, 5), marks=pytest.mark.long),
]


@pytest.mark.parametrize("lhs,rhs,target,configs", SLICED_CONV_CASES)
@settings(max_examples=examples(2, 4))
@given(data=st.data())
def test_sliced_exact_conv_is_bit_identical(lhs, rhs, target, configs, data):
    cfg = CONFIGS[data.draw(st.sampled_from(configs), label="config")]
    a = data.draw(et.arrays(lhs, cfg.lhs_shape), label="lhs")
    b = data.draw(et.arrays(rhs, cfg.rhs_shape), label="rhs")
    got = cfg.run(a, b, preferred_element_type=jnp.float32, target=target, mode="exact")
    # NaN weights meet padding zeros in the oracle's patches too: NaN, by IEEE.
    want = conv_reference(a, b, cfg, np.float32)
    assert same_bits(got, want), (cfg, np.asarray(got), want)


# By default three configurations (each a program of mode "exact" of its own): one
# spatial dimension with a stride, a dilated window and explicit pads; two with "SAME"
# pads, a stride and a dilated window; two with a dilated input. Every configuration
# (layouts, groups, more of the same index arithmetic) under EMULATE_LONG_TESTS=1.
GATHER_CONFIGS = CONFIGS if LONG else [CONFIGS[1], CONFIGS[3], CONFIGS[6]]


def test_patches_by_gathers_match_patches_by_slices(monkeypatch):
    # Long windows are cut into patches by gathers: the same bits on every layout.
    from emulate import conv

    monkeypatch.setattr(conv, "GATHER_TAPS", 0)  # read at each call: a program of its own
    rng = np.random.default_rng(6)
    for cfg in GATHER_CONFIGS:
        a = rng.standard_normal(cfg.lhs_shape).astype(ml_dtypes.float8_e4m3fn)
        b = rng.standard_normal(cfg.rhs_shape).astype(ml_dtypes.float8_e4m3fn)
        got = cfg.run(a, b, preferred_element_type=jnp.float32, target="tpu_v5e", mode="exact")
        assert same_bits(got, conv_reference(a, b, cfg, np.float32)), cfg


def test_sliced_exact_conv_batch_groups_and_bf16_result():
    # batch_group_count, against XLA's f32 convolution of small integers (exact there).
    rng = np.random.default_rng(5)
    a = rng.integers(-8, 8, (4, 3, 6)).astype(np.float32)
    b = rng.integers(-8, 8, (6, 3, 2)).astype(np.float32)
    want = jax.lax.conv_general_dilated(a, b, (1,), "SAME", batch_group_count=2)
    e4 = ml_dtypes.float8_e4m3fn
    got = emulate.conv_general_dilated(
        a.astype(e4),
        b.astype(e4),
        (1,),
        "SAME",
        batch_group_count=2,
        preferred_element_type=jnp.bfloat16,
        target="tpu_v4",
        mode="exact",
    )
    assert same_bits(got, np.asarray(want).astype(ml_dtypes.bfloat16))


# ----------------------------------------------------------------------------- QArray kernels

_QSCHEMES = {
    "MXFP4": lambda w, k_axes, i_axis: emulate.quantize(w, emulate.mx.MXFP4, axis=i_axis),
    "MXFP8_E4M3": lambda w, k_axes, i_axis: emulate.quantize(w, emulate.mx.MXFP8_E4M3, axis=i_axis),
    "NVFP4": lambda w, k_axes, i_axis: emulate.quantize(w, emulate.mx.NVFP4, axis=i_axis),
    "int8 per channel": lambda w, k_axes, i_axis: emulate.quantize(
        w, emulate.mx.INT8_PER_CHANNEL, axis=k_axes
    ),
    "fp8 per channel": lambda w, k_axes, i_axis: emulate.quantize(
        w, emulate.mx.FP8_PER_CHANNEL, axis=k_axes
    ),
}


# By default every example of a scheme takes the scheme's own configuration and target
# (the configurations in turn over the schemes, the targets alternating: one program a
# scheme); each example draws both under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize("scheme", sorted(_QSCHEMES))
@settings(max_examples=examples(2, 3))
@given(data=st.data())
def test_qarray_kernel_is_within_the_bound_of_its_dequantized_values(scheme, data):
    """A QArray kernel (per output channel: codes convolved, then scaled; blocks along
    the input features: dequantized values) against the exact convolution of the
    dequantized values (the numpy oracle), within gamma_(K + 4) * sum|a*b|."""
    i = sorted(_QSCHEMES).index(scheme)
    cfg = _chosen(data, CONFIGS, i, "config")
    target = _chosen(data, ["tpu_v4", "tpu_v7x"], i, "target")
    a = data.draw(hnp.arrays(np.float32, cfg.lhs_shape, elements=_ACT), label="lhs")
    w = data.draw(
        hnp.arrays(np.float32, cfg.rhs_shape, elements=st.floats(-8, 8, width=32)), label="w"
    )
    spec = cfg.specs[1]
    o_axis, i_axis = spec.index("O"), spec.index("I")
    k_axes = tuple(d for d in range(len(spec)) if d != o_axis)
    q = _QSCHEMES[scheme](jnp.asarray(w), k_axes, i_axis)
    ts = None if q.tensor_scale is None else float(q.tensor_scale)
    values = reference.dequantize(
        np.asarray(q.unpacked_codes()), np.asarray(q.scales), q.block_shape, ts
    )
    got = np.asarray(cfg.run(a, q, target=target))
    assert got.dtype == np.float32
    pg, wg, fold = im2col(a, values, *cfg.oracle_args)
    k = pg.shape[-1]
    exact = fold(reference.exact_dot_general(pg, wg, GROUPED))
    bnd = fold(bounds.dot_general_bound(pg, wg, GROUPED)) * (
        bounds.gamma(k + 4) / bounds.gamma(max(k, 1))
    )
    want = np.array([float(e) for e in exact.flat]).reshape(exact.shape)
    np.testing.assert_array_less(np.abs(got - want), bnd + 2.0**-126)


def test_qarray_kernel_refusals():
    q = emulate.quantize(jnp.ones((3, 3, 4, 2)), emulate.mx.MXFP8_E4M3, axis=2)
    x = jnp.ones((1, 5, 5, 4))
    with pytest.raises(ValueError, match=r"^rhs_format: a QArray carries its format"):
        emulate.conv_general_dilated(
            x, q, (1, 1), "SAME", dimension_numbers=NHWC, rhs_format="int8"
        )
    with pytest.raises(TypeError, match=r"^lhs: a QArray input is not built for convolutions"):
        emulate.conv_general_dilated(q, q, (1, 1), "SAME", dimension_numbers=NHWC)
    with pytest.raises(ValueError, match=r"^preferred_element_type: the result of a convolution"):
        emulate.conv_general_dilated(
            x, q, (1, 1), "SAME", dimension_numbers=NHWC, preferred_element_type=jnp.int32
        )
