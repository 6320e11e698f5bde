"""emulate.pallas.ragged_dot: the grouped kernel's schedule, its results in interpret mode
against the oracle (:func:`emulate.reference.ragged_dot`), its refusals, and the real TPU
compiler (compile-only) with Mosaic's compatibility mode on and off."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import bounds, compiler, reference
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


@settings(max_examples=6)
@given(sizes=_SIZES, target=st.sampled_from(["tpu_v5e", "tpu_v2"]), seed=st.integers(0, 99))
def test_int8_experts_are_the_oracles_bits(sizes, target, seed) -> None:
    # v5e: int8 x int8 natively (int32 sum); v2: f32 dots in exact chunks. Group sizes
    # traced: one compile a target, whatever the sizes (empty groups, rows left over).
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (M, K)).astype(np.int8)
    w = rng.integers(-128, 128, (G, K, N)).astype(np.int8)
    got = _INT8(jnp.asarray(x), jnp.asarray(w), jnp.array(sizes), target)
    np.testing.assert_array_equal(np.asarray(got), reference.ragged_dot(x, w, sizes, "int32"))


@pytest.mark.parametrize("sizes", [[10, 0, 25, 10], [0, 0, M, 0], [16, 16, 0, 18]])
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


# The real compiler: a decode-sized MoE step (8 experts, 256 rows, K 2048, N 1024).
_PAIRS = {"bf16xe4m3fn": ("bfloat16", "float8_e4m3fn", "float32"),
          "int8xint8": ("int8", "int8", "int32"),
          "bf16xint8": ("bfloat16", "int8", "bfloat16")}  # fmt: skip
_TARGETS = ["tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v7x"]
_DEFAULT = {("bf16xe4m3fn", "tpu_v5e"), ("int8xint8", "tpu_v2")}  # EMULATE_LONG_TESTS: all
_RUNS = [
    pytest.param(p, t, marks=[] if (p, t) in _DEFAULT else [pytest.mark.long], id=f"{p}-{t}")
    for p in _PAIRS
    for t in _TARGETS
]


def _job(pair: str, target: str) -> compiler.Job:
    x, w, out = _PAIRS[pair]
    fn = functools.partial(gmm_kernel.ragged_dot, target=target, out_dtype=out, interpret=False)
    specs = (
        jax.ShapeDtypeStruct((256, 2048), x),
        jax.ShapeDtypeStruct((8, 2048, 1024), w),
        jax.ShapeDtypeStruct((8,), jnp.int32),
    )
    return compiler.Job(fn, specs, target)


@pytest.fixture(scope="module")
def verdicts(request) -> dict:
    runs = [  # this session's selected runs only
        (item.callspec.params["pair"], item.callspec.params["target"])
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_the_tpu_compiler_compiles_it"
        and item.module is request.module
    ]
    jobs = [_job(p, t) for p, t in runs]
    got = compiler.check_both({True: jobs, False: jobs})
    return {(run, c): v for c in (True, False) for run, v in zip(runs, got[c], strict=True)}


@pytest.mark.parametrize(("pair", "target"), _RUNS)
def test_the_tpu_compiler_compiles_it(verdicts, pair, target) -> None:
    for compat in (True, False):
        v = verdicts[((pair, target), compat)]
        assert v.ok, (pair, target, compat, v.message)


def test_the_default_row_tile_is_about_one_group() -> None:
    # 64 bf16 rows over 32 experts (16 tokens, top-4 of gpt-oss's 32): 2 rows a group on
    # average, so a row tile of 16 (bf16's sublane tiling), not 64: each visit reads its
    # tile of x again, and 64-row tiles read 4x the rows
    x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((32, 256, 128), jnp.int8)
    gs = jax.ShapeDtypeStruct((32,), jnp.int32)
    fn = functools.partial(gmm_kernel.ragged_dot, target="tpu_v5e", interpret=True)
    eqns = list(jax.make_jaxpr(fn)(x, w, gs).eqns)
    while eqns[0].primitive.name != "pallas_call":  # into the jit calls, depth first
        e = eqns.pop(0)
        eqns[:0] = [i for p in e.params.values() if hasattr(p, "eqns") for i in p.eqns] + [
            i for p in e.params.values() if hasattr(p, "jaxpr") for i in p.jaxpr.eqns
        ]
    grid = eqns[0].params["grid_mapping"]
    assert grid.block_mappings[0].block_shape[0].block_size == 16
    assert grid.grid[1] == 64 // 16 + 32 - 1  # visits: every row tile, plus one a boundary
