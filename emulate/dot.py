"""Drop-in ``dot_general``, ``matmul`` and ``einsum`` that run any operand pair on any target.

Each call: the operands' formats give a :class:`emulate.Plan` for the target; the
operands are decoded (inside one jitted computation) to the types the plan names; the
contraction runs with an int32 or f32 accumulator, in exact K-chunks where the plan asks
for them; and the sum is rounded once into the type ``jax.lax.dot_general`` would return
for the same call. The executed program holds only dot operand pairs that the target runs
natively. XLA on the CPU does not fuse a decode into the dot, so there a large decoded
operand is decoded tile by tile inside a loop instead (:mod:`emulate.tiled`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import string
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import accumulate, codecs, exact, formats, targets, tiled
from emulate.codes import from_codes, is_array, to_codes
from emulate.formats import Format
from emulate.packing import Packed, unpack_codes
from emulate.plan import Plan, plan
from emulate.quant import QArray

__all__ = ["dot_general", "matmul", "einsum", "Operand", "operand"]


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Operand:
    """An operand before decoding: codes, a wide-typed array or a Packed array, and its format."""

    value: Any  # uint8 codes, an array of a wide type, or a Packed array
    format_name: str

    def tree_flatten(self):
        return (self.value,), self.format_name

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], aux)

    @property
    def format(self) -> Format:
        return formats.get(self.format_name)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def codes(self) -> jax.Array:
        """Unpacked codes (or the wide array), ready for shape operations."""
        if isinstance(self.value, Packed):
            return unpack_codes(self.value)
        if self.format.is_low_precision:
            return to_codes(self.value, self.format_name)[0]
        return self.value


def operand(x: Any, fmt: Any = None, *, arg: str = "x") -> Operand:
    """Normalise an operand: an array of any registered format (jax or numpy, float6 numpy
    arrays included), ``uint8`` codes with ``fmt``, or a :class:`emulate.Packed` array."""
    if isinstance(x, Operand):
        return x
    if isinstance(x, Packed):
        if fmt is not None and formats.get(fmt) != x.format:
            raise ValueError(
                f"{arg}_format: {formats.get(fmt).name} disagrees with the Packed {arg}'s "
                f"format {x.format.name}"
            )
        return Operand(x, x.format_name)
    if not is_array(x):
        if isinstance(x, (int, float, bool, complex, list, tuple)):
            raise TypeError(
                f"{arg}: expected an array (jax or numpy), a Packed array or uint8 codes "
                f"with {arg}_format=, got {type(x).__name__}"
            )
        raise TypeError(f"{arg}: expected an array, got {type(x).__name__}")
    dt = np.dtype(x.dtype)
    if fmt is None and dt.name in formats.WIDE:
        return Operand(jnp.asarray(x), dt.name)
    try:
        codes, f = to_codes(x, fmt, arg=arg)
    except TypeError as e:
        raise TypeError(f"{e}; the matmul operand types are: {', '.join(_OPERAND_NAMES)}") from None
    if not f.is_low_precision:
        return Operand(jnp.asarray(x), f.name)
    if fmt is None and f.xla_storable and not isinstance(x, np.ndarray):
        # Keep a jax array of the format's own dtype as it is: it is bitcast to codes where
        # it is decoded, which lets a tiled decode read it tile by tile (emulate.tiled)
        # instead of first writing a full uint8 copy of it.
        return Operand(x, f.name)
    return Operand(codes, f.name)


_OPERAND_NAMES = [n for n in formats.names() if n != "float8_e8m0fnu"]


def _compute(op: Operand, compute: str, scale: int) -> jax.Array:
    """Decode ``op`` to the plan's compute type (exactly)."""
    f = op.format
    if not f.is_low_precision:
        return op.value if op.value.dtype == jnp.dtype(compute) else op.value.astype(compute)
    if compute == f.name:  # native: hand the matrix unit the format itself
        if not isinstance(op.value, Packed) and op.value.dtype == f.dtype:
            return op.value
        return from_codes(op.codes(), f)
    if compute == "int8":
        if f.is_integer:
            return codecs.decode(op.value, f.name, to=jnp.int8)
        v = codecs.decode(op.value, f.name, to=jnp.float32) * jnp.float32(2.0**scale)
        return v.astype(jnp.int8)  # exact: every value * 2**scale is an integer in int8
    return codecs.decode(op.value, f.name, to=jnp.dtype(compute))


