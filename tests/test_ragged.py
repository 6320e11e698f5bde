"""emulate.ragged_dot / ragged_dot_general: JAX's own cases, the oracle, stacked QArrays,
polyfill and inspect. The grouped kernel's program on every TPU generation (one custom
call, no weight-sized temporaries) is compiled by tests/test_tpu_compile.py
(``emulate.ragged_dot``)."""

from __future__ import annotations

import functools

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import emulate
from emulate import bounds, program, reference

E4, E5 = jnp.float8_e4m3fn, jnp.float8_e5m2

# JAX's own ragged_dot cases: jax-ml/jax, tests/lax_test.py, class RaggedTest, commit
# cec06d116c05f0d52adfceee3d3b730fdbcb0ce5: (m, k, n, num_groups) of test_ragged_dot
# (dtypes: jtu.dtypes.all_floating; JAX skips float16, float64 needs x64), of
# test_ragged_dot_use_ragged_dot_instruction, and of test_ragged_dot_small_m (group sizes
# all 1: they sum to fewer than m).
JAX_CASES = [
    *((64, 4, 3, 1, dt, "split") for dt in ("float32", "bfloat16")),
    *((64, 9, 8, 2, dt, "split") for dt in ("float32", "bfloat16")),
    (16, 4, 3, 2, "float32", "split"),
    (5, 4, 3, 1, "float32", "ones"),
    (5, 4, 3, 2, "float32", "ones"),
    (9, 4, 3, 1, "float32", "ones"),
    (10, 9, 8, 2, "float32", "ones"),
]


def _halves(rng, shape, dtype):
    """Small halves: every product and sum is exact in every type, so bits must match."""
    return jnp.asarray((rng.integers(-4, 5, shape) / 2).astype(np.float32)).astype(dtype)


def _split(rng, m, g):
    """JAX's group_sizes helper: g - 1 sorted cut points in [0, m), the last group to m."""
    ends = np.concatenate([np.sort(rng.choice(m, size=g - 1)), [m]])
    return jnp.asarray(ends - np.concatenate([[0], ends[:-1]]), jnp.int32)


def _same(a, b) -> None:
    assert (a.dtype, a.shape) == (b.dtype, b.shape)
    bits = f"uint{8 * np.dtype(a.dtype).itemsize}"
    np.testing.assert_array_equal(np.asarray(a).view(bits), np.asarray(b).view(bits))


@pytest.mark.parametrize("target", ["cpu", "tpu_v2"])
@pytest.mark.parametrize(("m", "k", "n", "g", "dtype", "sizes"), JAX_CASES)
def test_jax_cases_give_jaxs_bits_drop_in_and_polyfilled(m, k, n, g, dtype, sizes, target):
    rng = np.random.default_rng(m * 1000 + k * 100 + n * 10 + g)
    x, w = _halves(rng, (m, k), dtype), _halves(rng, (g, k, n), dtype)
    gs = _split(rng, m, g) if sizes == "split" else jnp.ones((g,), jnp.int32)
    want = lax.ragged_dot(x, w, gs)
    _same(emulate.ragged_dot(x, w, gs, target=target), want)
    _same(emulate.polyfill(lax.ragged_dot, target=target)(x, w, gs), want)


def _rdn(dn, ragged, group):
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=dn, lhs_ragged_dimensions=ragged, rhs_group_dimensions=group
    )


# test_ragged_dot_general_shape_inference_failure (same file and commit): each refused with
# JAX's exception type and message, for emulated operands (float8) and JAX's own (float32).
FAILURES = [
    (
        (11, 5),
        (3, 5, 7),
        (3,),
        _rdn((([1], [1]), ([], [])), [0, 1], [0]),
        "ragged_dot_general expects exactly one lhs ragged dimension",
    ),
    (
        (11, 5),
        (3, 5, 7),
        (3,),
        _rdn((([1], [1]), ([], [])), [2], [0]),
        "ragged_dot_general requires lhs ragged dimension numbers to be nonnegative and less "
        "than the number of axes of the lhs",
    ),
    (
        (11, 5),
        (3, 5, 7),
        (2, 3),
        _rdn((([1], [1]), ([], [])), [0], [0]),
        r"expected group_sizes to have shape \(3,\), got \(2, 3\)",
    ),
    (
        (19, 17, 11, 5),
        (3, 19, 5, 7),
        (19, 11, 3),
        _rdn((([3], [2]), ([0], [1])), [2], [0]),
        r"expected group_sizes to have shape \(19, 17, 3\), got \(19, 11, 3\)",
    ),
    (
        (19, 11, 17, 5),
        (19, 17, 5, 7),
        (19, 11, 3),
        _rdn((([2, 3], [1, 2]), ([0], [0])), [3], []),
        r"expected group_sizes to have shape \(19, 17, 3\), got \(19, 11, 3\)",
    ),
    (
        (17, 19, 11, 5),
        (17, 19, 5, 7),
        (19, 3),
        _rdn((([3], [2]), ([0, 1], [0, 1])), [1], []),
        r"expected group_sizes to have shape \(17, 3\), got \(19, 3\)",
    ),
    (
        (19, 11, 5),
        (19, 5, 7),
        (19, 3),
        _rdn((([2], [1]), ([0], [0])), [1], [0]),
        "ragged_dot_general requires rhs group dimension numbers to be distinct from "
        "contracting and batch dimensions",
    ),
    (
        (11, 3),
        (3, 3, 7),
        (3,),
        _rdn((([1], [1]), ([], [])), [0], [1]),
        "ragged_dot_general requires rhs group dimension numbers to be distinct from "
        "contracting and batch dimensions",
    ),
    (
        (11, 5),
        (3, 5, 7),
        (2,),
        _rdn((([1], [1]), ([], [])), [0], [0]),
        "expected rhs group dimension size to be 2, got 3",
    ),
    (
        (2, 11, 5),
        (3, 2, 5, 7),
        (3,),
        _rdn((([2], [2]), ([0], [1])), [0], [0]),
        "ragged_dot_general requires zero group dimensions in the rhs when lhs ragged "
        "dimension is contracting or batch",
    ),
    (
        (11, 5),
        (3, 5, 7),
        (3,),
        _rdn((([1], [1]), ([], [])), [1], [0]),
        "ragged_dot_general requires zero group dimensions in the rhs when lhs ragged "
        "dimension is contracting or batch",
    ),
    (
        (11, 5),
        (5, 7),
        (3,),
        _rdn((([1], [0]), ([], [])), [0], []),
        "ragged_dot_general requires exactly one rhs group dimension when lhs ragged "
        "dimension is noncontracting",
    ),
]


