"""The TPU core's scalar unit as :mod:`emulate.compiler.replay` runs it: values, operands and
the arithmetic of scalar operations.

Values are 32-bit integers (held unsigned; the ``.s32`` operations read them signed),
booleans (predicates), symbolic addresses (:class:`Addr`: an allocation plus an offset,
so that sync flags and SMEM words can be told apart without knowing where they live), or
``None``: unknown, data the replay cannot see (a value loaded from an input). An
operation on an unknown value gives an unknown value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Final

from emulate.compiler.bundles import Op, physical

__all__ = [
    "IMMEDIATE",
    "SMEM",
    "Addr",
    "Getter",
    "Value",
    "add",
    "getter",
    "signed",
    "smem_address",
    "value_fn",
]

_MASK: Final = 0xFFFFFFFF
IMMEDIATE = re.compile(r"^\$?(-?(?:0x[0-9a-fA-F]+|\d+))$")
_ALLOC = re.compile(r"^\[#(\w+)(?:\s*\+\s*\$?(0x[0-9a-fA-F]+|\d+))?\]$")
SMEM = re.compile(r"^\[smem:\[(.*?)\]\](.*)$")


@dataclasses.dataclass(frozen=True)
class Addr:
    """A symbolic address: an allocation (``"allocation7"``, ``"operand 0"``) plus an
    offset in the units its operations use. Sync flags and SMEM words are addressed so."""

    base: str
    offset: int = 0

    def plus(self, n: int) -> Addr:
        return Addr(self.base, self.offset + n)


#: An unknown value (data the replay cannot see).
UNKNOWN: Final = None
Value = int | bool | Addr | None


# --- operands -------------------------------------------------------------------------

Getter = Callable[[dict[str, Value]], Value]


def getter(token: str) -> Getter:
    """A function of the registers returning ``token``'s value."""
    token = token.strip()
    neg = token.startswith("!")
    if neg:
        inner = getter(token[1:])

        def negated(r: dict[str, Value]) -> Value:
            v = inner(r)
            return None if v is None else not v

        return negated
    if token.startswith("%"):
        reg = physical(token.split()[0])
        return lambda r: r.get(reg)
    if token.startswith("#"):  # inside a memory operand: [smem:[#allocation21_spill]]
        token = f"[{token}]"
    m = _ALLOC.match(token)
    if m:
        addr = Addr(m.group(1), int(m.group(2) or "0", 0))
        return lambda r: addr
    m = IMMEDIATE.match(token)
    if m:
        value = int(m.group(1), 0) & _MASK
        return lambda r: value
    return lambda r: None


def strip_attrs(token: str) -> str:
    """``"[resolvable:$true] %s281_s6"`` -> ``"%s281_s6"``."""
    return re.sub(r"^\[[^\]]*\]\s+(?=\S)", "", token.strip())