def _contract(
    p: Plan,
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers,
    precision,
) -> jax.Array:
    """Contract decoded operands as the plan says and round once into ``p.out``."""
    (lc, rc), (lb, rb) = dimension_numbers
    acc_dtype = jnp.dtype(p.accumulator)
    k = math.prod(lhs.shape[d] for d in lc)
    check_k(p, k)
    if p.k_chunk is None or k <= p.k_chunk:
        acc = lax.dot_general(
            lhs, rhs, dimension_numbers, precision, preferred_element_type=acc_dtype
        )
        return finish(p, acc)
    lhs3 = _canonical(lhs, lb, lc)
    rhs3 = _canonical(rhs, rb, rc)
    nb = len(lb)
    chunk = p.k_chunk
    pad = (-k) % chunk
    if pad:
        lhs3 = jnp.pad(lhs3, [(0, 0)] * (lhs3.ndim - 1) + [(0, pad)])
        rhs3 = jnp.pad(rhs3, [(0, 0)] * (rhs3.ndim - 1) + [(0, pad)])
    n_chunks = (k + pad) // chunk
    lhs4 = lhs3.reshape(lhs3.shape[:-1] + (n_chunks, chunk))
    rhs4 = rhs3.reshape(rhs3.shape[:-1] + (n_chunks, chunk))
    batch_l = tuple(range(nb)) + (lhs4.ndim - 2,)
    batch_r = tuple(range(nb)) + (rhs4.ndim - 2,)
    dn = ((lhs4.ndim - 1,), (rhs4.ndim - 1,)), (batch_l, batch_r)
    partial = lax.dot_general(lhs4, rhs4, dn, precision, preferred_element_type=acc_dtype)
    if partial.dtype != jnp.int32:  # f32 chunk sums: exact multiples of the quantum
        scale = p.lhs_scale + p.rhs_scale
        partial = (partial * jnp.float32(2.0**scale)).astype(jnp.int32)
    hi, lo = accumulate.combine_chunks(partial, axis=nb)
    return accumulate.round_limbs(hi, lo, p.lhs_scale + p.rhs_scale, p.out)


def check_k(p: Plan, k: int) -> None:
    if p.k_limit is not None and k > p.k_limit:
        raise ValueError(
            f"lhs, rhs: a contraction of K = {k} exceeds the {p.k_limit} that the exact "
            f"{p.lhs} x {p.rhs} plan on {p.target} combines exactly; split the contraction"
        )


def finish(p: Plan, acc: jax.Array) -> jax.Array:
    """Round an unchunked accumulator once into ``p.out``."""
    if acc.dtype == jnp.int32 and not formats.get(p.out).is_integer:
        # An exact int32 sum (in quanta): via limbs, so a narrow result rounds only once.
        return accumulate.round_limbs(*accumulate.split(acc), p.lhs_scale + p.rhs_scale, p.out)
    return accumulate.round_accumulator(acc, p.out)


def _canonical(x: jax.Array, batch: Sequence[int], contract: Sequence[int]) -> jax.Array:
    """Transpose to (batch..., free..., contract...) and merge the contracting dims."""
    free = [d for d in range(x.ndim) if d not in batch and d not in contract]
    x = jnp.transpose(x, tuple(batch) + tuple(free) + tuple(contract))
    keep = x.shape[: len(batch) + len(free)]
    return x.reshape(keep + (math.prod(x.shape[len(keep) :]),))