@pytest.mark.parametrize("dtype", [E4, jnp.float32])
@pytest.mark.parametrize(("lhs", "rhs", "gs", "rdn", "message"), FAILURES)
def test_jaxs_refusals_are_emulates(lhs, rhs, gs, rdn, message, dtype) -> None:
    x, w, g = jnp.ones(lhs, dtype), jnp.ones(rhs, dtype), jnp.ones(gs, jnp.int32)
    with pytest.raises(TypeError, match=message):
        emulate.ragged_dot_general(x, w, g, rdn)


# test_ragged_dot_general_shape_inference_success (same file and commit), the three modes,
# with group sizes that cover each ragged dimension.
MODES = [
    ((11, 5), (3, 5, 7), [4, 0, 7], _rdn((([1], [1]), ([], [])), [0], [0]), (11, 7)),
    ((11, 5), (5, 7), [2, 3, 0], _rdn((([1], [0]), ([], [])), [1], []), (3, 11, 7)),
    (
        (2, 11, 5),
        (2, 5, 7),
        [[1, 3, 1], [0, 5, 0]],
        _rdn((([2], [1]), ([0], [0])), [2], []),
        (3, 2, 11, 7),
    ),
    (
        (2, 11, 5),
        (3, 2, 5, 7),
        [[3, 3, 5], [0, 11, 0]],
        _rdn((([2], [2]), ([0], [1])), [1], [0]),
        (2, 11, 7),
    ),
]


@pytest.mark.parametrize(("lhs", "rhs", "gs", "rdn", "out"), MODES)
def test_every_mode_of_float8_operands_gives_jaxs_exact_values(lhs, rhs, gs, rdn, out) -> None:
    rng = np.random.default_rng(len(lhs) + len(rhs) + out[0])
    x, w, g = _halves(rng, lhs, E5), _halves(rng, rhs, E4), jnp.array(gs, jnp.int32)
    got = emulate.ragged_dot_general(
        x, w, g, rdn, preferred_element_type=jnp.float32, target="tpu_v4"
    )
    want = lax.ragged_dot_general(x.astype(jnp.float32), w.astype(jnp.float32), g, rdn)
    assert got.shape == out
    _same(got, want)


@st.composite
def _group_sizes(draw, m: int, g: int):
    """Awkward sizes: empty groups, one group holding every row, fewer rows than m."""
    kind = draw(st.sampled_from(["any", "one", "short"]))
    if kind == "one":
        sizes = [0] * g
        sizes[draw(st.integers(0, g - 1))] = m
        return sizes
    cuts = sorted(draw(st.lists(st.integers(0, m), min_size=g, max_size=g)))
    total = cuts[-1] if kind == "short" else m
    ends = [*cuts[:-1], total]
    return [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]


# Compiled once per operand types, shared by the examples (group sizes are traced).
_INT_RUN = jax.jit(
    lambda a, b, s: emulate.ragged_dot(a, b, s, preferred_element_type=jnp.int32, target="tpu_v2")
)
_F32_RUN = jax.jit(
    lambda a, b, s: emulate.ragged_dot(a, b, s, preferred_element_type=jnp.float32, target="tpu_v4")
)

_PAIRS = [("int8", "int8"), ("int4", "int8"), ("uint4", "int4"), ("int8", "uint8")]


@given(st.data())
def test_integer_pairs_are_the_oracles_bits(data) -> None:
    lt, rt = data.draw(st.sampled_from(_PAIRS))
    m, k, n, g = 7, 33, 5, 3
    sizes = data.draw(_group_sizes(m, g))
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    lo = {"int8": -128, "uint8": 0, "int4": -8, "uint4": 0}
    hi = {"int8": 127, "uint8": 255, "int4": 7, "uint4": 15}
    x = rng.integers(lo[lt], hi[lt] + 1, (m, k)).astype(ml_dtypes.__dict__.get(lt, lt))
    w = rng.integers(lo[rt], hi[rt] + 1, (g, k, n)).astype(ml_dtypes.__dict__.get(rt, rt))
    got = _INT_RUN(jnp.asarray(x), jnp.asarray(w), jnp.array(sizes))
    want = reference.ragged_dot(x, w, sizes, "int32")
    np.testing.assert_array_equal(np.asarray(got), want)


