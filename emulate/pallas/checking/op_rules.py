"""Which operations other than ``tpu.matmul`` need Mosaic's compatibility mode on a target.

Mosaic's compatibility mode (``--xla_mosaic_compat_mode``, on by default) also rewrites
element-wise operations on narrow types that a generation's vector unit lacks: with it off,
libtpu 0.0.42.1 refuses a bf16 -> int8 conversion on v4 and v5e ("On this target
float-to-integer conversions can only happen on 32-bit values"), and an int8 -> bf16 one
("integer-to-float conversions can only happen on 32-bit values"); and a transpose of 8-bit
values on v4 to v6e, of 4-bit ones on v7x ("Unsupported transpose with element type
bitwidth smaller than supported minimum"). A kernel that quantizes its activations in the
kernel, or transposes a loaded int8 tile (``w_ref[...].T``), compiles only because
compatibility mode is on.

The rule is the compiler's own, asked per operation: :func:`compat_only_ops` compiles a
one-operation kernel with the operation's element types and shape (:func:`op_kernel`) with
compatibility mode on and off, for each conversion, comparison or transpose on a type
narrower than 32 bits (:data:`CHECKED_OPS`), and calls the operation compat-only where only
the first compiles. The verdicts are cached per process; an operation Mosaic refuses for
other reasons in the one-operation kernel is not reported.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from emulate import compiler, formats, targets
from emulate.mosaic import Verdict
from emulate.pallas.checking.sites import MLIR_FORMATS, KernelOp

__all__ = [
    "CHECKED_OPS",
    "compat_only_ops",
    "narrow_ops",
    "op_cost",
    "op_fix",
    "op_kernel",
    "prefetch",
]

#: The operations (as JAX ships them, before Mosaic's canonicalization renames ``arith.``
#: conversions to ``tpu.``) whose narrow-type forms are checked.
CHECKED_OPS = (
    "arith.fptosi",
    "arith.sitofp",
    "arith.truncf",
    "arith.extf",
    "arith.extsi",
    "arith.trunci",
    "arith.cmpf",
    "arith.cmpi",
    "tpu.transpose",
)

_VECTOR = re.compile(r"vector<((?:[0-9]+x)+)([A-Za-z0-9]+)>")
_WIDE: dict[str, np.dtype] = {
    "i32": np.dtype(np.int32),
    "f32": np.dtype(np.float32),
    "i16": np.dtype(np.int16),
}


def _vector(mlir_type: str) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of an MLIR vector type, or None for another type or element type."""
    m = _VECTOR.fullmatch(mlir_type)
    if m is None:
        return None
    shape = tuple(int(d) for d in m.group(1).rstrip("x").split("x"))
    element = m.group(2)
    if element in _WIDE:
        return shape, _WIDE[element]
    name = MLIR_FORMATS.get(element)
    if name is None:
        return None
    dtype: np.dtype = np.dtype(formats.get(name).dtype)
    return shape, dtype


def _is_narrow(mlir_type: str) -> bool:
    v = _vector(mlir_type)
    return v is not None and v[1].itemsize < 4


def narrow_ops(ops: Sequence[KernelOp]) -> list[KernelOp]:
    """The ops of :data:`CHECKED_OPS` with a vector operand or result narrower than 32
    bits (a comparison's i1 result aside), one per (name, operand and result types)."""
    found: dict[tuple, KernelOp] = {}
    for op in ops:
        if op.name not in CHECKED_OPS or not op.operand_types:
            continue
        if _vector(op.operand_types[0]) is None:
            continue
        compare = op.name in ("arith.cmpf", "arith.cmpi")
        if not compare and (not op.result_types or _vector(op.result_types[0]) is None):
            continue
        types = op.operand_types[:1] + (() if compare else op.result_types[:1])
        if any(_is_narrow(x) for x in types):
            found.setdefault((op.name, op.operand_types, op.result_types), op)
    return list(found.values())


def _op_body(x_ref, o_ref, *, compare: bool, transpose: bool = False) -> None:  # noqa: ANN001
    v = x_ref[...]
    if transpose:
        o_ref[...] = v.T
    elif compare:  # the mask selects in the operand's own type (no relayout to int32)
        zero = jnp.zeros_like(v)
        o_ref[...] = jnp.where(v > zero, v, zero)
    else:
        o_ref[...] = v.astype(o_ref.dtype)


def op_kernel(x: jax.Array, *, out: str, compare: bool, transpose: bool = False) -> jax.Array:
    """A one-operation Pallas kernel: ``x`` converted to dtype ``out`` (a conversion),
    ``where(x > 0, x, 0)`` (a comparison, ``compare``; ``out`` unused), or ``x.T`` (a 2-D
    transpose, ``transpose``; ``out`` unused). Module level, so that a compiler subprocess
    receives it by reference."""
    from jax.experimental import pallas as pl

    dtype = x.dtype if compare or transpose else jnp.dtype(out)
    shape = x.shape[::-1] if transpose else x.shape
    body = functools.partial(_op_body, compare=compare, transpose=transpose)
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(shape, dtype))(x)


