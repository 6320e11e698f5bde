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

import contextlib
import functools
import string
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, routing, targets
from emulate.engine import args, front, sites, tiled
from emulate.engine.layout import DimensionNumbers
from emulate.engine.operands import Operand, OperandLike, Precision, operand
from emulate.engine.out_sharding import resharded
from emulate.engine.passthrough import is_plain, passes_through
from emulate.engine.plain import plain_dot
from emulate.engine.run import plan_for, run_plan
from emulate.formats import FormatLike
from emulate.numerics.storage import from_codes, is_array
from emulate.quantized.array import QArray
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
    out_sharding: Any = None,
) -> jax.Array:
    """``jax.lax.dot_general`` for operands of any format, on any target.

    What needs no emulation goes to ``lax.dot_general`` unchanged, with the same result
    type, values and exceptions (x64 included): in mode "fast", every call whose operands
    are plain arrays or Python scalars (no ``lhs_format``/``rhs_format``, no Packed or
    QArray) and whose pair :func:`emulate.runs_as_is` on ``target`` (JAX's own types such
    as int32, int16, bool, complex64, float64, float16 x bfloat16; a low-precision
    operand beside a type emulate does not plan for) and, for a low-precision pair, whose
    plan is the target's native dot with nothing added (no exact K-chunking, no host
    fallback). Everything else is emulated as below.

    Args:
      lhs, rhs: arrays of any registered format (jax or numpy; float6 as numpy arrays),
        ``uint8`` codes with ``lhs_format`` / ``rhs_format``, or :class:`emulate.Packed`.
      dimension_numbers, precision, preferred_element_type: as in ``lax.dot_general``.
        ``precision`` applies to the operands that are not decoded (decoded values are
        exact in bf16, so any precision multiplies them exactly).
      target: target name or :class:`emulate.targets.Target`; default the current one.
      mode: "fast" or "exact" (see docs/numerics.md); default the current mode
        (:func:`emulate.current_mode`, set by ``emulate.use_mode`` and ``polyfill``).
        Mode "exact" never passes a call through: every pair it covers gets the exact
        sum rounded once.
      out_sharding: as in ``lax.dot_general``; an emulated result is resharded to it
        (``jax.sharding.reshard``).

    Returns:
      An array of the dtype ``lax.dot_general`` would return for the same operand types
      and ``preferred_element_type`` (int8 x int8 gives int8, the sum wrapped; e4m3fn x
      e4m3fn gives e4m3fn, the sum rounded once). Integer pairs are exact (the int64 sum
      wrapped to int32); float4_e2m1fn / float6_e2m3fn pairs are exact; other float
      pairs are within ``gamma_K * sum|a*b|`` in mode "fast". A
      ``preferred_element_type`` of int16, uint16 or uint32 for integer operands is the
      int32 sum wrapped into it, as XLA's integer dot wraps.

    Differentiable in both modes with ``lax.dot_general``'s rule, as float32 dots of the
    decoded operands (float8 operands get float8 cotangents, as in JAX; integer operands
    none); gradients are outside the exactness contract (docs/numerics.md, "Gradients").

    Raises:
      TypeError, ValueError: as ``lax.dot_general`` raises them for the same shapes and
        dimension numbers (emulate's message, naming the operands and the target, with
        JAX's exception type); emulate's own refusals as documented in docs/api.md.
    """
    return front.call(_DOOR, locals())


def _emulated_dot(call: args.DotArgs) -> jax.Array:
    """Run a validated call by the route :func:`emulate.routing.choose` gives it: the
    kernel route (:func:`emulate.routing.run`), or the XLA route on the call read back."""
    op = routing.dot_op(call, _xla_dot)
    route = routing.choose(call, op)
    tag = routing.site_tag(call, op, route)
    with sites.scope(tag) if tag is not None else contextlib.nullcontext():
        if op is not None and route is not None and route.kernel:
            out = routing.run(call, op, route)
        else:
            out = _xla_dot(call.read_back())
    return resharded(out, call.out_sharding)


