"""The ``emulate`` command line.

Each subcommand is one small ``_add_<name>`` function that builds its sub-parser and
sets ``func`` (a ``Namespace -> int`` handler) as a default; ``_SUBCOMMANDS`` lists them
in the one place where a new subcommand is registered. Handlers import what they need
themselves, so ``emulate formats`` runs without importing JAX.

Bad arguments print one line, ``emulate: error: <problem> (choose from ...)``, and exit
with status 2; there is no traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from emulate import formats

__all__ = ["main", "build_parser"]

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# --------------------------------------------------------------------------- formats


def _add_formats(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "formats",
        help="table of the low-precision formats: layout, range, NaN/Inf codes",
        description=(
            "Print one row per low-precision format: bits, sign, exponent and mantissa "
            "bits, bias, largest finite value, smallest normal and subnormal values, "
            "the codes that decode to NaN and to Inf, whether -0 exists, the wide types "
            "that hold every value exactly, and the int8 scale k (value * 2**k is an int8)."
        ),
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="FORMAT",
        help="formats to show (names or aliases such as e4m3, e2m1); default: all",
    )
    p.set_defaults(func=_run_formats)


def _pow2(v: float) -> str:
    """``v`` as ``2^k`` when it is a power of two, else as a short decimal."""
    if v > 0:
        m, e = math.frexp(v)
        if m == 0.5:
            return f"2^{e - 1}"
    return _dec(v)


def _dec(v: float) -> str:
    """A short exact decimal: integers without ``.0``, others by ``repr``."""
    if v == int(v) and abs(v) < 2**24:
        return str(int(v))
    if v > 0 and math.frexp(v)[0] == 0.5:
        return _pow2(v)
    return repr(v)


def _codes(codes: tuple[int, ...], bits: int) -> str:
    """Code sets as hex runs: ``0x7f,0xff`` or ``0x7d-0x7f,0xfd-0xff``; ``-`` if none."""
    if not codes:
        return "-"
    width = (bits + 3) // 4
    runs: list[tuple[int, int]] = []
    for c in sorted(codes):
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))

    def h(c: int) -> str:
        return f"0x{c:0{width}x}"

    return ",".join(h(a) if a == b else f"{h(a)}-{h(b)}" for a, b in runs)


_SHORT = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


def format_row(f: formats.Format) -> dict[str, str]:
    """The table cells of one format, keyed by column header."""
    yes = {True: "yes", False: "no"}
    return {
        "format": f.name,
        "bits": str(f.bits),
        "signed": yes[f.signed],
        "E": str(f.exponent_bits) if f.is_float else "-",
        "M": str(f.mantissa_bits) if f.is_float else "-",
        "bias": str(f.bias) if f.is_float else "-",
        "max": _dec(f.max),
        "min normal": _pow2(f.min_normal) if f.is_float else _dec(f.min_normal),
        "min subnormal": _pow2(f.min_subnormal) if f.has_subnormals else "-",
        "NaN codes": _codes(f.nan_codes, f.bits),
        "Inf codes": _codes(f.inf_codes, f.bits),
        "-0": yes[f.signed_zero],
        "exact in": ",".join(_SHORT.get(w, w) for w in f.exact_in) or "-",
        "int8 k": "-" if f.int8_scale is None else str(f.int8_scale),
    }


def _table(rows: Sequence[dict[str, str]]) -> str:
    headers = list(rows[0])
    widths = [max(len(h), *(len(r[h]) for r in rows)) for h in headers]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(r[h].ljust(w) for h, w in zip(headers, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def _run_formats(args: argparse.Namespace) -> int:
    chosen = [_low_precision(n, args.parser) for n in args.names or formats.LOW_PRECISION]
    print(_table([format_row(f) for f in chosen]))
    print(
        "\nE/M: exponent/mantissa bits. -0: a negative-zero code exists. exact in: wide "
        "types holding every value exactly.\nint8 k: value * 2**k is an int8 for every "
        "finite value (the integer-scaled plan)."
    )
    return 0


def _low_precision(name: str, parser: argparse.ArgumentParser) -> formats.Format:
    """The low-precision format ``name`` (or alias), or a one-line usage error."""
    try:
        f = formats.get(name)
    except ValueError:
        f = None
    if f is None or not f.is_low_precision:
        parser.error(
            f"unknown low-precision format {name!r} "
            f"(choose from {', '.join(formats.LOW_PRECISION)}, or an alias such as e4m3)"
        )
    return f


# --------------------------------------------------------------------------- registry

#: Every subcommand, in the order ``--help`` lists them. Add new ones here.
_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_formats,)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = _Parser(
        prog="emulate",
        description="emulate: low-precision matmuls emulated on JAX.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in _SUBCOMMANDS:
        add(sub)
    parser.set_defaults(commands=tuple(sub.choices))
    for name, p in sub.choices.items():
        p.prog = f"emulate {name}"
        p.set_defaults(parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error(f"missing command (choose from {', '.join(args.commands)})")
    handler: Handler = args.func
    try:
        return handler(args)
    except BrokenPipeError:
        # Output piped into e.g. `head`: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
