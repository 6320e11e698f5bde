"""emulate.pallas.ragged_dot: the grouped kernel's schedule, its results in interpret mode
against the oracle (:func:`emulate.reference.ragged_dot`), its refusals, and the real TPU
compiler (compile-only) with Mosaic's compatibility mode on and off."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import bounds, reference
from emulate.pallas import gmm_kernel

M, K, N, G = 50, 200, 130, 4
BLOCKS = (16, 128, 128)  # bm, bn, bk: groups share row tiles; K and N have partial blocks
INT8_BLOCKS = (32, 128, 128)  # int8 rows tile by 32


def _visits(sizes: list[int], m: int, bm: int) -> list[tuple[int, int]]:
    """Brute force: every (group, row tile) where the group has a row, groups in order."""
    out, start = [], 0
    for g, size in enumerate(sizes):
        tiles = sorted({row // bm for row in range(start, start + size)})
        out += [(g, t) for t in tiles]
        start += size
    return out


_SCHEDULE = jax.jit(gmm_kernel.schedule, static_argnums=(1, 2))


@given(st.lists(st.integers(0, 16), min_size=4, max_size=4), st.sampled_from([8, 16, 32]))
def test_the_schedule_visits_each_routed_group_on_its_row_tiles_only(sizes, bm) -> None:
    m = 70  # the sizes sum to at most 64: rows are left over
    group, tile, count, starts, ends = (np.asarray(a) for a in _SCHEDULE(jnp.array(sizes), m, bm))
    want = _visits(sizes, m, bm)
    assert len(group) == -(-m // bm) + len(sizes) - 1 >= len(want)
    assert int(count[0]) == len(want)
    assert list(zip(group[: len(want)].tolist(), tile[: len(want)].tolist())) == want
    if want:  # past the count: the last visit again (no new copy, nothing stored)
        assert set(zip(group[len(want) :].tolist(), tile[len(want) :].tolist())) <= {want[-1]}
    assert (ends - starts).tolist() == sizes and ends.tolist() == np.cumsum(sizes).tolist()


@pytest.mark.parametrize(
    "sizes", [[4, 4, 4, 4, 0, 0, 0, 0], [0, 0, 16, 0, 0, 0, 0, 0], [300, 0, 500, 1248, 0, 0, 0, 0]]
)
def test_each_routed_expert_is_read_once_per_row_tile_of_its_rows_and_no_other(sizes) -> None:
    m = max(16, sum(sizes))
    bm, bn, bk = 256, 256, 512
    got = gmm_kernel.weight_fetches(sizes, m, 2048, 1024, (bm, bn, bk))
    want, start = [], 0
    for j in range(1024 // bn):  # column blocks outermost, then groups in order, then K
        start = 0
        for e, size in enumerate(sizes):
            tiles = len({row // bm for row in range(start, start + size)})
            want += [(e, kb, j) for _ in range(tiles) for kb in range(2048 // bk)]
            start += size
    assert got == want
    if sum(sizes) <= bm:  # a decode step: each routed expert's blocks exactly once
        assert len(got) == len(set(got)) == sum(map(bool, sizes)) * (2048 // bk) * (1024 // bn)


_INT8 = jax.jit(
    lambda x, w, s, target: gmm_kernel.ragged_dot(
        x, w, s, target=target, out_dtype=jnp.int32, block_shape=INT8_BLOCKS, interpret=True
    ),
    static_argnames="target",
)
_SIZES = st.lists(st.integers(0, M), min_size=G, max_size=G).filter(lambda s: sum(s) <= M)


@pytest.mark.parametrize("target", ["tpu_v5e", "tpu_v2"])
@settings(max_examples=examples(2, 6), deadline=None)
@given(sizes=_SIZES, seed=st.integers(0, 99))
def test_int8_experts_are_the_oracles_bits(target, sizes, seed) -> None:
    # v5e: int8 x int8 natively (int32 sum); v2: f32 dots in exact chunks. Group sizes
    # traced: one compile a target, whatever the sizes (empty groups, rows left over);
    # each example runs the kernel in interpret mode (about 1 s): two a target by default,
    # six under EMULATE_LONG_TESTS=1.
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (M, K)).astype(np.int8)
    w = rng.integers(-128, 128, (G, K, N)).astype(np.int8)
    got = _INT8(jnp.asarray(x), jnp.asarray(w), jnp.array(sizes), target)
    np.testing.assert_array_equal(np.asarray(got), reference.ragged_dot(x, w, sizes, "int32"))


# By default one routing (an empty group, rows left over); all rows to one expert and every
# row routed under EMULATE_LONG_TESTS=1: test_int8_experts_are_the_oracles_bits draws the
# group sizes by default (a runtime array: the schedule is the same for every dtype).
@pytest.mark.parametrize(
    "sizes",
    [
        [10, 0, 25, 10],
        pytest.param([0, 0, M, 0], marks=pytest.mark.long),
        pytest.param([16, 16, 0, 18], marks=pytest.mark.long),
    ],
)
def test_float8_experts_are_within_each_rows_bound(sizes) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(M, K)).astype(ml_dtypes.bfloat16)
    w = rng.normal(size=(G, K, N)).astype(ml_dtypes.float8_e4m3fn)
    got = np.asarray(
        gmm_kernel.ragged_dot(
            jnp.asarray(x), jnp.asarray(w), jnp.array(sizes), target="tpu_v5e",
            out_dtype=jnp.float32, block_shape=BLOCKS, interpret=True,
        )
    )  # fmt: skip
    start = 0
    dn = (((1,), (0,)), ((), ()))
    for g, size in enumerate(sizes):
        rows = slice(start, start + size)
        exact = reference.exact_dot_general(x[rows], w[g], dn).astype(np.float64)
        assert (np.abs(got[rows] - exact) <= bounds.dot_general_bound(x[rows], w[g], dn)).all()
        start += size
    assert (got[start:] == 0).all()


def test_it_agrees_with_the_xla_route_of_emulate_ragged_dot() -> None:
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.integers(-8, 8, (M, K)).astype(np.float32), jnp.bfloat16)
    w = jnp.asarray(rng.integers(-128, 128, (G, K, N)).astype(np.int8))
    gs = jnp.array([7, 30, 0, 13])
    kernel = gmm_kernel.ragged_dot(x, w, gs, target="tpu_v4", block_shape=BLOCKS, interpret=True)
    xla = emulate.ragged_dot(x, w, gs, target="tpu_v4")
    assert kernel.dtype == xla.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(kernel, np.float32), np.asarray(xla, np.float32))


@pytest.mark.parametrize(
    ("w", "kind", "start"),
    [
        (jnp.ones((K, 8), jnp.int8), ValueError, "w: expected (G, K, N) experts, got shape"),
    ],
)
def test_experts_that_are_not_stacked_are_refused(w, kind, start) -> None:
    with pytest.raises(kind) as e:
        gmm_kernel.ragged_dot(
            jnp.ones((M, K), jnp.bfloat16), w, jnp.ones(G, jnp.int32), target="tpu_v5e"
        )
    assert str(e.value).startswith(start)


def test_bad_calls_name_the_argument() -> None:
    x, w = jnp.ones((M, K), jnp.bfloat16), jnp.ones((G, K, N), jnp.int8)
    with pytest.raises(ValueError, match=r"^target: a TPU kernel, and the target is cpu"):
        gmm_kernel.ragged_dot(x, w, jnp.ones(G, jnp.int32), target="cpu")
    with pytest.raises(ValueError, match=r"^group_sizes: sizes must be >= 0 \(the rows of"):
        gmm_kernel.ragged_dot(x, w, jnp.array([20, -20, 10, 10]), target="tpu_v5e")
    with pytest.raises(ValueError, match=r"^x, w, group_sizes: expected \(M, K\), \(G, K, N\)"):
        gmm_kernel.ragged_dot(x[:, :100], w, jnp.ones(G, jnp.int32), target="tpu_v5e")


@pytest.mark.parametrize(
    ("sizes", "got"),
    [
        (jnp.array([1.5, 0, 4.5, 26]), "float32[4]"),
        (jnp.array([True, False, True, True]), "bool[4]"),
        ([1.5, 0.0, 4.5, 26.0], "float64[4]"),
        (jnp.int32(32), None),
    ],
)
def test_group_sizes_that_are_not_integers_are_refused_as_jax_refuses_them(sizes, got) -> None:
    # issue 49: the kernel truncated float sizes and read bool ones, a row came back zero
    x, w = jnp.ones((M, K), jnp.bfloat16), jnp.ones((G, K, N), jnp.int8)
    with pytest.raises(TypeError) as e:
        gmm_kernel.ragged_dot(x, w, sizes, target="tpu_v5e")
    want = (
        f"group_sizes: expected an array of integers (the number of rows in each group), got {got}"
        if got
        else "group_sizes: expected an array of rank >= 1 (one size per group, shape (g,)), "
        "got a scalar int32"
    )
    assert str(e.value) == want
    with pytest.raises(TypeError):  # JAX's own call refuses them with the same type
        jax.lax.ragged_dot(x, w, jnp.asarray(sizes))


def test_a_list_of_group_sizes_is_taken_as_an_array() -> None:
    xi = np.random.default_rng(0).integers(-3, 4, (M, K))
    wi = np.random.default_rng(1).integers(-3, 4, (G, K, N))
    sizes = [M // 4, M // 2, 0, M // 4]  # 49 of 50 rows: the last belongs to no group
    got = gmm_kernel.ragged_dot(
        jnp.asarray(xi, jnp.bfloat16), jnp.asarray(wi, jnp.int8), sizes,
        target="tpu_v5e", interpret=True,
    )  # fmt: skip
    want = np.zeros((M, N), np.int64)
    ends = np.cumsum(sizes)
    for j, (start, end) in enumerate(zip(ends - sizes, ends, strict=True)):
        want[start:end] = xi[start:end] @ wi[j]  # integer sums: exact in float32
    assert np.asarray(got, np.float64).tolist() == want.astype(np.float64).tolist()
