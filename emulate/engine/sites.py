"""Named scopes that mark one emulated matmul site in a traced program.

Every front end runs its work for one call inside ``jax.named_scope(SiteTag(...).name())``:
the scope travels with the equations into the jaxpr (``source_info.name_stack``), through
``jit`` caches, ``vmap`` and ``grad``, and into the HLO's op names, so that
:func:`emulate.inspect` can show the call as one emulated site (its operand formats and
QArray scheme, target and mode) instead of the decoded dots the call emitted. The scope's
name is the whole record; :func:`parse` reads it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence

import jax

from emulate.quantized import mx
from emulate.quantized.array import QArray, parts_text
from emulate.quantized.layout import layout_of

__all__ = ["PREFIX", "SiteTag", "operand_text", "parse", "scope"]

#: Every site scope's name starts with this.
PREFIX = "emulate("


@dataclasses.dataclass(frozen=True)
class SiteTag:
    """One emulated call.

    Attributes:
      op: "dot_general" or "conv_general_dilated".
      lhs, rhs: ``FORMAT[shape]``, with ``:SCHEME`` for a QArray (see :func:`operand_text`).
      out: the result format name.
      target: the target name; mode: "fast" or "exact".
      flops: 2 * result elements * K of the logical call.
      route: for a contraction with a weight operand on a target with a kernel for it, its
        route (:mod:`emulate.routing`): the kernel's label ("pallas.matmul",
        "pallas.ragged_dot", "cpu.gemv"), or "xla: " and the reason; else "".
    """

    op: str
    lhs: str
    rhs: str
    out: str
    target: str
    mode: str
    flops: int
    route: str = ""

    def name(self) -> str:
        route = f" route {' '.join(self.route.split())}" if self.route else ""
        return (
            f"{PREFIX}{self.op} {self.lhs} x {self.rhs} -> {self.out} "
            f"on {self.target} mode {self.mode} flops {self.flops}{route})"
        )


def parse(name: str) -> SiteTag | None:
    """The tag a scope name holds, or None for any other name."""
    if not name.startswith(PREFIX) or not name.endswith(")"):
        return None
    body, _, route = name[len(PREFIX) : -1].partition(" route ")
    words = body.split(" ")
    try:
        op, lhs, x, rhs, arrow, out, on, target, mode_w, mode, flops_w, flops = words
    except ValueError:
        return None
    if (x, arrow, on, mode_w, flops_w) != ("x", "->", "on", "mode", "flops"):
        return None
    return SiteTag(op, lhs, rhs, out, target, mode, int(flops), route)


def scheme_name(q: QArray) -> str:
    """The :mod:`emulate.mx` scheme ``q`` was quantized with, or a description: element
    format, scale format and block (``int8:float32:blocks(256,1)``), then its optional
    parts (``uint4:float16:blocks(128,1)+zero_points``, ``+codebook(NF4)``, ...)."""
    if not q.is_plain:
        parts = "".join(f"+{p.split('=')[0]}" for p in parts_text(q))
        return f"{q.scale_format}:blocks({','.join(map(str, q.block_shape))}){parts}"
    blocked = sorted(b for b, n in zip(q.block_shape, q.shape, strict=True) if b not in (1, n))
    for s in mx.SCHEMES.values():
        if (
            s.format == q.format_name
            and s.scale_format == q.scale_format
            and s.tensor_scale == (layout_of(q).tensor is not None)
            and blocked == sorted(b for b in (s.block or ()) if b is not None)
        ):
            return s.name
    return f"{q.scale_format}:blocks({','.join(map(str, q.block_shape))})"


def operand_text(fmt: str, shape: Sequence[int], q: QArray | None = None) -> str:
    """``int4[256,8]``; for a QArray ``int4[256,8]:INT4_G128``."""
    text = f"{fmt}[{','.join(map(str, shape))}]"
    return text if q is None else f"{text}:{scheme_name(q)}"


def dot_flops(lhs_shape: Sequence[int], rhs_shape: Sequence[int], dimension_numbers) -> int:
    """2 * result elements * K of a dot_general with these shapes."""
    (lc, rc), (lb, _) = dimension_numbers
    k = math.prod(lhs_shape[d] for d in lc)
    batch = math.prod(lhs_shape[d] for d in lb)
    lfree = math.prod(n for d, n in enumerate(lhs_shape) if d not in lc and d not in lb)
    rfree = math.prod(
        n for d, n in enumerate(rhs_shape) if d not in rc and d not in dimension_numbers[1][1]
    )
    return 2 * batch * lfree * rfree * k


@contextlib.contextmanager
def scope(tag: SiteTag) -> Iterator[SiteTag]:
    """Run the block inside the named scope of ``tag``."""
    with jax.named_scope(tag.name()):
        yield tag