def signed(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def add(a: Value, b: Value) -> Value:
    if isinstance(a, Addr) and isinstance(b, int):
        return a.plus(signed(b))
    if isinstance(b, Addr) and isinstance(a, int):
        return b.plus(signed(a))
    if isinstance(a, int) and isinstance(b, int):
        return (a + b) & _MASK
    return None


def sub(a: Value, b: Value) -> Value:
    if isinstance(a, Addr) and isinstance(b, int):
        return a.plus(-signed(b))
    if isinstance(a, Addr) and isinstance(b, Addr) and a.base == b.base:
        return (a.offset - b.offset) & _MASK
    if isinstance(a, int) and isinstance(b, int):
        return (a - b) & _MASK
    return None


def _ints(f: Callable[[int, int], int]) -> Callable[[Value, Value], Value]:
    def g(a: Value, b: Value) -> Value:
        if isinstance(a, bool) or isinstance(b, bool):
            a, b = (int(a) if isinstance(a, bool) else a), (int(b) if isinstance(b, bool) else b)
        if isinstance(a, int) and isinstance(b, int):
            return f(a, b) & _MASK
        return None

    return g


def _compare(cc: str, is_signed: bool) -> Callable[[Value, Value], Value]:
    test = {
        "eq": lambda a, b: a == b,
        "ne": lambda a, b: a != b,
        "lt": lambda a, b: a < b,
        "le": lambda a, b: a <= b,
        "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b,
    }[cc]

    def g(a: Value, b: Value) -> Value:
        if isinstance(a, Addr) and isinstance(b, Addr):
            return test(a.offset, b.offset) if a.base == b.base else None
        if isinstance(a, int) and isinstance(b, int):
            return test(signed(a), signed(b)) if is_signed else test(a, b)
        return None

    return g


def _logic(f: Callable[[bool, bool], bool]) -> Callable[[Value, Value], Value]:
    def g(a: Value, b: Value) -> Value:
        if a is None or b is None or isinstance(a, Addr) or isinstance(b, Addr):
            return None
        return f(bool(a), bool(b))

    return g


_BINARY: Final[dict[str, Callable[[Value, Value], Value]]] = {
    "sadd": add,
    "ssub": sub,
    "smul": _ints(lambda a, b: a * b),
    "sand": _ints(lambda a, b: a & b),
    "sor": _ints(lambda a, b: a | b),
    "sxor": _ints(lambda a, b: a ^ b),
    "sshll": _ints(lambda a, b: a << (b & 31)),
    "sshrl": _ints(lambda a, b: a >> (b & 31)),
    "sshra": _ints(lambda a, b: signed(a) >> (b & 31)),
    "smin": _ints(min),
    "smax": _ints(max),
    "pnand": _logic(lambda a, b: not (a and b)),
    "pnor": _logic(lambda a, b: not (a or b)),
    "por": _logic(lambda a, b: a or b),
    "pand": _logic(lambda a, b: a and b),
    "pxor": _logic(lambda a, b: a != b),
}


def binary(opcode: str) -> Callable[[Value, Value], Value] | None:
    head, _, rest = opcode.partition(".")
    if head == "scmp":
        cc, _, kind = rest.partition(".")
        if kind.startswith(("s32", "u32")):
            return _compare(cc, kind.startswith("s32"))
        return None
    if head in ("smin", "smax") and rest.startswith("s32"):
        f = min if head == "smin" else max
        return _ints(lambda a, b: f(signed(a), signed(b)))
    return _BINARY.get(head)


def smem_address(text: str) -> Getter:
    parts = [p.strip() for p in text.split("+")]
    getters = [getter(p) for p in parts]

    def address(r: dict[str, Value]) -> Value:
        value: Value = getters[0](r)
        for g in getters[1:]:
            value = add(value, g(r))
        return value

    return address


def value_fn(op: Op) -> Callable[[dict[str, Value]], Value] | None:
    """The register value a scalar operation computes, or None when it computes none the
    replay follows (the destination becomes unknown)."""
    code = op.opcode
    args = [strip_attrs(a) for a in op.operands]
    if code in ("smov", "pmov", "reloc") or code.startswith("int_to_ptr"):
        if len(args) != 1:
            return None
        return getter(args[0])
    if code == "pneg" and len(args) == 1:
        g = getter(args[0])
        return lambda r: None if (v := g(r)) is None or isinstance(v, Addr) else not v
    if code == "scalar_select":
        p, t, f = (getter(op.named.get(k, "")) for k in ("predicate", "on_true", "on_false"))

        def select(r: dict[str, Value]) -> Value:
            c = p(r)
            return None if c is None or isinstance(c, Addr) else (t(r) if c else f(r))

        return select
    if code.startswith("scalar_lea") and len(args) == 2:
        base, off = getter(args[0]), getter(args[1].split()[0])
        return lambda r: add(base(r), off(r))
    if code.startswith("inlined_call_operand"):
        # the operand's buffer: "input 0", "output 1" (its kind tells a DMA's direction)
        text = op.operands[0] if op.operands else ""
        index = re.search(r"index: (\d+)", text)
        kind = re.search(r"kind: (\w+)", text)
        name = f"{kind.group(1) if kind else 'operand'} {index.group(1) if index else op.dest}"
        addr = Addr(name)
        return lambda r: addr
    if code == "scalar_parameter_address" and args:
        addr = Addr(f"parameter {args[0]}")
        return lambda r: addr
    op2 = binary(code)
    if op2 is not None and len(args) == 2:
        a, b = getter(args[0]), getter(args[1])
        return lambda r: op2(a(r), b(r))
    return None