_DOOR = front.FrontDoor(plain_dot, args.dot_args, _emulated_dot)


def _xla_dot(call: args.DotArgs) -> jax.Array:
    """The XLA route of a validated call: QArray operands by :mod:`emulate.scaled`, others
    by their plan."""
    if call.has_qarray:
        return qarray_dot_general(call)
    a, b = call.lhs, call.rhs
    assert isinstance(a, Operand) and isinstance(b, Operand)  # no QArray: Operands
    p = plan_for(a, b, call.target, call.result, call.mode)
    with sites.scope(call.tag()):
        out = run_plan(p, a, b, call.dimension_numbers, call.precision, tiled.current_settings())
    if call.wrap_to is not None:  # the int32 sum wraps into it as into XLA's own accumulator
        out = out.astype(call.wrap_to)
    return out


def matmul(
    a: OperandLike | QArray,
    b: OperandLike | QArray,
    *,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    out_sharding: Any = None,
    target: TargetLike = None,
    mode: str | None = None,
    a_format: FormatLike | None = None,
    b_format: FormatLike | None = None,
) -> jax.Array:
    """``jnp.matmul`` (1-D and broadcasting rules) for operands of any format, on any target.

    Calls that need no emulation (the rule of :func:`dot_general`) go to ``jnp.matmul``
    unchanged. Otherwise the result dtype is ``preferred_element_type`` if given, else
    ``jnp.matmul``'s (``jnp.result_type`` of the operand types: int8 x bfloat16 gives
    bfloat16, int8 x uint8 int16), else, for pairs jnp has no promotion rule for (int4 x
    int8, float8_e4m3fn x float8_e5m2, float8 x bfloat16, float6 codes), the result type
    of :func:`dot_general` (``lax.dot_general``'s rule), where ``jnp.matmul`` raises
    (:func:`emulate.formats.promoted`). A QArray counts as its ``dtype``: bfloat16
    activations with a float16 QArray give float32, as with the dense float16 weight.
    ``out_sharding`` as in ``jnp.matmul``.
    """
    precision = args.precision_arg(precision)
    if passes_through(a, b, a_format, b_format, target, mode, preferred_element_type):
        return jnp.matmul(  # plain arrays or scalars: passes_through checked them
            cast(Any, a),
            cast(Any, b),
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
        )
    x, y = args.matmul_operands(a, b, a_format, b_format)  # a prepared weight: its view
    if preferred_element_type is None:  # jnp.matmul's type (a QArray counts as its dtype)
        preferred_element_type = _jnp_result_type(_type_name(x), _type_name(y))
    if args.is_quantized(a) or args.is_quantized(b):  # handed on as it is, not broadcast
        xq, yq = (v if args.is_quantized(v) else o for v, o in ((a, x), (b, y)))
        out = _matmul_dims(xq, yq, precision, preferred_element_type, target, mode)
        return resharded(out, out_sharding)
    assert isinstance(x, Operand) and isinstance(y, Operand)  # QArrays are handed on above
    xv = Operand(x.unpacked()[None, :], x.format_name) if len(x.shape) == 1 else x
    yv = Operand(y.unpacked()[:, None], y.format_name) if len(y.shape) == 1 else y
    xs, ys = xv.shape, yv.shape
    batch = np.broadcast_shapes(xs[:-2], ys[:-2])  # matmul_operands checked that they do
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
    return resharded(out, out_sharding)


def _jnp_result_type(*names: str) -> str | None:
    """``jnp.matmul``'s result type for operands of these types: :func:`emulate.formats.promoted`
    (None where jnp has no rule); ``jnp.result_type`` itself where a type has no format
    (int16, complex64, float64: JAX's own types, which emulate passes on)."""
    try:
        return formats.promoted(*names)
    except (TypeError, ValueError):  # a type emulate has no format for
        pass
    try:
        return np.dtype(jnp.result_type(*(np.dtype(n) for n in names))).name
    except (TypeError, ValueError):  # ValueError: jax's TypePromotionError
        return None