@given(st.data())
def test_float8_pairs_are_within_the_bound_of_each_rows_group(data) -> None:
    m, k, n, g = 6, 40, 4, 3
    sizes = data.draw(_group_sizes(m, g))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.normal(size=(m, k)).astype(ml_dtypes.float8_e4m3fn)
    w = (rng.normal(size=(g, k, n)) * 2.0 ** rng.integers(-6, 6, (g, 1, n))).astype(
        ml_dtypes.float8_e5m2
    )
    got = np.asarray(_F32_RUN(jnp.asarray(x), jnp.asarray(w), jnp.array(sizes)))
    exact = _exact_rows(x, w, sizes)
    gid = np.repeat(np.arange(g + 1), [*sizes, m - sum(sizes)])
    dn = (((1,), (0,)), ((), ()))
    for i in range(m):
        if gid[i] == g:
            assert (got[i] == 0).all()
            continue
        bound = bounds.dot_general_bound(x[i : i + 1], w[gid[i]], dn)[0]
        assert (np.abs(got[i] - exact[i]) <= bound).all()


def _exact_rows(x, w, sizes) -> np.ndarray:
    """The exact value (float64 of the oracle's Fractions) of each row against its group's
    matrix; zeros after the last group."""
    out = np.zeros((x.shape[0], w.shape[2]))
    start = 0
    for j, size in enumerate(sizes):
        rows = x[start : start + size]
        exact = reference.exact_dot_general(rows, w[j], (((1,), (0,)), ((), ())))
        out[start : start + size] = exact.astype(np.float64)
        start += size
    return out


def _stacked(scheme, e, k, n, seed):
    w = jax.random.normal(jax.random.key(seed), (e, k, n))
    return emulate.quantize(w, scheme, axis=1)


# MXFP4 under EMULATE_LONG_TESTS=1: stacked MXFP4 experts run by default in
# test_rows_stored_k_by_m_run_with_each_rows_own_expert[MXFP4-cpu] and (from GGUF) in
# test_stacked_gguf_experts_are_each_rows_own_expert[MXFP4].
@pytest.mark.parametrize(
    "scheme", [pytest.param("MXFP4", marks=pytest.mark.long), "INT4_G128", "MXFP6_E2M3"]
)
def test_stacked_qarray_experts_are_each_rows_own_expert(scheme) -> None:
    q = _stacked(getattr(emulate.mx, scheme), 4, 64, 16, 1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 64)).astype(ml_dtypes.bfloat16)
    sizes = [2, 0, 7, 0]
    got = np.asarray(emulate.ragged_dot(jnp.asarray(x), q, jnp.array(sizes), target="tpu_v5e"))
    values = np.asarray(q.dequantize(jnp.float32))  # exact: every code times its scale
    exact = _exact_rows(x, values, sizes)
    gid = np.repeat(np.arange(4), sizes)
    for i in range(9):
        bound = bounds.dot_general_bound(
            x[i : i + 1], values[gid[i]], (((1,), (0,)), ((), ())), extra_terms=68
        )[0]
        assert (np.abs(got[i] - exact[i]) <= bound).all()
    assert got.dtype == np.float32


def test_a_packed_lhs_gives_the_unpacked_lhs_bits() -> None:
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.integers(-8, 8, (6, 32)).astype(ml_dtypes.int4))
    w = jnp.asarray(rng.integers(-128, 128, (2, 32, 8)).astype(np.int8))
    gs = jnp.array([4, 2])
    want = emulate.ragged_dot(x, w, gs, preferred_element_type=jnp.int32, target="tpu_v2")
    got = emulate.ragged_dot(
        emulate.pack(x, axis=1), w, gs, preferred_element_type=jnp.int32, target="tpu_v2"
    )
    _same(got, want)


def test_traced_group_sizes_give_the_eager_bits() -> None:
    rng = np.random.default_rng(4)
    x, w = _halves(rng, (8, 16), E4), _halves(rng, (3, 16, 4), E4)
    run = jax.jit(lambda a, b, s: emulate.ragged_dot(a, b, s, target="tpu_v4"))
    for sizes in ([0, 8, 0], [3, 0, 2], [1, 2, 5]):
        gs = jnp.array(sizes)
        _same(run(x, w, gs), emulate.ragged_dot(x, w, gs, target="tpu_v4"))
    assert (np.asarray(run(x, w, jnp.array([3, 0, 2]))[5:]).astype(np.float32) == 0).all()


def test_gradients_reach_the_lhs_as_jaxs() -> None:
    rng = np.random.default_rng(5)
    x, w = _halves(rng, (8, 16), jnp.bfloat16), _halves(rng, (3, 16, 4), E4)
    gs = jnp.array([3, 0, 5])

    def loss(fn, a, b):
        return jnp.sum(fn(a, b, gs, preferred_element_type=jnp.float32) ** 2)

    got = jax.grad(lambda a: loss(emulate.ragged_dot, a, w))(x)
    want = jax.grad(lambda a: loss(lax.ragged_dot, a, w.astype(jnp.bfloat16)))(x)
    _same(got, want)