def per_platform(p: Plan, run, lhs: Operand, rhs: Operand) -> jax.Array:
    """``run(p, lhs, rhs)``; where the plan has a fallback, chosen when JAX lowers the program:
    the plan on its own platform, the fallback plan everywhere else."""
    if p.fallback is None:
        return run(p, lhs, rhs)
    branches = {p.platform: functools.partial(run, p)}
    return lax.platform_dependent(lhs, rhs, **branches, default=functools.partial(run, p.fallback))


@functools.partial(jax.jit, static_argnames=("p", "dimension_numbers", "precision", "tiling"))
def _run(
    p: Plan,
    lhs: Operand,
    rhs: Operand,
    dimension_numbers,
    precision,
    tiling: tiled.Settings = tiled.DEFAULT,
) -> jax.Array:
    def untiled(q: Plan, lhs: Operand, rhs: Operand) -> jax.Array:
        a = _compute(lhs, q.lhs_compute, q.lhs_scale)
        b = _compute(rhs, q.rhs_compute, q.rhs_scale)
        return _contract(q, a, b, dimension_numbers, precision)

    def run(q: Plan, lhs: Operand, rhs: Operand) -> jax.Array:
        if q.slicing is not None:  # mode "exact" outside the exact class
            # wide operands as they are: exact.contract reads their bits (a convert to f32
            # may flush subnormals on XLA CPU)
            a, b = (
                op.value if not op.format.is_low_precision else _compute(op, "float32", 0)
                for op in (lhs, rhs)
            )
            return exact.contract(q, a, b, dimension_numbers, precision)
        t = tiled.choose(q, lhs, rhs, dimension_numbers, tiling)
        if t is None:
            return untiled(q, lhs, rhs)

        def cpu(lhs: Operand, rhs: Operand) -> jax.Array:
            # A large decoded operand: decode it tile by tile inside a loop (emulate.tiled).
            return tiled.contract(
                q,
                t,
                lhs,
                rhs,
                dimension_numbers,
                precision,
                decode=_compute,
                contract_decoded=_contract,
                finish=finish,
            )

        default = functools.partial(untiled, q)
        return lax.platform_dependent(lhs, rhs, cpu=cpu, default=default)

    return per_platform(p, run, lhs, rhs)


def _plan_for(a: Operand, b: Operand, target: Any, preferred_element_type: Any, mode: str) -> Plan:
    p = plan(
        a.format, b.format, target=target, preferred_element_type=preferred_element_type, mode=mode
    )
    if not formats.get(p.out).xla_storable:
        raise ValueError(
            f"preferred_element_type: the result type would be {p.out}, which XLA cannot hold; "
            "pass preferred_element_type (e.g. jnp.float32 or jnp.bfloat16)"
        )
    return p


def _describe(a: Operand, b: Operand, target: Any) -> str:
    t = targets.current_target(target)
    return (
        f"lhs {a.format_name}{list(a.shape)}, rhs {b.format_name}{list(b.shape)}, target {t.name}"
    )


def _normalize_dn(dimension_numbers: Any, a: Operand, b: Operand, target: Any):
    try:
        (lc, rc), (lb, rb) = dimension_numbers
        lc, rc, lb, rb = (tuple(int(d) for d in s) for s in (lc, rc, lb, rb))
    except (TypeError, ValueError):
        raise TypeError(
            "dimension_numbers: expected ((lhs_contracting, rhs_contracting), (lhs_batch, "
            f"rhs_batch)), got {dimension_numbers!r}"
        ) from None
    where = _describe(a, b, target)
    for name, dims, shape in (("lhs", lc + lb, a.shape), ("rhs", rc + rb, b.shape)):
        if len(set(dims)) != len(dims) or any(not 0 <= d < len(shape) for d in dims):
            raise ValueError(
                f"dimension_numbers: {name} dimensions {dims} must be distinct and in "
                f"[0, {len(shape)}) for {name} of shape {shape}; {where}"
            )
    for kind, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(ld) != len(rd):
            raise ValueError(
                f"dimension_numbers: {len(ld)} lhs {kind} dimensions but {len(rd)} rhs ones; "
                f"{where}"
            )
        for i, j in zip(ld, rd, strict=True):
            if a.shape[i] != b.shape[j]:
                raise ValueError(
                    f"dimension_numbers: lhs {kind} dimension {i} has size {a.shape[i]} but rhs "
                    f"{kind} dimension {j} has size {b.shape[j]}; {where}"
                )
    return (lc, rc), (lb, rb)