def _type_name(x: Operand | QArray) -> str:
    """The type a front end's result-type rule reads: a QArray's ``dtype``, an Operand's
    format."""
    return x.dtype.name if isinstance(x, QArray) else x.format_name


def _matmul_dims(
    x: Any,
    y: Any,
    precision: Precision,
    preferred_element_type: FormatLike | None,
    target: TargetLike,
    mode: str | None,
) -> jax.Array:
    """``matmul`` as one ``dot_general`` (no broadcasting copies), for QArray operands
    and prepared weights (shapes checked by :func:`emulate.engine.args.matmul_operands`)."""
    xn, yn = len(x.shape), len(y.shape)
    dn: DimensionNumbers
    if yn <= 2:  # (..., K) x (K,) or (K, N): contract, no batch
        dn = ((xn - 1,), (0,)), ((), ())
    elif xn <= 2:  # (K,) or (M, K) x (..., K, N): result (M, ..., N) moved to (..., M, N)
        dn = ((xn - 1,), (yn - 2,)), ((), ())
    else:  # equal batch dimensions
        nb = xn - 2
        dn = ((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))
    out = dot_general(x, y, dn, precision, preferred_element_type, target=target, mode=mode)
    if 2 < yn and xn == 2:
        out = jnp.moveaxis(out, 0, -2)
    return out


def einsum(
    subscripts: Any,
    /,
    *operands: Any,
    out: None = None,
    optimize: str | bool | list[tuple[int, ...]] = "auto",
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    out_sharding: Any = None,
    target: TargetLike = None,
    mode: str | None = None,
    operand_formats: Sequence[FormatLike | None] | None = None,
) -> jax.Array:
    """``jnp.einsum`` for operands of any format, on any target.

    The whole ``jnp.einsum`` surface: any number of operands, implicit and explicit output,
    ``...``, repeated indices, size-1 broadcasting, the sublist form
    (``einsum(x, [0, 1], y, [1, 2], [0, 2])``), ``optimize``, ``precision``,
    ``preferred_element_type`` and ``out_sharding``. It is ``jnp.einsum`` itself (its
    contraction path, its sums of indices that appear in one operand only, its result
    type), with each pairwise contraction run by :func:`dot_general` on ``target`` in
    ``mode``; a call whose operands have no low-precision format is ``jnp.einsum``
    unchanged. Where ``jnp.result_type`` has no rule for the operand types (int4 x int8,
    float8_e4m3fn x float8_e5m2) the result type is :func:`dot_general`'s, folded over the
    operands, where ``jnp.einsum`` raises.

    ``operand_formats`` gives, per operand, the format of an operand passed as ``uint8``
    codes (None for the others). Operands that are :class:`emulate.QArray` or
    :class:`emulate.Packed`, or codes of a format XLA cannot hold (float6), take emulate's
    own two-operand contraction instead: string subscripts, exactly two operands, no index
    repeated within one operand; an index summed in one operand only goes through the same
    exact contraction (not where the other operand is a QArray: ValueError, sum it first).

    Raises:
      ValueError: ``operand_formats`` not of one entry per operand; on the two-operand
        path, other than two operands, an index repeated within one operand, sizes that
        disagree, an output index that no operand has, or a format given for a QArray.
      Otherwise what ``jnp.einsum`` raises for the same call.
    """
    mode = targets.current_mode(mode)
    precision = args.precision_arg(precision)
    full = (subscripts, *operands)
    if isinstance(subscripts, str):
        positions = list(range(1, len(full)))
    else:  # sublist form: operand, sublist, operand, sublist, ..., [output sublist]
        positions = list(range(0, len(full) - len(full) % 2, 2))
    arrays = [full[i] for i in positions]
    fm: list[FormatLike | None] = (
        list(operand_formats) if operand_formats is not None else [None] * len(arrays)
    )
    if len(fm) != len(arrays):
        raise ValueError(
            f"operand_formats: expected one format (or None) per operand, {len(arrays)} in "
            f"all, got {fm!r}"
        )
    own_path = any(not is_plain(x) for x in arrays) or any(
        f is not None and not formats.get(f, arg=f"operand_formats[{i}]").xla_storable
        for i, f in enumerate(fm)
    )
    if own_path:
        if not isinstance(subscripts, str) or len(arrays) != 2:
            raise ValueError(
                "operands: with a QArray, a Packed array or float6 codes emulate.einsum "
                f"contracts exactly two operands named by a subscripts string, got "
                f"{len(arrays)} operands"
                + ("" if isinstance(subscripts, str) else " in the sublist form")
            )
        if out is not None:
            raise NotImplementedError("out: emulate.einsum returns its result; pass out=None")
        res = _einsum_pair(
            subscripts,
            arrays,
            fm,
            precision=precision,
            preferred_element_type=preferred_element_type,
            target=target,
            mode=mode,
        )
        return resharded(res, out_sharding)
    values = [
        x if f is None else from_codes(operand(x, f, arg=f"operands[{i}]").unpacked(), f)
        for i, (x, f) in enumerate(zip(arrays, fm, strict=True))
    ]
    full_values = list(full)
    for i, v in zip(positions, values, strict=True):
        full_values[i] = v
    names = [np.dtype(v.dtype).name for v in values if is_array(v)]
    kw: dict[str, Any] = dict(
        out=out,
        optimize=optimize,
        precision=precision,
        preferred_element_type=preferred_element_type,
        out_sharding=out_sharding,
    )
    if mode == "fast" and not any(n in formats.LOW_PRECISION for n in names):
        return jnp.einsum(*full_values, **kw)
    if preferred_element_type is None and names and _jnp_result_type(*names) is None:
        kw["preferred_element_type"] = _lax_result_type(names)
    dot = _einsum_dot(targets.current_target(target), mode)
    return jnp.einsum(*full_values, _dot_general=dot, **kw)


