"""Quantized weights across devices: every part of a QArray or a prepared kernel weight
placed by one PartitionSpec of the weight's logical shape.

A :class:`emulate.QArray` of logical shape ``(K, N)`` (or ``(E, K, N)``, ...) and the
weights :func:`emulate.pallas.prepare_weight` makes (:class:`emulate.pallas.KernelQWeight`,
:class:`emulate.pallas.KernelWeight`) hold several arrays of other shapes: codes (packed:
``g`` codes per ``b`` bytes along one axis; K-planar: tiles of ``128 * g`` rows), scales
and zero points on the block grid (``ceil(K / G)`` rows), two-level parts on the grid of
the grid (GGUF K-quants' super-blocks), a tensor scale, an act-order permutation.
:func:`weight_specs` maps a PartitionSpec ``spec`` of the logical shape onto each of them:

* an axis named in ``spec`` is cut into ``ways`` equal shards (the product of the named
  mesh axes' sizes) on every part whose length along it is more than one block; a part
  with one block along it (per-channel scales along K, a tensor scale) is replicated;
* a shard must hold whole units of every part: whole blocks of the scales (and of the
  scales' scales), whole byte groups of packed codes and zero points, whole K-planar
  tiles, so that shard ``i`` of each part belongs to shard ``i`` of the logical weight.
  Otherwise a ValueError names the argument, the axis, the part and the unit: JAX would
  place the parts anyway and the program would gather them on every call.

:func:`shard_weight` places a weight so (``jax.device_put``; under ``jit`` a sharding
constraint); :func:`local_weight` rebuilds, inside ``jax.shard_map`` (whose ``in_specs``
:func:`weight_specs` gives), the record of one shard: the leaves are already the shard's,
the static shapes become the shard's. Then ``emulate.matmul`` / ``emulate.pallas.matmul``
run per shard (a row-parallel K shard is followed by ``lax.psum``).

The results are those of the unsharded weight: bit for bit where the contract calls them
exact (a sharded K reorders f32 sums only where a psum joins them; docs/porting.md,
"Across chips").
"""

from __future__ import annotations

import math
import sys
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from emulate import formats
from emulate.numerics.storage import Packed, group_shape
from emulate.quantized.array import QArray

__all__ = ["local_weight", "partitioned_over", "shard_weight", "weight_specs"]

#: Rows of K per K-planar tile, per code of a byte group (emulate.pallas.weights).
_TILE_GROUPS = 128


class _Cut:
    """The split asked for: per logical axis of the top-level weight, the mesh axis names
    (None: not split) and the ways (their sizes' product), the logical shape, the argument
    name for messages."""

    def __init__(self, shape: tuple[int, ...], spec: Any, mesh: Any, arg: str) -> None:
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"spec: expected a jax.sharding.PartitionSpec, got {spec!r}")
        sizes = dict(getattr(mesh, "shape", {}) or {})
        if not sizes:
            raise TypeError(f"mesh: expected a jax.sharding.Mesh or AbstractMesh, got {mesh!r}")
        if len(spec) > len(shape):
            raise ValueError(
                f"spec: {spec} names {len(spec)} axes; {arg} has {len(shape)} (shape {shape})"
            )
        self.shape, self.arg = shape, arg
        self.names: list[tuple[str, ...] | None] = []
        self.ways: list[int] = []
        for entry in (*spec, *([None] * (len(shape) - len(spec)))):
            names = None if entry is None else (entry,) if isinstance(entry, str) else entry
            if names is not None and not all(isinstance(n, str) for n in names):
                raise ValueError(f"spec: {spec} has an entry {entry!r} that is not mesh axis names")
            for n in names or ():
                if n not in sizes:
                    raise ValueError(
                        f"spec: mesh axis {n!r} is not in the mesh (axes {tuple(sizes)})"
                    )
            self.names.append(tuple(names) if names else None)
            self.ways.append(math.prod(sizes[n] for n in names) if names else 1)

    def leaf(self, a: Any, lengths: tuple[int, ...], units: tuple[int, ...], what: str) -> Any:
        """The PartitionSpec of array ``a``, a part whose axes have ``lengths`` of its own
        units, each unit ``units`` logical elements; the leading axes of a part of fewer
        axes are the weight's leading ones (a stacked tensor scale)."""
        if a is None:
            return None
        entries: list[Any] = []
        for d in range(len(np.shape(a))):
            names, ways = self.names[d], self.ways[d]
            if names is None or ways == 1 or lengths[d] == 1:
                entries.append(None)
                continue
            need = ways * units[d]
            if self.shape[d] % need:
                raise ValueError(
                    f"{self.arg}: axis {d} ({self.shape[d]}) split {ways} ways over mesh axes "
                    f"{names} leaves {self.shape[d] / ways:g} per shard, not whole {what} "
                    f"({units[d]} along it a unit): the axis must be a multiple of {need}"
                )
            entries.append(names if len(names) > 1 else names[0])
        return PartitionSpec(*entries)

    def local(self, length: int, d: int) -> int:
        """A part's length ``length`` along axis ``d`` in one shard."""
        return length if length == 1 else length // self.ways[d]


