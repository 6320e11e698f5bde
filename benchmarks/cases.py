"""The operand pairs and shapes the matmul benchmarks share, and their flag parsers.

``benchmarks.matmul`` times these pairs at these shapes on the CPU; ``benchmarks.tpu``
compiles the same programs for each TPU generation. A pair is bf16 activations (M x K)
times a weight (K x N) of a low-precision format, or two low-precision operands.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from emulate import formats

#: ``lax.dot_general`` dimension numbers of ``x @ w``: contract x's axis 1 with w's axis 0.
DN = (((1,), (0,)), ((), ()))

SHAPES: tuple[tuple[int, int, int], ...] = (
    (1, 4096, 4096),
    (64, 4096, 4096),
    (512, 4096, 4096),
    (2048, 2048, 2048),
)

_SHORT = {"bfloat16": "bf16", "float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2"}


@dataclasses.dataclass(frozen=True)
class Pair:
    """An operand pair: activations ``lhs`` (M x K) times weights ``rhs`` (K x N)."""

    name: str
    lhs: str
    rhs: str
    packed: bool = False  # emulate takes the weight as emulate.pack(w, axis=0)

    @property
    def integer(self) -> bool:
        return formats.get(self.lhs).is_integer and formats.get(self.rhs).is_integer

    @property
    def accumulator(self) -> Any:
        """What the contenders on raw dtypes ask for: int32 for integer pairs, else f32."""
        return jnp.int32 if self.integer else jnp.float32

    @property
    def title(self) -> str:
        """Short operand names, ``"bf16 x int4 (packed)"``."""
        short = [_SHORT.get(n, n.replace("float4_", "")) for n in (self.lhs, self.rhs)]
        return " x ".join(short) + (" (packed)" if self.packed else "")


PAIRS: dict[str, Pair] = {
    p.name: p
    for p in (
        Pair("int8", "bfloat16", "int8"),
        Pair("int4", "bfloat16", "int4", packed=True),
        Pair("float8_e4m3fn", "bfloat16", "float8_e4m3fn"),
        Pair("float8_e5m2", "bfloat16", "float8_e5m2"),
        Pair("float4_e2m1fn", "bfloat16", "float4_e2m1fn", packed=True),
        Pair("int8xint8", "int8", "int8"),
        Pair("fp8xfp8", "float8_e4m3fn", "float8_e4m3fn"),
    )
}
#: The weight-only pairs: bf16 activations times fp8 / int8 / int4 / fp4 weights.
WEIGHT_ONLY = ("int8", "int4", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn")


@dataclasses.dataclass(frozen=True)
class Contender:
    """One way of computing the product: its key in the results, its label in the tables
    (``"(a) bf16 pre-decoded"``) and what it does."""

    key: str
    label: str
    doc: str


def present(rows: Sequence[dict[str, Any]], contenders: Sequence[Contender]) -> list[str]:
    """The keys of ``contenders`` that some row measured, in the contenders' order."""
    have = {r["contender"] for r in rows}
    return [c.key for c in contenders if c.key in have]


def shape_of(row: dict[str, Any]) -> str:
    """A result row's ``"MxKxN"``; ``"KxN"`` for a row without M (a weight alone)."""
    if row.get("M") is None:
        return f"{row['K']}x{row['N']}" if "K" in row else ""
    return f"{row['M']}x{row['K']}x{row['N']}"


def goal(label: str, key: str, limit: float, rows: Sequence[dict], **extra: Any) -> dict:
    """A goal met where ``row[key] <= limit`` for every one of ``rows``: the worst row's
    figure and where it is, and every row over the limit (``"pair MxKxN"``). ``extra``
    (a generation, a unit) leads the dict. With no rows: measured, met and worst None."""
    out: dict[str, Any] = {**extra, "goal": label, "key": key, "limit": limit}
    if not rows:
        return {**out, "measured": None, "met": None, "worst": None, "n": 0, "failing": []}
    worst = max(rows, key=lambda r: r[key])
    return {
        **out,
        "measured": worst[key],
        "met": worst[key] <= limit,
        "worst": f"{worst['pair']} {shape_of(worst)}".strip(),
        "n": len(rows),
        "failing": [f"{r['pair']} {shape_of(r)}".strip() for r in rows if r[key] > limit],
    }


def parse_shapes(text: str, flag: str = "--shapes") -> list[tuple[int, int, int]]:
    """``"MxKxN[,MxKxN...]"`` of positive integers; ArgumentTypeError naming ``flag``."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(
                f"{flag}: expected MxKxN[,MxKxN...] of positive integers, got {item!r}"
            )
        m, k, n = (int(p) for p in parts)
        shapes.append((m, k, n))
    return shapes


def parse_shape(text: str, flag: str = "--shape") -> tuple[int, int, int]:
    """One ``"MxKxN"``; ArgumentTypeError naming ``flag`` otherwise."""
    shapes = parse_shapes(text, flag)
    if len(shapes) != 1:
        raise argparse.ArgumentTypeError(f"{flag}: expected one MxKxN, got {text!r}")
    return shapes[0]


def parse_names(text: str, accepted: Sequence[str], flag: str) -> list[str]:
    """Comma-separated names, each one of ``accepted``; ArgumentTypeError naming ``flag``."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in accepted]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{flag}: unknown {', '.join(bad) or '(none)'}; choose from {', '.join(accepted)}"
        )
    return names


def parse_pairs(text: str) -> list[str]:
    """``--formats``: names of :data:`PAIRS`."""
    return parse_names(text, list(PAIRS), "--formats")