def _job(op: KernelOp, target: str) -> compiler.Job:
    compare = op.name in ("arith.cmpf", "arith.cmpi")
    transpose = op.name == "tpu.transpose"
    operand = _vector(op.operand_types[0])
    assert operand is not None  # narrow_ops keeps vectors only
    out = "int32" if compare else str(_vector(op.result_types[0])[1])  # type: ignore[index]
    fn = functools.partial(op_kernel, out=out, compare=compare, transpose=transpose)
    return compiler.Job(fn, (jax.ShapeDtypeStruct(*operand),), target)


_cache: dict[tuple, Verdict] = {}


def _verdicts(pairs: Sequence[tuple[KernelOp, str]]) -> dict[tuple, dict[bool, Verdict]]:
    """Both settings' verdicts on each ``(op, target name)``, from the cache or compiled
    together: one :func:`emulate.compiler.check_both` for all the uncached ones."""
    keys = [(target, op.name, op.operand_types, op.result_types) for op, target in pairs]
    todo = {
        compat: list(
            {
                k: (k, op, t)
                for k, (op, t) in zip(keys, pairs, strict=True)
                if (k, compat) not in _cache
            }.values()
        )
        for compat in (True, False)
    }
    jobs = {c: [_job(op, t) for _, op, t in todo[c]] for c in todo if todo[c]}
    if jobs:
        got = compiler.check_both(jobs)
        for c, verdicts in got.items():
            for (k, _, _), v in zip(todo[c], verdicts, strict=True):
                _cache[(k, c)] = v
    return {k: {c: _cache[(k, c)] for c in (True, False)} for k in keys}


def prefetch(kernels: Sequence[tuple[Sequence[KernelOp], targets.Target]]) -> None:
    """Compile the one-operation kernels of every ``(ops, target)`` in ``kernels`` at once
    (one compiler subprocess in all, rather than one per kernel), so that the
    :func:`compat_only_ops` calls that follow find their verdicts cached.

    Raises:
      CompilerUnavailable, ValueError: as :func:`compat_only_ops`.
    """
    pairs = [(op, t.name) for ops, t in kernels for op in narrow_ops(ops)]
    if pairs:
        _verdicts(pairs)


def compat_only_ops(ops: Sequence[KernelOp], target: targets.Target) -> list[tuple[KernelOp, str]]:
    """``(op, message)`` for each op of :func:`narrow_ops` that compiles with compatibility
    mode on and is refused with it off (``message``: the compiler's first line), by the
    real compiler (one subprocess for the setting this process lacks; none for the
    operations :func:`prefetch` or an earlier call compiled).

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError: a target without a compile-only device.
    """
    narrow = narrow_ops(ops)
    if not narrow:
        return []
    verdicts = _verdicts([(op, target.name) for op in narrow])
    found = []
    for op in narrow:
        v = verdicts[(target.name, op.name, op.operand_types, op.result_types)]
        if v[True].ok and not v[False].ok:
            found.append((op, v[False].message))
    return found


def _element(mlir_type: str) -> str:
    v = _vector(mlir_type)
    return jnp.dtype(v[1]).name if v else mlir_type


def op_fix(op: KernelOp) -> str:
    """What to write instead of ``op`` so that it needs no compatibility mode: the same
    operation in 32-bit types."""
    src = _element(op.operand_types[0]) if op.operand_types else "?"
    dst = _element(op.result_types[0]) if op.result_types else "?"
    base = op.name.split(".", 1)[-1]
    if base == "transpose":
        wide = "int32" if src.startswith(("int", "uint")) else "float32"
        return (
            f"contract the operand as stored instead (emulate.pallas.dot(a, b, "
            "dimension_numbers=...), or lax.dot_general's, takes (K, M) and (N, K) operands "
            f"with no transpose), or transpose in 32 bits: {src} values widened to {wide} "
            "(float8 and float4 codes through lax.bitcast_convert_type to unsigned integers "
            f"first), transposed, narrowed back to {src}"
        )
    if base in ("fptosi", "sitofp"):
        steps = ["float32", "int32"] if base == "fptosi" else ["int32", "float32"]
        steps = [s for s in steps if s != src] + ([dst] if dst not in steps else [])
        chain = "".join(f".astype(jnp.{s})" for s in steps)
        return (
            f"convert through 32-bit types: x{chain} instead of x.astype(jnp.{dst}) on {src} values"
        )
    if base in ("cmpf", "cmpi"):
        wide = "float32" if base == "cmpf" else "int32"
        return f"compare in 32 bits: convert the {src} operands to jnp.{wide} first"
    return (
        f"do this {src} -> {dst} conversion through 32-bit types (float32 or int32), "
        f"converting to {dst} last"
    )


def op_cost(op: KernelOp) -> str:
    """What compatibility mode does to ``op``."""
    if op.name == "tpu.transpose":
        return (
            "compatibility mode transposes the narrow values in a wider type, widening them "
            "and narrowing the result (extra vector work)"
        )
    return (
        f"compatibility mode performs {op.name.split('.', 1)[-1]} in 32-bit types, widening "
        "the operands and narrowing the result (extra vector work)"
    )