def _pallas(name: str) -> Any:
    """``emulate.pallas.<name>`` if it is imported (a prepared weight exists only then),
    else None: emulate itself does not import the kernels."""
    return sys.modules.get(f"emulate.pallas.{name}")


def _codes_spec(cut: _Cut, c: Any, units: tuple[int, ...], what: str) -> Any:
    """Codes or zero points: an array of the part's shape, or Packed along one axis."""
    if isinstance(c, Packed):
        axis = c.axis + c.ndim
        g = group_shape(c.format.bits)[0]
        u = tuple(u * g if d == axis else u for d, u in enumerate(units))
        lengths = tuple(c.shape)
        spec = cut.leaf(c.data, lengths, u, f"{what} (packed: {g} codes a byte group)")
        return Packed.tree_unflatten(c.tree_flatten()[1], (spec,))
    if c is None or isinstance(c, (int, float)):
        return None
    return cut.leaf(c, tuple(np.shape(c)), units, what)


def _qarray_spec(cut: _Cut, q: QArray, units: tuple[int, ...], what: str) -> QArray:
    """A QArray of PartitionSpec leaves (its tree structure): ``q``'s parts' specs."""
    grid = tuple(-(-s // b) for s, b in zip(q.shape, q.block_shape))
    block_units = tuple(u * b for u, b in zip(units, q.block_shape))

    def grid_part(p: Any, name: str) -> Any:
        if isinstance(p, QArray):
            return _qarray_spec(cut, p, block_units, f"{what}{name}")
        return _codes_spec(cut, p, block_units, f"{what}{name}")

    if q.perm is not None and q.perm_axis is not None:
        axis = q.perm_axis + q.ndim
        if cut.ways[axis] > 1 and q.shape[axis] > 1:
            raise ValueError(
                f"{cut.arg}: an act-order permutation along axis {axis} cannot be split "
                "along that axis (the activations' gather would cross shards); split "
                "another axis"
            )
    children, aux = q.tree_flatten()
    codes = _codes_spec(cut, q.codes, units, f"{what}codes")
    scales = grid_part(q.scales, ".scales" if what else "scales")
    ts = None if children[2] is None else cut.leaf(children[2], grid, block_units, "tensor scale")
    zp = None if children[3] is None else grid_part(children[3], "zero points")
    off = None if children[4] is None else grid_part(children[4], "offsets")
    perm = None if q.perm is None else PartitionSpec()
    return QArray.tree_unflatten(aux, (codes, scales, ts, zp, off, perm))


def _planar_spec(cut: _Cut, w: Any, units: tuple[int, int]) -> Any:
    """A :class:`emulate.pallas.KernelWeight` of a PartitionSpec: whole K-planar tiles."""
    tile = _TILE_GROUPS * group_shape(w.format.bits)[0]
    u = (units[0] * tile, units[1])
    spec = cut.leaf(w.data, w.shape, u, f"K-planar codes (tiles of {tile} rows)")
    return type(w).tree_unflatten(w.tree_flatten()[1], (spec,))


def _level_units(level: Any, bk: int, bn: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(units of a two-level part's code bytes, units of its super-block scales)."""
    f = formats.get(level.code_format)
    g = 1 if f.bits >= 8 else group_shape(f.bits)[0]
    return (bk * g, bn), (bk * level.block, bn * level.cols)


def _kernel_qweight_spec(cut: _Cut, kw: Any) -> Any:
    """A :class:`emulate.pallas.KernelQWeight` of PartitionSpec leaves."""
    bk, bn = kw.block_shape
    grid = (-(-kw.shape[0] // bk), -(-kw.shape[1] // bn))
    weights = _pallas("weights")
    if weights is not None and isinstance(kw.codes, weights.KernelWeight):
        codes = _planar_spec(cut, kw.codes, (1, 1))
    else:
        codes = _codes_spec(cut, kw.codes, (1, 1), "codes")
    a = kw.affine
    scale_level = None if a is None else a.spec.scale_level
    scale_units = (bk, bn) if scale_level is None else _level_units(scale_level, bk, bn)[0]
    scales = cut.leaf(kw.scales, grid, scale_units, "scales")
    if kw.perm is not None and cut.ways[kw.perm_axis + 2] > 1:
        raise ValueError(
            f"{cut.arg}: an act-order permutation along axis {kw.perm_axis + 2} cannot be "
            "split along that axis (the activations' gather would cross shards)"
        )
    affine = None
    if a is not None:
        zu = (bk, bn)
        if a.spec.zero == "packed":
            zu = (bk * group_shape(formats.get(a.spec.zero_format).bits)[0], bn)
        ou = (
            (bk, bn)
            if a.spec.offset_level is None
            else _level_units(a.spec.offset_level, bk, bn)[0]
        )
        osu = None if a.spec.offset_level is None else _level_units(a.spec.offset_level, bk, bn)[1]
        ssu = None if scale_level is None else _level_units(scale_level, bk, bn)[1]
        parts = (
            cut.leaf(a.zeros, grid, zu, "zero points"),
            cut.leaf(a.offsets, grid, ou, "offsets"),
            None if osu is None else cut.leaf(a.offset_supers, grid, osu, "offsets' scales"),
            None if ssu is None else cut.leaf(a.scale_supers, grid, ssu, "scales' scales"),
        )
        affine = type(a).tree_unflatten(a.tree_flatten()[1], parts)
    ts = None if kw.tensor_scale is None else PartitionSpec()
    perm = None if kw.perm is None else PartitionSpec()
    return type(kw).tree_unflatten(kw.tree_flatten()[1], (codes, scales, ts, affine, perm))


def weight_specs(w: Any, spec: PartitionSpec, mesh: Any, arg: str = "w") -> Any:
    """The PartitionSpec of every part of ``w``, as a pytree of ``w``'s structure (pass it
    as ``jax.shard_map``'s ``in_specs`` for ``w``, or wrap each in a NamedSharding).

    Args:
      w: a QArray (any rank; its zero points, offsets, two-level scales and offsets
        included), a :class:`emulate.pallas.KernelQWeight` or
        :class:`emulate.pallas.KernelWeight`, a Packed array, or a plain array.
      spec: a PartitionSpec of ``w``'s logical shape (``P(None, "x")``: N split over mesh
        axis "x", column-parallel; ``P("x", None)``: K split, row-parallel).
      mesh: a ``jax.sharding.Mesh`` or ``AbstractMesh`` holding ``spec``'s axis names.
      arg: the argument name for messages.

    Raises:
      TypeError: ``spec`` is not a PartitionSpec, ``mesh`` not a mesh, ``w`` not a weight.
      ValueError: ``spec`` names more axes than ``w`` has or an axis the mesh lacks; a
        split that leaves a shard part of a block, of a packed byte group or of a K-planar
        tile (the message names the axis, the part and its unit); an act-order
        permutation along a split axis.
    """
    if not (isinstance(w, (QArray, Packed)) or _is_kernel(w) or hasattr(w, "dtype")):
        raise TypeError(
            f"{arg}: expected a QArray, KernelQWeight, KernelWeight, Packed or array, got "
            f"{type(w).__name__}"
        )
    shape = tuple(int(s) for s in w.shape)
    cut = _Cut(shape, spec, mesh, arg)
    ones = (1,) * len(shape)
    if isinstance(w, QArray):
        return _qarray_spec(cut, w, ones, "")
    if isinstance(w, Packed):
        return _codes_spec(cut, w, ones, "codes")
    qweight, weights = _pallas("qweight"), _pallas("weights")
    if qweight is not None and isinstance(w, qweight.KernelQWeight):
        return _kernel_qweight_spec(cut, w)
    if weights is not None and isinstance(w, weights.KernelWeight):
        return _planar_spec(cut, w, (1, 1))
    return cut.leaf(w, shape, ones, "elements")


def _is_kernel(w: Any) -> bool:
    qweight, weights = _pallas("qweight"), _pallas("weights")
    return (qweight is not None and isinstance(w, qweight.KernelQWeight)) or (
        weights is not None and isinstance(w, weights.KernelWeight)
    )


def shard_weight(w: Any, sharding: NamedSharding | Mesh, spec: PartitionSpec | None = None) -> Any:
    """``w`` with every part placed by one PartitionSpec of its logical shape
    (:func:`weight_specs`): ``jax.device_put``, which under ``jit`` constrains the parts'
    shardings instead.

    Args:
      w: as :func:`weight_specs`.
      sharding: a NamedSharding (its mesh and spec), or a Mesh with ``spec``.
      spec: the PartitionSpec with a Mesh; None with a NamedSharding.

    Raises:
      TypeError: ``sharding`` is neither; a spec given twice or not at all.
      ValueError: as :func:`weight_specs`.
    """
    if isinstance(sharding, NamedSharding):
        if spec is not None:
            raise TypeError("spec: give it with a Mesh; a NamedSharding carries its own")
        mesh, spec = sharding.mesh, sharding.spec
    elif isinstance(sharding, Mesh):
        if spec is None:
            raise TypeError("spec: a Mesh needs a PartitionSpec of the weight's logical shape")
        mesh = sharding
    else:
        raise TypeError(
            f"sharding: expected a jax.sharding.NamedSharding or Mesh, got "
            f"{type(sharding).__name__}"
        )
    specs = weight_specs(w, spec, mesh)
    shardings = jax.tree.map(lambda p: NamedSharding(mesh, p), specs)
    return jax.device_put(w, shardings)


def local_weight(w: Any, spec: PartitionSpec, mesh: Any) -> Any:
    """Inside ``jax.shard_map`` (``w`` passed with ``in_specs=weight_specs(w, spec,
    mesh)``), the record of this shard: the leaves as they are, the static shapes (logical
    shape, block shape, packed and K-planar lengths, the kernel's scale grid) the shard's.

    Raises:
      TypeError, ValueError: as :func:`weight_specs`, for the global shapes ``w``'s
        static side still has.
    """
    global_shape = tuple(int(s) for s in w.shape)
    cut = _Cut(global_shape, spec, mesh, "w")
    return _local(cut, w)


def _local_shape(cut: _Cut, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(cut.local(s, d) for d, s in enumerate(shape))


def _local(cut: _Cut, x: Any) -> Any:
    """The shard's record of part ``x`` (a record of the top-level's rank)."""
    if isinstance(x, QArray):
        children, aux = x.tree_flatten()
        shape = _local_shape(cut, x.shape)
        block = tuple(min(b, s) for b, s in zip(x.block_shape, shape))
        aux = (aux[0], aux[1], block, shape, *aux[4:])
        kids = tuple(_local(cut, c) if isinstance(c, (QArray, Packed)) else c for c in children)
        return QArray.tree_unflatten(aux, kids)
    if isinstance(x, Packed):
        axis = x.axis + x.ndim
        return Packed(x.data, x.format_name, x.axis, cut.local(x.length, axis))
    qweight, weights, qoffsets = _pallas("qweight"), _pallas("weights"), _pallas("qoffsets")
    if weights is not None and isinstance(x, weights.KernelWeight):
        return weights.KernelWeight(x.data, x.format_name, cut.local(x.length, 0))
    if qweight is not None and isinstance(x, qweight.KernelQWeight):
        children, aux = x.tree_flatten()
        shape = _local_shape(cut, x.shape)
        block = tuple(min(b, s) for b, s in zip(x.block_shape, shape))
        aux = (aux[0], aux[1], block, shape, *aux[4:])
        codes, scales, ts, affine, perm = children
        if affine is not None:
            a_children, (a_spec, grid) = affine.tree_flatten()
            affine = qoffsets.AffineParts.tree_unflatten(
                (a_spec, _local_shape(cut, grid)), a_children
            )
        return qweight.KernelQWeight.tree_unflatten(
            aux, (_local(cut, codes), scales, ts, affine, perm)
        )
    return x


def partitioned_over() -> int:
    """How many devices a program traced now may be partitioned over by JAX itself (its
    automatic partitioning, which refuses a Pallas call: "Mosaic kernels cannot be
    automatically partitioned"): 1 inside ``jax.shard_map`` over every mesh axis (each
    shard runs its own program), the size of the non-manual axes of a mesh set with
    ``jax.sharding.use_mesh`` / ``use_abstract_mesh``, else the TPU devices of this process
    (a compile-only default device, as :func:`emulate.compiler.compile` sets, counts one).
    A multi-chip compile-only program whose shardings come only with its arguments cannot
    be seen here."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.axis_names:
        manual = jax.sharding.AxisType.Manual
        sizes = [n for n, t in zip(mesh.axis_sizes, mesh.axis_types) if t != manual]
        return math.prod(sizes)
    if jax.default_backend() != "tpu":
        return 1
    return len(jax.devices())