def dot_general(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    *,
    target: Any = None,
    mode: str = "fast",
    lhs_format: Any = None,
    rhs_format: Any = None,
) -> jax.Array:
    """``jax.lax.dot_general`` for operands of any format, on any target.

    Args:
      lhs, rhs: arrays of any registered format (jax or numpy; float6 as numpy arrays),
        ``uint8`` codes with ``lhs_format`` / ``rhs_format``, or :class:`emulate.Packed`.
      dimension_numbers, precision, preferred_element_type: as in ``lax.dot_general``.
        ``precision`` applies to the operands that are not decoded (decoded values are
        exact in bf16, so any precision multiplies them exactly).
      target: target name or :class:`emulate.targets.Target`; default the current one.
      mode: "fast" or "exact" (see docs/numerics.md).

    Returns:
      An array of the dtype ``lax.dot_general`` would return for the same operand types
      and ``preferred_element_type`` (int8 x int8 gives int8, the sum wrapped; e4m3fn x
      e4m3fn gives e4m3fn, the sum rounded once). Integer pairs are exact (the int64 sum
      wrapped to int32); float4_e2m1fn / float6_e2m3fn pairs are exact; other float
      pairs are within ``gamma_K * sum|a*b|`` in mode "fast".
    """
    if isinstance(lhs, QArray) or isinstance(rhs, QArray):
        from emulate import scaled

        x, y = (
            _with_format(v, f, arg)
            for v, f, arg in ((lhs, lhs_format, "lhs"), (rhs, rhs_format, "rhs"))
        )
        return scaled.dot_general(
            x, y, dimension_numbers, precision, preferred_element_type, target=target, mode=mode
        )
    a = operand(lhs, lhs_format, arg="lhs")
    b = operand(rhs, rhs_format, arg="rhs")
    dn = _normalize_dn(dimension_numbers, a, b, target)
    p = _plan_for(a, b, target, preferred_element_type, mode)
    return _run(p, a, b, dn, _hashable(precision), tiled.current_settings())


def _hashable(precision: Any) -> Any:
    if isinstance(precision, list):
        return tuple(precision)
    return precision


def matmul(
    a: Any,
    b: Any,
    *,
    precision: Any = None,
    preferred_element_type: Any = None,
    target: Any = None,
    mode: str = "fast",
    a_format: Any = None,
    b_format: Any = None,
) -> jax.Array:
    """``jnp.matmul`` (1-D and broadcasting rules) for operands of any format, on any target.

    The result dtype follows ``lax.dot_general``'s rule (see :func:`dot_general`); for
    same-type operands that is what ``jnp.matmul`` returns too.
    """
    if isinstance(a, QArray) or isinstance(b, QArray):
        x, y = _with_format(a, a_format, "a"), _with_format(b, b_format, "b")
        return _matmul_dims(x, y, precision, preferred_element_type, target, mode)
    x = operand(a, a_format, arg="a")
    y = operand(b, b_format, arg="b")
    xs, ys = x.shape, y.shape
    if len(xs) == 0 or len(ys) == 0:
        raise ValueError(
            f"a, b: matmul needs operands of at least one dimension, got shapes {xs} and {ys}"
        )
    xv, yv = x, y
    if len(xs) == 1:
        xv = Operand(x.codes()[None, :], x.format_name)
    if len(ys) == 1:
        yv = Operand(y.codes()[:, None], y.format_name)
    xs, ys = xv.shape, yv.shape
    if xs[-1] != ys[-2]:
        raise ValueError(
            f"a, b: matmul contracts a's last dimension ({xs[-1]}) with b's second to last "
            f"({ys[-2]}); a {x.format_name}{list(x.shape)}, b {y.format_name}{list(y.shape)}"
        )
    try:
        batch = np.broadcast_shapes(xs[:-2], ys[:-2])
    except ValueError:
        raise ValueError(
            f"a, b: batch dimensions {xs[:-2]} and {ys[:-2]} do not broadcast"
        ) from None
    if xs[:-2] != batch:
        xv = Operand(jnp.broadcast_to(xv.codes(), batch + xs[-2:]), xv.format_name)
    if ys[:-2] != batch:
        yv = Operand(jnp.broadcast_to(yv.codes(), batch + ys[-2:]), yv.format_name)
    nb = len(batch)
    dn = ((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))
    out = dot_general(xv, yv, dn, precision, preferred_element_type, target=target, mode=mode)
    if len(x.shape) == 1:
        out = out[..., 0, :]
    if len(y.shape) == 1:
        out = out[..., 0]
    return out