@pytest.mark.parametrize(
    ("call", "kind", "message"),
    [
        (
            lambda x, w: emulate.ragged_dot(x, w, jnp.array([4, -3])),
            ValueError,
            "group_sizes: sizes must be >= 0 (the rows of each group), got [4, -3]",
        ),
        (
            lambda x, w: emulate.ragged_dot(
                x.astype(jnp.float32), w.astype(jnp.float32), jnp.array([-1, 3])
            ),
            ValueError,
            "group_sizes: sizes must be >= 0 (the rows of each group), got [-1, 3]",
        ),
        (
            lambda x, w: emulate.ragged_dot(x, w, jnp.array([1, 1]), group_offset=jnp.array([1])),
            NotImplementedError,
            "group_offset: not supported (jax.lax.ragged_dot_general fails on it too); pass None",
        ),
    ],
)
def test_bad_calls_name_the_argument(call, kind, message) -> None:
    x, w = jnp.ones((6, 4), E4), jnp.ones((2, 4, 3), E4)
    with pytest.raises(kind) as e:
        call(x, w)
    assert str(e.value) == message


@pytest.mark.parametrize("sizes", [[2, 1], [3, 3], [0, 9], [6, 6]])
def test_any_total_of_group_sizes_gives_jaxs_bits(sizes) -> None:
    # jax 0.10.2 accepts totals below and above the rows: fewer leave the last rows zero,
    # more cut the groups at the last row ([3, 3] over 4 rows: row 3 in group 1)
    rng = np.random.default_rng(sum(sizes))
    x, w = _halves(rng, (4, 8), jnp.float32), _halves(rng, (2, 8, 3), jnp.float32)
    gs = jnp.array(sizes, jnp.int32)
    want = lax.ragged_dot(x, w, gs)
    _same(
        emulate.ragged_dot(x.astype(E4), w.astype(E4), gs, preferred_element_type=jnp.float32), want
    )
    _same(emulate.ragged_dot(x, w, gs, target="tpu_v2"), want)


def test_polyfill_leaves_no_ragged_dot_the_target_lacks_and_inspect_lists_it() -> None:
    x, w, gs = jnp.ones((6, 4), E4), jnp.ones((2, 4, 3), E4), jnp.array([2, 4])
    jaxpr = jax.make_jaxpr(emulate.polyfill(lax.ragged_dot, target="tpu_v2"))(x, w, gs)
    pairs = {(s.primitive, s.lhs_dtype, s.rhs_dtype) for s in program.sites(jaxpr)}
    assert pairs == {("dot_general", "float32", "float32")}
    rows = emulate.inspect(lax.ragged_dot, x, w, gs, target="tpu_v2").rows
    assert [(r.primitive, r.lhs, r.rhs, r.status, r.flops) for r in rows] == [
        ("ragged_dot_general", "float8_e4m3fn[6,4]", "float8_e4m3fn[2,4,3]", "emulated", 144)
    ]
    b = jnp.ones((6, 4), jnp.bfloat16), jnp.ones((2, 4, 3), jnp.bfloat16)
    assert [r.status for r in emulate.inspect(lax.ragged_dot, *b, gs, target="tpu_v4").rows] == [
        "native"
    ]
    drop_in = emulate.inspect(
        lambda a, c, s: emulate.ragged_dot(a, c, s), x, w, gs, target="tpu_v2"
    )
    assert [(r.primitive, r.status, r.flops) for r in drop_in.rows] == [
        ("ragged_dot_general", "emulated", 144)
    ]


def test_vmap_over_lhs_rhs_and_group_sizes_gives_jaxs_bits() -> None:
    # JAX's test_ragged_dot_general_vmap (same file and commit): batch 3, m = k = n = 128,
    # 2 groups; float8 operands of halves, so every sum is exact.
    rng = np.random.default_rng(6)
    x, w = _halves(rng, (3, 128, 128), E4), _halves(rng, (3, 2, 128, 128), E4)
    gs = jnp.array([[100, 28], [0, 128], [64, 60]], jnp.int32)

    def run(fn, a, b, s):
        return fn(a, b, s, preferred_element_type=jnp.float32)

    got = jax.vmap(functools.partial(run, functools.partial(emulate.ragged_dot, target="tpu_v4")))(
        x, w, gs
    )
    want = jax.vmap(functools.partial(run, lax.ragged_dot))(
        x.astype(jnp.float32), w.astype(jnp.float32), gs
    )
    _same(got, want)


def test_gradients_reach_a_float_rhs_as_jaxs() -> None:
    rng = np.random.default_rng(8)
    x, w = _halves(rng, (8, 16), E5), _halves(rng, (3, 16, 4), jnp.float32)
    gs = jnp.array([2, 6, 0])
    got = jax.grad(lambda b: jnp.sum(emulate.ragged_dot(x, b, gs, target="tpu_v4") ** 2))(w)
    want = jax.grad(lambda b: jnp.sum(lax.ragged_dot(x.astype(jnp.float32), b, gs) ** 2))(w)
    _same(got, want)


