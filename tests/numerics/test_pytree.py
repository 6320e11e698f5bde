"""PytreeRecord: leaves, key paths and treedefs of records written from their field lists,
round trips through jit and vmap, and the records of the package that use it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate.engine.operands import Operand
from emulate.numerics.pytree import PytreeRecord
from emulate.pallas.weights import KernelWeight

GetAttrKey = jax.tree_util.GetAttrKey


@dataclasses.dataclass(frozen=True, eq=False)
class Pair(PytreeRecord, data=("low", "high"), static=("name", "scale")):
    """Two arrays and two static fields, checked when built by hand."""

    low: Any
    name: str
    high: Any
    scale: int = 1

    def __post_init__(self) -> None:
        if not hasattr(self.low, "shape"):
            raise TypeError(f"low: expected an array, got {type(self.low).__name__}")


def _pair(name: str = "p", scale: int = 3) -> Pair:
    return Pair(np.arange(3, dtype=np.int32), name, np.arange(4.0, dtype=np.float32), scale)


def test_leaves_follow_the_data_list_and_static_fields_sit_in_the_treedef():
    p = _pair()
    leaves, tree = jax.tree_util.tree_flatten(p)
    assert [leaf.tolist() for leaf in leaves] == [[0, 1, 2], [0.0, 1.0, 2.0, 3.0]]
    assert tree.node_data() == (Pair, ("p", 3))
    assert tree.num_leaves == 2
    assert p.tree_flatten()[1] == ("p", 3)
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(p)[0]]
    assert paths == [(GetAttrKey("low"),), (GetAttrKey("high"),)]
    assert [jax.tree_util.keystr(path) for path in paths] == [".low", ".high"]


def test_round_trip_rebuilds_every_field_without_the_constructor_checks():
    p = _pair()
    leaves, tree = jax.tree_util.tree_flatten(p)
    q = jax.tree_util.tree_unflatten(tree, leaves)
    assert type(q) is Pair
    assert (q.low is p.low, q.high is p.high, q.name, q.scale) == (True, True, "p", 3)
    # Placeholders (what JAX passes while it rebuilds) would fail __post_init__.
    r = jax.tree_util.tree_unflatten(tree, [None, "x"])
    assert (r.low, r.high, r.name, r.scale) == (None, "x", "p", 3)
    with pytest.raises(TypeError, match="^low: expected an array, got NoneType$"):
        Pair(None, "p", None)


def test_treedefs_are_equal_and_hash_alike_exactly_when_static_fields_are():
    trees = [jax.tree_util.tree_structure(_pair(n, s)) for n, s in [("p", 3), ("p", 3)]]
    assert trees[0] == trees[1] and hash(trees[0]) == hash(trees[1])
    assert jax.tree_util.tree_structure(_pair("p", 4)) != trees[0]
    assert jax.tree_util.tree_structure(_pair("q", 3)) != trees[0]


def test_jit_retraces_on_static_fields_only_and_vmap_maps_the_leaves():
    traces = []

    @jax.jit
    def shift(p: Pair) -> Pair:
        traces.append(p.name)
        return dataclasses.replace(p, low=p.low * p.scale, high=p.high + p.scale)

    out = shift(_pair())
    assert (out.low.tolist(), out.high.tolist(), out.name) == ([0, 3, 6], [3, 4, 5, 6], "p")
    shift(Pair(jnp.ones(3, jnp.int32), "p", jnp.zeros(4), 3))
    shift(_pair("q"))
    assert traces == ["p", "q"]

    stacked = Pair(jnp.arange(6).reshape(2, 3), "s", jnp.arange(8.0).reshape(2, 4), 2)
    summed = jax.vmap(lambda p: p.low.sum() * p.scale + p.high.sum())(stacked)
    assert summed.tolist() == [12.0, 46.0]
    per_row = jax.vmap(lambda p: dataclasses.replace(p, low=p.low[::-1]))(stacked)
    assert type(per_row) is Pair and per_row.low.tolist() == [[2, 1, 0], [5, 4, 3]]


def test_a_field_list_that_misses_or_repeats_a_field_is_refused():
    with pytest.raises(TypeError) as err:

        class Missing(PytreeRecord, data=("a",)):
            a: Any
            b: int

    assert str(err.value) == (
        "Missing: data ('a',) and static () must name each of its fields ('a', 'b') exactly once"
    )
    with pytest.raises(TypeError, match=r"^Twice: data \('a',\) and static \('a',\)"):

        class Twice(PytreeRecord, data=("a",), static=("a",)):
            a: Any


def test_unflatten_with_the_wrong_counts_is_refused():
    with pytest.raises(ValueError) as err:
        Pair.tree_unflatten(("p",), (1, 2))
    assert str(err.value) == (
        "Pair.tree_unflatten: expected 2 children and 2 static values, got 2 and 1"
    )


def test_the_package_records_keep_their_leaves_key_paths_and_static_fields():
    packed = emulate.pack(np.arange(5, dtype=np.uint8), "int4")
    leaves, tree = jax.tree_util.tree_flatten(packed)
    assert [leaf.tolist() for leaf in leaves] == [[0x10, 0x32, 0x04]]
    assert tree.node_data() == (emulate.Packed, ("int4", -1, 5))
    assert [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(packed)[0]
    ] == [".data"]

    op = Operand(packed, "int4")
    leaves, tree = jax.tree_util.tree_flatten(op)
    assert tree.node_data() == (Operand, ("int4",))
    assert tree.children()[0].node_data() == (emulate.Packed, ("int4", -1, 5))
    rebuilt = jax.tree_util.tree_unflatten(tree, leaves)
    assert type(rebuilt.value) is emulate.Packed and rebuilt.value.data is packed.data
    assert (rebuilt.format_name, rebuilt.value.length) == ("int4", 5)

    kw = KernelWeight(np.zeros((128, 2), np.uint8), "int4", 7)
    assert jax.tree_util.tree_structure(kw).node_data() == (KernelWeight, ("int4", 7))
    assert jax.tree_util.tree_flatten_with_path(kw)[0][0][0] == (GetAttrKey("data"),)
