"""``emulate formats [FORMAT ...]``: the table of low-precision formats."""

from __future__ import annotations

import argparse
import math

from emulate import formats
from emulate.cli.args import low_precision
from emulate.tables import short_format, table

__all__ = ["add", "format_row", "run"]


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``emulate formats``."""
    p = sub.add_parser(
        "formats",
        help="table of the low-precision formats: layout, range, NaN/Inf codes",
        description=(
            "Print one row per low-precision format: bits, sign, exponent and mantissa "
            "bits, bias, largest finite value, smallest normal and subnormal values, "
            "the codes that decode to NaN and to Inf, whether -0 exists, the wide types "
            "that hold every value exactly, and the int8 scale k (value * 2**k is an int8). "
            "The ml_dtypes formats, then the IEEE P3109 binary8 family (name any other "
            "P3109 format of 2 to 16 bits to see it)."
        ),
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="FORMAT",
        help="formats to show (names or aliases such as e4m3, e2m1); default: all",
    )
    p.set_defaults(func=run)


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
        "exact in": ",".join(short_format(w) for w in f.exact_in) or "-",
        "int8 k": "-" if f.int8_scale is None else str(f.int8_scale),
    }


def run(args: argparse.Namespace) -> int:
    """Print the formats table; exit status 0."""
    default = formats.LOW_PRECISION + formats.registered()
    chosen = [low_precision(n, args.parser) for n in args.names or default]
    print(table([format_row(f) for f in chosen]))
    print(
        "\nE/M: exponent/mantissa bits (M: the precision less one). -0: a negative-zero code "
        "exists. exact in: wide types holding every value exactly.\nint8 k: value * 2**k is "
        "an int8 for every finite value (the integer-scaled plan). p3109_k{bits}p{precision}"
        "{s|u}{e|f}: IEEE P3109 (signed/unsigned,\nextended with +-Inf or finite); any "
        "other P3109 name of 2 to 16 bits is built when named (codes of 9 to 16 bits as "
        "uint16),\nexcept those whose values float32 cannot hold (exponent fields of 9 "
        "bits or more)."
    )
    return 0
