"""The HBM traffic of a Pallas TPU kernel, counted from its block shapes and grid, and the
figures the TPU compiler gives for a compiled program (:func:`compiled_figures`).

A Pallas kernel is a custom call the TPU compiler does not look into: its
``cost_analysis()`` leaves the kernel's own reads and writes out. ``benchmarks.tpu`` adds
them from here. Nothing is compiled or run; each ``pallas_call`` is traced and its index
maps evaluated at every grid point.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from emulate import compiler


def _block_dims(block_shape: Iterable[Any]) -> list[int]:
    """Element counts per block dimension (a squeezed dimension counts 1)."""
    dims = []
    for b in block_shape:
        size = getattr(b, "block_size", b)
        dims.append(size if isinstance(size, int) else 1)  # None / Squeezed(): one
    return dims


def _pallas_calls(jaxpr: Any) -> Iterable[Any]:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _pallas_calls(inner)


def _index_points(index_map: Any, grid: tuple[int, ...], prefetch: Sequence[Any]) -> np.ndarray:
    """The block index of every grid point, row-major: ``(points, block dims)`` int64. The
    index map's scalar-prefetch refs (SMEM) read ``prefetch``'s values."""
    points = np.array(list(itertools.product(*(range(g) for g in grid))), np.int32)
    points = points.reshape(-1, len(grid))
    if prefetch:
        from jax._src.state.discharge import discharge_state  # refs as plain values

        index_map_pure = discharge_state(index_map)
        jaxpr, consts = index_map_pure.jaxpr, index_map_pure.consts
    else:
        jaxpr, consts = index_map.jaxpr, index_map.consts
    n_out = len(index_map.jaxpr.outvars)

    def one(*p: Any) -> Any:
        return jax.core.eval_jaxpr(jaxpr, consts, *p, *prefetch)[:n_out]

    got = jax.jit(jax.vmap(one))(*(jnp.asarray(points[:, d]) for d in range(len(grid))))
    return np.stack([np.asarray(v, np.int64) for v in got], axis=1)


def kernel_traffic(
    fn: Callable[..., Any],
    specs: Sequence[Any],
    generation: str,
    prefetch: Callable[[Any], Sequence[Any]] | None = None,
) -> dict:
    """HBM bytes the Pallas kernels of ``fn(*specs)`` move, from their block shapes and grid.

    Pallas TPU walks the grid in row-major order (last dimension fastest) and copies a
    block of an input in only when its block index differs from the previous step's, and
    writes a block of an output back when its index changes or the grid ends. Each
    ``pallas_call`` is traced (``jax.make_jaxpr``, on the generation's compile-only device),
    its index maps are evaluated at every grid point, and the copies counted; a block that
    reaches past the array's end counts only its bytes inside the array (the DMA's).

    ``prefetch(eqn)``: the concrete values of a call's scalar-prefetch operands (a grouped
    kernel's schedule, which its index maps read), for calls that have them; they are
    data-dependent, so the caller states them (ValueError where a call needs them and
    ``prefetch`` is None).

    Returns ``{"calls": n, "bytes": total, "read": input bytes, "written": output bytes,
    "grid": [grid of each call], "blocks": [[block dims, copies, bytes] per operand]}``.
    """
    dev = compiler.device(generation)
    placed = [
        jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype),
            a,
            # a record with a shape of its own (Packed, KernelWeight) is a node: its
            # stored leaves are what the kernel reads
            is_leaf=lambda v: hasattr(v, "shape") and jax.tree_util.all_leaves([v]),
        )
        for a in specs
    ]
    with jax.default_device(dev):
        closed = jax.make_jaxpr(fn)(*placed)
    total = read = written = 0
    grids, blocks = [], []
    calls = list(_pallas_calls(closed.jaxpr))
    for eqn in calls:
        gm = eqn.params["grid_mapping"]
        grid = tuple(int(g) for g in gm.grid)
        grids.append(list(grid))
        values: Sequence[Any] = ()
        if gm.num_index_operands:
            if prefetch is None:
                raise ValueError(
                    f"prefetch: the kernel {eqn.params.get('name', '')!r} reads "
                    f"{gm.num_index_operands} scalar-prefetch operands in its index maps; "
                    "pass their values"
                )
            values = [jnp.asarray(v) for v in prefetch(eqn)]
        n_in = gm.num_inputs
        for idx, bm in enumerate(gm.block_mappings):
            dims = _block_dims(bm.block_shape)
            itemsize = np.dtype(bm.array_aval.dtype).itemsize
            index = _index_points(bm.index_map_jaxpr, grid, values)
            changed = np.ones(len(index), bool)
            changed[1:] = np.any(index[1:] != index[:-1], axis=1)
            copied = index[changed]
            shape = np.array(bm.array_aval.shape, np.int64)
            size = np.array(dims, np.int64)
            inside = np.clip(shape - copied * size, 0, size)  # a block's part in the array
            moved = int(np.prod(inside, axis=1).sum()) * itemsize
            total += moved
            if idx < n_in:
                read += moved
            else:
                written += moved
            blocks.append([dims, int(changed.sum()), moved])
    return {
        "calls": len(calls),
        "bytes": total,
        "read": read,
        "written": written,
        "grid": grids,
        "blocks": blocks,
    }


def estimate_seconds(cost: dict[str, float]) -> float | None:
    """The compiler's own time estimate from ``cost_analysis()``: libtpu calls it
    "optimal_seconds"; any other key ending in "seconds" if a later libtpu renames it.
    None where there is none, or where it is negative: libtpu gives a negative sentinel
    (-1 s and the like) for programs it cannot estimate."""
    value = cost.get("optimal_seconds")
    if value is None:
        value = next((v for k, v in sorted(cost.items()) if k.endswith("seconds")), None)
    if value is None or float(value) < 0:
        return None
    return float(value)


def compiled_figures(compiled: Any, *, flops: bool = False) -> dict[str, Any]:
    """What the compiler says of a compiled program: ``cost_analysis()``'s "bytes
    accessed" (and "flops", where ``flops``), its time estimate (:func:`estimate_seconds`)
    and the raw "optimal_seconds", and ``memory_analysis()``'s temporaries, argument and
    output bytes. A Pallas kernel in it counts in neither bytes nor estimate
    (:func:`kernel_calls`)."""
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    mem = compiled.memory_analysis()
    out = {"bytes_accessed": cost.get("bytes accessed")}
    if flops:
        out["flops"] = cost.get("flops")
    return out | {
        "estimate_s": estimate_seconds(cost),
        "estimate_raw": cost.get("optimal_seconds"),
        "temp_bytes": int(mem.temp_size_in_bytes),
        "argument_bytes": int(mem.argument_size_in_bytes),
        "output_bytes": int(mem.output_size_in_bytes),
    }


def kernel_calls(compiled: Any) -> int:
    """The Pallas kernels (TPU custom calls) in a compiled program's text."""
    return compiled.as_text().count('custom_call_target="tpu_custom_call"')