def _lax_result_type(names: Sequence[str]) -> str:
    """:func:`emulate.formats.dot_result` folded over the operand types."""
    out = formats.get(names[0])
    for n in names[1:]:
        out = formats.dot_result(out, n)
    return out.name


@functools.cache
def _einsum_dot(t: targets.Target, mode: str) -> Callable[..., jax.Array]:
    """The ``dot_general`` jnp.einsum calls for each pairwise contraction: one function per
    target and mode, so that jnp.einsum's jit cache (it is a static argument) is reused."""

    def dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kw):
        return dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision,
            preferred_element_type,
            target=t,
            mode=mode,
            out_sharding=kw.get("out_sharding"),
        )

    return dot


def _einsum_pair(
    subscripts: str,
    operands: Sequence[Any],
    fm: list[FormatLike | None],
    *,
    precision: Precision,
    preferred_element_type: FormatLike | None,
    target: TargetLike,
    mode: str,
) -> jax.Array:
    """emulate's own two-operand einsum, for QArray, Packed and float6-code operands."""
    given = tuple(operands)  # a prepared weight is handed on as it is; its view is checked
    x, y = (args.with_format(v, f, arg) for v, f, arg in zip(given, fm, ("lhs", "rhs")))
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
        if lonely and args.is_quantized(given[is_rhs]):
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
    if preferred_element_type is None:  # jnp.einsum's type (a QArray counts as its dtype)
        preferred_element_type = _jnp_result_type(_type_name(x), _type_name(y))
    xq, yq = (v if args.is_quantized(v) else o for v, o in zip(given, (x, y)))
    res = dot_general(xq, yq, dn, precision, preferred_element_type, target=target, mode=mode)
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
