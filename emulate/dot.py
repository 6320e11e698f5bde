"""Drop-in ``dot_general``, ``matmul`` and ``einsum`` that run any operand pair on any target.

Each call: the operands' formats give a :class:`emulate.Plan` for the target; the
operands are decoded (inside one jitted computation) to the types the plan names; the
contraction runs with an int32 or f32 accumulator, in exact K-chunks where the plan asks
for them; and the sum is rounded once into the type ``jax.lax.dot_general`` would return
for the same call. The executed program holds only dot operand pairs that the target runs
natively (:mod:`emulate.engine`). :class:`emulate.QArray` operands go to
:mod:`emulate.scaled`; importing this module gives QArray its ``@`` operator.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate.engine import sites, tiled
from emulate.engine.layout import DimensionNumbers, normalize_dimension_numbers
from emulate.engine.operands import (
    Operand,
    OperandLike,
    Precision,
    describe,
    hashable_precision,
    operand,
)
from emulate.engine.run import plan_for, run_plan
from emulate.formats import FormatLike
from emulate.quant import QArray
from emulate.scaled import qarray_dot_general
from emulate.targets import TargetLike

__all__ = ["dot_general", "einsum", "matmul"]


def dot_general(
    lhs: OperandLike | QArray,
    rhs: OperandLike | QArray,
    dimension_numbers: lax.DotDimensionNumbers,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    *,
    target: TargetLike = None,
    mode: str | None = None,
    lhs_format: FormatLike | None = None,
    rhs_format: FormatLike | None = None,
) -> jax.Array:
    """``jax.lax.dot_general`` for operands of any format, on any target.

    Args:
      lhs, rhs: arrays of any registered format (jax or numpy; float6 as numpy arrays),
        ``uint8`` codes with ``lhs_format`` / ``rhs_format``, or :class:`emulate.Packed`.
      dimension_numbers, precision, preferred_element_type: as in ``lax.dot_general``.
        ``precision`` applies to the operands that are not decoded (decoded values are
        exact in bf16, so any precision multiplies them exactly).
      target: target name or :class:`emulate.targets.Target`; default the current one.
      mode: "fast" or "exact" (see docs/numerics.md); default the current mode
        (:func:`emulate.current_mode`, set by ``emulate.use_mode`` and ``polyfill``).

    Returns:
      An array of the dtype ``lax.dot_general`` would return for the same operand types
      and ``preferred_element_type`` (int8 x int8 gives int8, the sum wrapped; e4m3fn x
      e4m3fn gives e4m3fn, the sum rounded once). Integer pairs are exact (the int64 sum
      wrapped to int32); float4_e2m1fn / float6_e2m3fn pairs are exact; other float
      pairs are within ``gamma_K * sum|a*b|`` in mode "fast".
    """
    if isinstance(lhs, QArray) or isinstance(rhs, QArray):
        x, y = (
            _with_format(v, f, arg)
            for v, f, arg in ((lhs, lhs_format, "lhs"), (rhs, rhs_format, "rhs"))
        )
        return qarray_dot_general(
            x, y, dimension_numbers, precision, preferred_element_type, target=target, mode=mode
        )
    a = operand(lhs, lhs_format, arg="lhs")
    b = operand(rhs, rhs_format, arg="rhs")
    dn = normalize_dimension_numbers(dimension_numbers, a.shape, b.shape, describe(a, b, target))
    p = plan_for(a, b, target, preferred_element_type, mode)
    tag = sites.SiteTag(
        "dot_general",
        sites.operand_text(a.format_name, a.shape),
        sites.operand_text(b.format_name, b.shape),
        p.out,
        p.target,
        p.mode,
        sites.dot_flops(a.shape, b.shape, dn),
    )
    with sites.scope(tag):
        return run_plan(p, a, b, dn, hashable_precision(precision), tiled.current_settings())


def matmul(
    a: OperandLike | QArray,
    b: OperandLike | QArray,
    *,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    target: TargetLike = None,
    mode: str | None = None,
    a_format: FormatLike | None = None,
    b_format: FormatLike | None = None,
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
        xv = Operand(x.unpacked()[None, :], x.format_name)
    if len(ys) == 1:
        yv = Operand(y.unpacked()[:, None], y.format_name)
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
        xv = Operand(jnp.broadcast_to(xv.unpacked(), batch + xs[-2:]), xv.format_name)
    if ys[:-2] != batch:
        yv = Operand(jnp.broadcast_to(yv.unpacked(), batch + ys[-2:]), yv.format_name)
    nb = len(batch)
    dn = ((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))
    out = dot_general(xv, yv, dn, precision, preferred_element_type, target=target, mode=mode)
    if len(x.shape) == 1:
        out = out[..., 0, :]
    if len(y.shape) == 1:
        out = out[..., 0]
    return out


def _with_format(x: OperandLike | QArray, fmt: FormatLike | None, arg: str) -> Operand | QArray:
    """A QArray as it is (its codes carry their format), anything else as an Operand."""
    if not isinstance(x, QArray):
        return operand(x, fmt, arg=arg)
    if fmt is not None:
        raise ValueError(
            f"{arg}_format: a QArray carries its format ({x.format_name}); pass "
            f"{arg}_format only with uint8 codes, got {arg}_format={fmt!r}"
        )
    return x


def _matmul_dims(
    x: Operand | QArray, y: Operand | QArray, precision, preferred_element_type, target, mode
) -> jax.Array:
    """``matmul`` as one ``dot_general`` (no broadcasting copies), for QArray operands."""
    xn, yn = len(x.shape), len(y.shape)
    if xn == 0 or yn == 0:
        raise ValueError(
            f"a, b: matmul needs operands of at least one dimension, got shapes {x.shape} "
            f"and {y.shape}"
        )
    dn: DimensionNumbers
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
    *operands: OperandLike | QArray,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    target: TargetLike = None,
    mode: str | None = None,
    operand_formats: Sequence[FormatLike | None] | None = None,
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
            assert not isinstance(op_other, QArray)  # refused just above
            codes = op_other.unpacked()
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


def _qarray_matmul(self: QArray, other: OperandLike | QArray) -> jax.Array:
    return matmul(self, other)


def _qarray_rmatmul(self: QArray, other: OperandLike | QArray) -> jax.Array:
    return matmul(other, self)


# QArray knows nothing of its consumers; the matmul that takes it gives it its operator, as
# jax.numpy attaches its operators to JAX's array type.
setattr(QArray, "__matmul__", _qarray_matmul)  # noqa: B010
setattr(QArray, "__rmatmul__", _qarray_rmatmul)  # noqa: B010