@pytest.mark.parametrize("ggml_type", ["Q5_1", "MXFP4"])  # offsets; e8m0 scales
def test_stacked_gguf_experts_are_each_rows_own_expert(tmp_path, ggml_type) -> None:
    # 3-D GGUF expert tensors (E, out, in), contracted on their last axis; the oracle is
    # gguf's own decoder.
    rng = np.random.default_rng(9)
    e, n, k = 3, 8, 256
    t = gguf.GGMLQuantizationType[ggml_type]
    raw = gguf.quants.quantize(rng.normal(size=(e * n, k)).astype(np.float32), t)
    raw = raw.reshape(e, n, -1)
    writer = gguf.GGUFWriter(str(tmp_path / "e.gguf"), "llama")
    writer.add_tensor("blk.0.ffn_up_exps.weight", raw, raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    q = emulate.importers.load_gguf(tmp_path / "e.gguf")["blk.0.ffn_up_exps.weight"]
    assert q.shape == (e, n, k)
    values = gguf.quants.dequantize(raw, t).astype(np.float32)
    x = rng.normal(size=(6, k)).astype(ml_dtypes.bfloat16)
    sizes = [2, 0, 3]
    rdn = _rdn((([1], [2]), ([], [])), [0], [0])
    got = np.asarray(
        emulate.ragged_dot_general(jnp.asarray(x), q, jnp.array(sizes), rdn, target="tpu_v5e",
                                   preferred_element_type=jnp.float32)
    )  # fmt: skip
    exact = _exact_rows(x, np.swapaxes(values, 1, 2), sizes)
    gid = np.repeat(np.arange(e + 1), [*sizes, 6 - sum(sizes)])
    dn = (((1,), (0,)), ((), ()))
    for i in range(6):
        if gid[i] == e:
            assert (got[i] == 0).all()
            continue
        bound = bounds.dot_general_bound(
            x[i : i + 1], values[gid[i]].T, dn, extra_terms=k // 32 + 4
        )
        assert (np.abs(got[i] - exact[i]) <= bound[0]).all()


def test_polyfill_rewrites_ragged_dots_inside_jit_and_scan() -> None:
    rng = np.random.default_rng(10)
    x, w = _halves(rng, (4, 6, 8), E4), _halves(rng, (3, 8, 5), E4)
    gs = jnp.array([2, 0, 4])

    def body(carry, xi):
        y = lax.ragged_dot(xi, w, gs, preferred_element_type=jnp.float32)
        return carry + y.sum(), y

    f = jax.jit(lambda xs: lax.scan(body, jnp.float32(0), xs))
    pf = emulate.polyfill(f, target="tpu_v2")
    left = {(s.primitive, s.lhs_dtype) for s in program.sites(jax.make_jaxpr(pf)(x))}
    assert left == {("dot_general", "float32")}
    got, want = pf(x), f(x.astype(jnp.float32))  # halves: exact sums, equal bits
    _same(got[1], want[1])
    _same(got[0], want[0])


# --- the grouped kernel route: emulate.pallas.ragged_dot through emulate.routing ------------
# On a TPU target the drop-ins (and polyfill) send stacked experts to the grouped kernel;
# here it runs in Pallas' interpret mode (use_route("interpret")) on one small MoE shape,
# shared by the tests below, checked against the float64 oracle and mode "fast"'s bound.

RK, RN, RM, RE = 256, 128, 16, 3
TPU = "tpu_v5e"
_R = np.random.default_rng(39)
RX = jnp.asarray(_R.standard_normal((RM, RK)), jnp.bfloat16)
RW = _R.standard_normal((RE, RK, RN)).astype(np.float32)
#: int8 codes, a float16 scale per 32 rows of K and column, per expert
RQ = emulate.quantize(RW, "int8", block_shape=32, axis=1, scale_fmt="float16")
#: gpt-oss's scheme: e2m1 codes packed along K, an e8m0 scale per 32 rows of K
_MX_CODES = _R.integers(0, 16, (RE, RK, RN)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
_MX_EXP = _R.integers(-2, 3, (RE, RK // 32, RN))
RMX = emulate.QArray.from_parts(
    emulate.pack(_MX_CODES, axis=1),
    jnp.asarray(np.ldexp(1.0, _MX_EXP).astype(ml_dtypes.float8_e8m0fnu)),
    block_shape=(1, 32, 1),
)
GS = jnp.array([5, 0, 9], jnp.int32)  # expert 1 routed nothing; the last 2 rows no expert
GS_OVER = jnp.array([9, 0, 12], jnp.int32)  # 21 > 16 rows: the last group cut, as in JAX
BASIC = lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (0,), (0,))


def _values(q: emulate.QArray) -> np.ndarray:
    """The experts' values by the oracle (numpy + ml_dtypes), float64."""
    return reference.dequantize(
        np.asarray(q.codes), np.asarray(q.scales).astype(np.float32), q.block_shape
    ).astype(np.float64)


def _assert_routed_within_bound(y, q: emulate.QArray, sizes) -> None:
    """Each row within gamma_(K + S + 4) of its own expert's exact product; rows in no
    group zero."""
    x = np.asarray(RX.astype(jnp.float32), np.float64)
    w = _values(q)
    ends = np.minimum(np.cumsum(sizes), RM)
    gid = np.searchsorted(ends, np.arange(RM), side="right")
    got = np.asarray(y, np.float64)
    assert y.shape == (RM, RN) and y.dtype == jnp.float32
    dn = (((1,), (0,)), ((), ()))
    for i in range(RM):
        if gid[i] == RE:
            assert (got[i] == 0).all()
            continue
        bound = bounds.dot_general_bound(x[i : i + 1], w[gid[i]], dn, extra_terms=RK // 32 + 4)
        assert (np.abs(got[i] - x[i] @ w[gid[i]]) <= bound[0]).all()


@pytest.fixture(scope="module")
def routed() -> dict:
    """Each front end's result on the grouped kernel route (interpret mode: one kernel
    program, replayed for each call), and the XLA route's result of the first."""
    with emulate.target(TPU):
        with emulate.use_route("interpret"):
            out = {
                "ragged_dot": emulate.ragged_dot(RX, RQ, GS),
                "general": emulate.ragged_dot_general(RX, RQ, GS, BASIC),
                "over": emulate.ragged_dot(RX, RQ, GS_OVER),
            }
        with emulate.use_route("xla"):
            out["xla"] = emulate.ragged_dot(RX, RQ, GS)
    return out


@pytest.mark.parametrize("front_end", ["ragged_dot", "general", "over", "xla"])
def test_stacked_experts_take_the_grouped_kernel_within_the_bound(routed, front_end):
    sizes = GS_OVER if front_end == "over" else GS
    _assert_routed_within_bound(routed[front_end], RQ, np.asarray(sizes))


def test_an_exact_pair_through_polyfill_is_the_integers_bits():
    rng = np.random.default_rng(8)
    a = jnp.asarray(rng.integers(-128, 128, (RM, RK)), jnp.int8)
    b = jnp.asarray(rng.integers(-128, 128, (RE, RK, RN)), jnp.int8)
    fn = emulate.polyfill(
        lambda a, b, g: lax.ragged_dot(a, b, g, preferred_element_type=jnp.int32),
        target="tpu_v4",  # int8 x int8 is emulated there
    )
    route = emulate.ragged_dot_route(a, b, GS, target="tpu_v4", preferred_element_type=jnp.int32)
    assert route.label() == "pallas.ragged_dot"
    with emulate.use_route("interpret"):
        got = fn(a, b, GS)
    ints = np.zeros((RM, RN), np.int64)
    ints[:5] = np.asarray(a[:5], np.int64) @ np.asarray(b[0], np.int64)
    ints[5:14] = np.asarray(a[5:14], np.int64) @ np.asarray(b[2], np.int64)
    assert got.dtype == jnp.int32  # the XLA route's exact sums (test_jax_cases...): its bits
    assert np.array_equal(np.asarray(got), ints)


def _jaxpr(route: str, target: str = TPU) -> str:
    with emulate.target(target), emulate.use_route(route):
        return str(jax.make_jaxpr(lambda x, q, g: emulate.ragged_dot(x, q, g))(RX, RQ, GS))


def test_the_cpu_keeps_its_route_and_kernel_puts_the_kernel_in_the_tpu_branch(routed):
    # "auto" leaves the kernel out where no TPU can lower the program (this host), a CPU
    # target never routes; "kernel" puts it in lax.platform_dependent's TPU branch, and
    # this CPU runs the XLA branch: the XLA route's bits
    assert "pallas_call" not in _jaxpr("auto") and "pallas_call" not in _jaxpr("auto", "cpu")
    kernel = _jaxpr("kernel")
    assert kernel.count("pallas_call") == 1 and "platform_index" in kernel
    with emulate.target(TPU), emulate.use_route("kernel"):
        _same(emulate.ragged_dot(RX, RQ, GS), routed["xla"])
    with emulate.use_route("kernel"), pytest.raises(ValueError, match=r"^target: route 'kern"):
        emulate.ragged_dot(RX, RQ, GS, target="cpu")


def test_gradients_reach_the_rows_and_vmap_maps_the_kernel(routed):
    # the routed program's custom_jvp: the backward pass is the XLA route's (it never runs
    # the kernel); vmap runs the kernel once per batch entry (lax.map)
    def loss(x):
        return emulate.ragged_dot(x, RQ, GS).sum()

    xs = jnp.stack([RX, -RX])
    with emulate.target(TPU), emulate.use_route("kernel"):
        g = jax.grad(loss)(RX)
        mapped = jax.vmap(lambda x: emulate.ragged_dot(x, RQ, GS))(xs)
        jaxpr = str(jax.make_jaxpr(jax.vmap(lambda x: emulate.ragged_dot(x, RQ, GS)))(xs))
    w = _values(RQ).sum(axis=2)  # d/dx of the row sums: each row its expert's row sums
    want = np.zeros((RM, RK))
    want[:5], want[5:14] = w[0], w[2]
    assert g.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(g), np.asarray(jnp.asarray(want, jnp.bfloat16)))
    assert jaxpr.count("pallas_call") == 1 and "scan" in jaxpr
    # negated rows give negated sums, and +0 (an accumulator starts at +0) where no group
    _same(mapped, jnp.stack([routed["xla"], 0.0 - routed["xla"]]))


#: scale blocks of 32 columns: the grouped kernel does not take them
ALONG_N = emulate.quantize(RW, "int8", block_shape=32, axis=2)


def test_experts_the_kernel_refuses_keep_the_xla_route_and_say_why():
    r = emulate.ragged_dot_route(RX, ALONG_N, GS, target=TPU)
    assert (r.route, r.weight, r.kernel_name) == ("xla", "rhs", "emulate.pallas.ragged_dot")
    assert r.reason.startswith(
        "emulate.pallas.ragged_dot refuses it: w: emulate.pallas.matmul does not decode "
        "blocks of 32 columns in the kernel"
    )
    with emulate.use_route("kernel"), pytest.raises(ValueError) as e:
        emulate.ragged_dot(RX, ALONG_N, GS, target=TPU)
    assert str(e.value).startswith(
        "rhs: route 'kernel' asks for emulate.pallas.ragged_dot, which cannot take this call: "
        "emulate.pallas.ragged_dot refuses it: w: emulate.pallas.matmul does not decode"
    )
    # GGUF's (E, out, in) experts, contracted on their last axis: not as the kernel reads
    enk = lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), (0,), (0,))
    t = emulate.ragged_dot_route(
        RX, emulate.quantized.array.transpose(RQ, (0, 2, 1)), GS, enk, target=TPU
    )
    assert t.route == "xla" and t.reason == (
        "experts of shape (3, 128, 256) grouped along axis 0 contracting along axis (2,): the "
        "grouped kernel reads (G, K, N) experts as stored (store them so once, e.g. "
        "emulate.quantized.array.transpose(w, (0, 2, 1)) for (E, out, in) checkpoint tensors)"
    )
    assert emulate.ragged_dot_route(RX, RW, GS, target=TPU) is None  # f32 experts: no weight


def test_explain_and_inspect_say_which_route_each_grouped_matmul_took():
    r = emulate.ragged_dot_route(RX, RQ, GS, target=TPU)
    assert r.explain() == (
        "route on tpu_v5e (setting 'auto'): pallas.ragged_dot\n"
        "  rhs read as stored by emulate.pallas.ragged_dot where the program is lowered for "
        "a TPU; the XLA route elsewhere"
    )
    report = emulate.inspect(
        lambda x, a, b, g: (emulate.ragged_dot(x, a, g), emulate.ragged_dot(x, b, g)),
        RX, RQ, ALONG_N, GS, target=TPU,
    )  # fmt: skip
    routes = [row.weight_route for row in report.rows if row.primitive == "ragged_dot_general"]
    assert routes[0] == "pallas.ragged_dot"
    assert routes[1].startswith("xla: emulate.pallas.ragged_dot refuses it: w: emulate.pallas")


def test_prepare_weights_prepares_stacked_experts_once_and_reads_them_back(routed):
    tree = emulate.prepare_weights({"e": RQ, "w": RQ[0]}, target=TPU)
    assert isinstance(tree["e"], emulate.pallas.KernelQWeight)
    assert isinstance(tree["w"], emulate.pallas.KernelQWeight)
    assert jax.tree.leaves(tree["e"])[0].shape[0] == RE  # stacked: one expert a row
    assert emulate.prepare_weights(RQ, target=TPU, experts=False) is RQ  # the flax layers'
    assert emulate.prepare_weights(RQ, target="cpu") is RQ
    assert emulate.prepare_weights(ALONG_N, target=TPU) is ALONG_N  # the kernel refuses it
    back = emulate.routing.unprepared(tree["e"])  # what the XLA route reads
    assert (back.shape, back.block_shape) == (RQ.shape, RQ.block_shape)
    assert np.array_equal(np.asarray(back.codes), np.asarray(RQ.codes))
    _same(back.scales, RQ.scales)
    packed = emulate.prepare_weights(RMX, target=TPU)  # e2m1 codes: packed back as stored
    assert np.array_equal(np.asarray(emulate.routing.unprepared(packed).codes.data),
                          np.asarray(RMX.codes.data))  # fmt: skip
    with emulate.target(TPU), emulate.use_route("xla"):
        _same(emulate.ragged_dot(RX, tree["e"], GS), routed["xla"])


@pytest.mark.parametrize(
    ("dtype", "pet"), [(np.bool_, None), (np.complex64, None), (np.float32, jnp.int32)]
)
def test_route_queries_answer_none_for_calls_the_front_end_hands_to_jax(dtype, pet):
    # issue 49's sweep: the queries ran the validator of emulated calls on calls the front
    # end hands to lax as they are, and refused what the front end computes
    x, w = np.ones((4, 8), dtype), np.ones((2, 8, 3), dtype)
    gs = np.array([1, 3], np.int32)
    assert emulate.ragged_dot(x, w, gs, preferred_element_type=pet).shape == (4, 3)
    assert emulate.ragged_dot_route(x, w, gs, preferred_element_type=pet, target=TPU) is None
    dn = (((1,), (0,)), ((), ()))
    assert emulate.weight_route(x, w[0], dn, preferred_element_type=pet, target=TPU) is None
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, w, gs)]
    assert emulate.ragged_dot_route(*abstract, preferred_element_type=pet, target=TPU) is None
    with pytest.raises(TypeError, match=r"^lhs, rhs, group_sizes, ragged_dot_dimension_numb"):
        emulate.ragged_dot_route(x, w[:, :4], gs, preferred_element_type=pet)  # lax's rule
    for a, b in ((x.tolist(), w), (x, w.tolist())):  # lax's TypeError, as the call's (was
        # a TracerArrayConversionError: the query traced the list's numbers)
        with pytest.raises(TypeError, match=r"^Error interpreting argument to ragged_dot_gen"):
            emulate.ragged_dot(a, b, gs, preferred_element_type=pet)
        with pytest.raises(TypeError, match=r"^Error interpreting argument to ragged_dot_gen"):
            emulate.ragged_dot_route(a, b, gs, preferred_element_type=pet)