def _with_format(x: Any, fmt: Any, arg: str) -> Any:
    """A QArray as it is (its codes carry their format), anything else as an Operand."""
    if not isinstance(x, QArray):
        return operand(x, fmt, arg=arg)
    if fmt is not None:
        raise ValueError(
            f"{arg}_format: a QArray carries its format ({x.format_name}); pass "
            f"{arg}_format only with uint8 codes, got {arg}_format={fmt!r}"
        )
    return x


def _matmul_dims(x: Any, y: Any, precision, preferred_element_type, target, mode) -> jax.Array:
    """``matmul`` as one ``dot_general`` (no broadcasting copies), for QArray operands."""
    xn, yn = len(x.shape), len(y.shape)
    if xn == 0 or yn == 0:
        raise ValueError(
            f"a, b: matmul needs operands of at least one dimension, got shapes {x.shape} "
            f"and {y.shape}"
        )
    if yn <= 2:  # (..., K) x (K,) or (K, N): contract, no batch
        dn = ((xn - 1,), (0,)), ((), ())
    elif xn <= 2:  # (K,) or (M, K) x (..., K, N): result (M, ..., N) moved to (..., M, N)
        dn = ((xn - 1,), (yn - 2,)), ((), ())
    elif xn == yn and tuple(x.shape[:-2]) == tuple(y.shape[:-2]):
        nb = xn - 2
        dn = ((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))
    else:
        raise ValueError(
            f"a, b: matmul of a QArray needs equal batch dimensions or a 1-D/2-D operand, "
            f"got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )
    out = dot_general(x, y, dn, precision, preferred_element_type, target=target, mode=mode)
    if 2 < yn and xn == 2:
        out = jnp.moveaxis(out, 0, -2)
    return out


def einsum(
    subscripts: str,
    *operands: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    target: Any = None,
    mode: str = "fast",
    operand_formats: Sequence[Any] | None = None,
) -> jax.Array:
    """``jnp.einsum`` for two operands of any format, on any target.

    Supports explicit (``"bij,bjk->bik"``) and implicit (``"ij,jk"``) output, and ``...``.
    ``operand_formats`` gives the formats of operands passed as uint8 codes.
    An index that appears in one operand only and not in the output is summed through
    the same exact contraction (the other operand is broadcast along it), except where
    the other operand is a :class:`emulate.QArray` (ValueError: sum it first).

    Raises:
      ValueError: other than two operands, an index repeated within one operand, sizes
        that disagree, an output index that no operand has, ``operand_formats`` not of
        length two, or a format given for a QArray operand.
    """
    if len(operands) != 2:
        raise ValueError(
            f"operands: emulate.einsum contracts exactly two operands, got {len(operands)}; "
            "contract them pairwise"
        )
    fm = list(operand_formats) if operand_formats is not None else [None, None]
    if len(fm) != 2:
        raise ValueError(
            f"operand_formats: expected one format (or None) per operand, two in all, got {fm!r}"
        )
    x, y = (_with_format(v, f, arg) for v, f, arg in zip(operands, fm, ("lhs", "rhs")))
    ins, out_idx = _parse_einsum(subscripts, (len(x.shape), len(y.shape)))
    li, ri = ins
    for name, idx in (("lhs", li), ("rhs", ri)):
        if len(set(idx)) != len(idx):
            raise ValueError(
                f"subscripts: an index repeats within the {name} operand in {subscripts!r}"
            )
    sizes: dict[str, int] = {}
    for idx, shape in ((li, x.shape), (ri, y.shape)):
        for c, n in zip(idx, shape, strict=True):
            if sizes.setdefault(c, n) != n:
                raise ValueError(
                    f"subscripts: index {c!r} has size {sizes[c]} and {n} in {subscripts!r}"
                )
    for c in out_idx:
        if c not in sizes:
            raise ValueError(
                f"subscripts: output index {c!r} appears in no operand of {subscripts!r}"
            )
    # Indices summed in one operand only: broadcast the other operand along them.
    for mine, other, op_other, is_rhs in ((li, ri, y, True), (ri, li, x, False)):
        lonely = [c for c in mine if c not in other and c not in out_idx]
        if lonely and isinstance(op_other, QArray):
            raise ValueError(
                f"subscripts: index {lonely[0]!r} is summed in one operand only, which "
                f"emulate.einsum does not do when the other is a QArray; sum it first"
            )
        if lonely:
            codes = op_other.codes()
            codes = jnp.broadcast_to(
                codes[(None,) * len(lonely)], tuple(sizes[c] for c in lonely) + codes.shape
            )
            new = Operand(codes, op_other.format_name)
            if is_rhs:
                y, ri = new, "".join(lonely) + ri
            else:
                x, li = new, "".join(lonely) + li
    batch = [c for c in li if c in ri and c in out_idx]
    contract = [c for c in li if c in ri and c not in out_idx]
    dn = (
        (tuple(li.index(c) for c in contract), tuple(ri.index(c) for c in contract)),
        (tuple(li.index(c) for c in batch), tuple(ri.index(c) for c in batch)),
    )
    res = dot_general(x, y, dn, precision, preferred_element_type, target=target, mode=mode)
    res_idx = batch + [c for c in li if c not in ri] + [c for c in ri if c not in li]
    return jnp.transpose(res, tuple(res_idx.index(c) for c in out_idx))


def _parse_einsum(subscripts: str, ndims: tuple[int, int]) -> tuple[list[str], str]:
    if not isinstance(subscripts, str):
        raise TypeError(f"subscripts: expected a string, got {type(subscripts).__name__}")
    s = subscripts.replace(" ", "")
    lhs, arrow, out = s.partition("->")
    ins = lhs.split(",")
    if len(ins) != 2:
        raise ValueError(f"subscripts: expected two comma-separated operands, got {subscripts!r}")
    used = set(c for c in s if c.isalpha())
    spare = [c for c in string.ascii_letters if c not in used]
    n_ell = max(
        (nd - len(t.replace("...", "")) for t, nd in zip(ins, ndims, strict=True) if "..." in t),
        default=0,
    )
    ell = "".join(spare[:n_ell])
    expanded = []
    for t, nd in zip(ins, ndims, strict=True):
        if "..." in t:
            k = nd - len(t.replace("...", ""))
            t = t.replace("...", ell[n_ell - k :])
        if len(t) != nd or not all(c.isalpha() for c in t):
            raise ValueError(
                f"subscripts: {t!r} does not name the {nd} dimensions of its operand "
                f"in {subscripts!r}"
            )
        expanded.append(t)
    if arrow:
        out = out.replace("...", ell)
    else:
        counts = {c: "".join(expanded).count(c) for c in "".join(expanded)}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return expanded, out
