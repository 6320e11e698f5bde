"""emulate.ragged_dot / ragged_dot_general: JAX's own cases, the oracle, stacked QArrays,
polyfill and inspect."""

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


@pytest.mark.parametrize("scheme", ["MXFP4", "INT4_G128", "MXFP6_E2M3"])
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
            lambda x, w: emulate.ragged_dot(x, w, jnp.array([4, 3])),
            ValueError,
            "group_sizes: the groups hold 7 rows in all, but lhs's ragged dimension 0 has only "
            "6; group_sizes [4, 3] must sum to at most 6",
        ),
        (
            lambda x, w: emulate.ragged_dot(
                x.astype(jnp.float32), w.astype(jnp.float32), jnp.array([4, 3])
            ),
            ValueError,
            "group_sizes: the groups hold 7 rows in all, but lhs's ragged dimension 0 has only "
            "6; group_sizes [4, 3] must sum to at most 6",
        ),
        (
            lambda x, w: emulate.ragged_dot(x, w, jnp.array([1, 1]), group_offset=jnp.array([1])),
            NotImplementedError,
            "group_offset: not supported (jax.lax.ragged_dot_general raises "
            "NotImplementedError for it too); pass None",
        ),
    ],
)
def test_bad_calls_name_the_argument(call, kind, message) -> None:
    x, w = jnp.ones((6, 4), E4), jnp.ones((2, 4, 3), E4)
    with pytest.raises(kind) as e:
        call(x, w)
    assert str(e.value) == message


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