def test_ragged_dot_route_refuses_negative_group_sizes_as_the_call_does():
    # issue 49's sweep: traced by the query, concrete sizes were never checked
    sizes = np.array([-1, 20, 0], np.int32)
    msg = r"^group_sizes: sizes must be >= 0 \(the rows of each group\), got \[-1, 20, 0\]$"
    with pytest.raises(ValueError, match=msg):
        emulate.ragged_dot(RX, RQ, sizes, target=TPU)
    with pytest.raises(ValueError, match=msg):
        emulate.ragged_dot_route(RX, RQ, sizes, target=TPU)


@pytest.mark.parametrize("experts", ["no", None, 0, 1])
def test_prepare_weights_refuses_experts_that_is_no_bool(experts):
    # issue 49's sweep: any object was read for its truth, so experts="no" prepared them
    with pytest.raises(TypeError) as e:
        emulate.prepare_weights(RQ, target=TPU, experts=experts)
    assert str(e.value) == (
        "experts: expected a bool (True: prepare stacked (E, K, N) experts too), got "
        f"{type(experts).__name__} {experts!r}"
    )


def test_prepare_weights_returns_experts_the_grouped_kernel_refuses_unchanged():
    # issue 49: int8 per-channel experts became a KernelQWeight the grouped kernel then
    # refused; docs/porting.md: forms the kernel does not take come back unchanged
    per_channel = emulate.quantize(RW[:, :32, :8], "int8", axis=1)
    assert emulate.prepare_weights({"e": per_channel}, target=TPU)["e"] is per_channel
    with pytest.raises(NotImplementedError) as e:
        emulate.pallas.prepare_experts(per_channel)
    assert str(e.value) == (
        "w: QArray experts with scales constant along K are not built in the grouped kernel "
        "(built: codes with scales along K, zero points, offsets and two-level scales; module "
        "emulate.pallas.gmm_kernel); use emulate.ragged_dot"
    )


@pytest.mark.parametrize("dtype", [jnp.float32, E4])
def test_a_list_of_group_sizes_is_an_array_on_every_route(dtype):
    # issue 49: the plain pass-through handed the list to lax, which refuses it, while the
    # emulated routes took it; a list is now the array of its sizes on both
    x, w = (
        _halves(np.random.default_rng(5), (6, 4), dtype),
        _halves(np.random.default_rng(6), (2, 4, 3), dtype),
    )
    want = emulate.ragged_dot(x, w, jnp.array([2, 3], jnp.int32))
    if dtype == jnp.float32:
        _same(want, lax.ragged_dot(x, w, jnp.array([2, 3], jnp.int32)))
    _same(emulate.ragged_dot(x, w, [2, 3]), want)
    _same(emulate.ragged_dot(x, w, (2, 3)), want)


# Rows stored (K, M): contracting axis 0, ragged axis 1. The XLA route's dense dot met
# XLA:CPU's "Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"
# (emulate.engine.layout.dot_general), on the CPU target and tpu_v5e alike.
KM = _rdn((((0,), (1,)), ((), ())), (1,), (0,))


@pytest.mark.parametrize(("experts", "target"), [("float8_e4m3fn", "tpu_v5e"), ("MXFP4", "cpu")])
def test_rows_stored_k_by_m_run_with_each_rows_own_expert(experts, target) -> None:
    rng = np.random.default_rng(3)
    x = _halves(rng, (32, 6), jnp.bfloat16)
    if experts == "MXFP4":
        codes = rng.integers(0, 16, (2, 32, 8)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
        scales = np.ldexp(1.0, rng.integers(-2, 3, (2, 1, 8))).astype(ml_dtypes.float8_e8m0fnu)
        w = emulate.QArray.from_parts(
            emulate.pack(codes, axis=1), jnp.asarray(scales), block_shape=(1, 32, 1)
        )
        values = np.asarray(w.dequantize(jnp.float32), np.float64)
    else:
        w = _halves(rng, (2, 32, 8), E4)
        values = np.asarray(w, np.float64)
    got = emulate.ragged_dot_general(x, w, jnp.array([2, 4]), KM, target=target)
    xv = np.asarray(x, np.float64)
    want = np.concatenate([xv[:, :2].T @ values[0], xv[:, 2:].T @ values[1]])  # exact sums
    out = np.float32 if experts == "MXFP4" else ml_dtypes.bfloat16  # a QArray's: f32
    assert got.dtype == out
    np.testing.assert_array_equal(np.asarray(got), want.astype(out))
