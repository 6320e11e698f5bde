"""The ``emulate`` command line.

Each subcommand is one small ``_add_<name>`` function that builds its sub-parser and
sets ``func`` (a ``Namespace -> int`` handler) as a default; ``_SUBCOMMANDS`` lists them
in the one place where a new subcommand is registered. Handlers import what they need
themselves. The subcommands:

- ``formats [FORMAT ...]``: the table of low-precision formats;
- ``targets [--target T ...]``: native / emulated operand pairs per target and format, and
  the plan method each format gets against itself and against bfloat16;
- ``explain LHS RHS [--target T] [--out DTYPE] [--mode fast|exact]``: one plan, explained;
- ``validate [--target T ... | --target all] [--formats F ...] [--modes fast exact]
  [--examples N] [--seed S] [--json PATH] [--all-layouts]``: property-based checks of
  every plan against the reference oracle, as a table (see :mod:`emulate.validate`); exit
  status 1 on any mismatch;
- ``check-kernel MODULE:FUNCTION [--target T ... | --target all] [--shapes SPEC]``: lower a
  function's Pallas kernels for TPU and report the ``tpu.matmul`` operand types each target
  would reject (see :func:`emulate.pallas.check`); exit status 1 on any finding.

Bad arguments print one line, ``emulate: error: <problem> (choose from ...)``, and exit
with status 2; there is no traceback.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import NoReturn

from emulate import formats, mosaic
from emulate.tables import short_format, short_target, table
from emulate.targets import Target

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


def _run_formats(args: argparse.Namespace) -> int:
    chosen = [_low_precision(n, args.parser) for n in args.names or formats.LOW_PRECISION]
    print(table([format_row(f) for f in chosen]))
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


# --------------------------------------------------------------------------- targets

#: Output tables are split into column groups so that no line exceeds this width.
_WIDTH = 100


def _add_targets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "targets",
        help="which operand pairs each target runs natively, and the plan each format gets",
        description=(
            "Print, per target and format, whether fmt x fmt and bfloat16 x fmt run natively "
            "on the target's matrix unit, then the plan method emulate.plan picks for each "
            "low-precision format against itself and against bfloat16 (float32 results). "
            "Lines stay within 100 columns: wide tables are split into column groups."
        ),
    )
    p.add_argument(
        "--target",
        dest="targets",
        action="extend",
        nargs="+",
        metavar="T",
        help="targets to show (names or aliases such as v5e, h100); default: all",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="compile a one-line Pallas matmul for every generation the installed libtpu "
        "offers x operand pair x accumulator, compatibility mode on and off, with the real "
        "compiler (about a minute); print where JAX's table and the compiler disagree and "
        "what differs from the recorded probe; exit status 1 if anything does",
    )
    p.add_argument("--out", metavar="PATH", help="with --probe: write the probe's JSON to PATH")
    p.set_defaults(func=_run_targets)


def _grid(
    title: str,
    row_names: Sequence[str],
    columns: Sequence[tuple[str, str]],
    cell: Callable[[str, str], str],
) -> list[str]:
    """Tables of ``cell(row, column)`` titled ``title``, with lines of at most :data:`_WIDTH`.

    ``columns`` are (name, kind) pairs. All columns go in one table if it fits; otherwise
    one table per kind (TPUs, then the rest), each cut further where it still does not fit.
    Every table repeats the title and the ``format`` column. The lines start with a blank
    one.
    """
    cells = {(r, c): cell(r, c) for r in row_names for c, _ in columns}
    first = max(len("format"), *(len(r) for r in row_names))
    width = {
        c: 2 + max(len(short_target(c)), *(len(cells[r, c]) for r in row_names)) for c, _ in columns
    }
    if first + sum(width.values()) <= _WIDTH:
        kinds = [[c for c, _ in columns]]
    else:
        kinds = [
            [c for c, k in columns if k == kind] for kind in dict.fromkeys(k for _, k in columns)
        ]
    groups: list[list[str]] = []
    for names in kinds:
        groups.append([])
        used = first
        for c in names:
            if groups[-1] and used + width[c] > _WIDTH:
                groups.append([])
                used = first
            groups[-1].append(c)
            used += width[c]
    lines: list[str] = []
    for group in groups:
        rows = [{"format": r, **{short_target(c): cells[r, c] for c in group}} for r in row_names]
        lines += ["", title, table(rows)]
    return lines


_METHOD_LEGEND = (
    "method: native = operands go to the matrix unit as they are; int8 = decoded to int8 after "
    "an\nexact power-of-two scaling, int32 accumulation; bf16 / f32 = decoded exactly to that "
    "type,\nf32 accumulation; none = no route on that target."
)


def _table_disagreements(chosen: Sequence[Target], operands: Sequence[str]) -> list[str]:
    """Lines naming, per probed target, the pairs of the matrix where JAX's table and the
    compiler disagree."""
    out = []
    for t in chosen:
        if t.table_pairs is None:
            continue
        pairs = [(f, f) for f in operands] + [("bfloat16", f) for f in operands]
        only_jax = [p for p in pairs if p in t.table_pairs and p not in t.native_pairs]
        only_compiler = [p for p in pairs if p in t.native_pairs and p not in t.table_pairs]
        parts = []
        if only_jax:
            parts.append("JAX's table only: " + ", ".join(f"{a} x {b}" for a, b in only_jax))
        if only_compiler:
            parts.append("compiler only: " + ", ".join(f"{a} x {b}" for a, b in only_compiler))
        if parts:
            text = f"{short_target(t.name)}: " + "; ".join(parts)
            out += textwrap.wrap(text, _WIDTH, initial_indent="  ", subsequent_indent="    ")
    if out:
        out.insert(
            0, "where JAX's table and the compiler disagree (native = compiles, compat off):"
        )
    return out


def _run_probe(args: argparse.Namespace) -> int:
    import pathlib

    from emulate import compiler

    try:
        result = compiler.probe(args.targets)
    except (compiler.CompilerUnavailable, ValueError) as e:
        print(f"emulate targets --probe: {e}", file=sys.stderr)
        return 2
    text, changed = compiler.report(result)
    print(text)
    if args.out:
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.to_json(), encoding="utf-8")
        print(f"wrote {out}")
    return 1 if changed else 0


def _run_targets(args: argparse.Namespace) -> int:
    from emulate import targets

    if args.probe:
        return _run_probe(args)
    if args.out:
        args.parser.error("--out goes with --probe")
    from emulate.planning.plan import plan

    chosen = []
    for name in args.targets or targets.names():
        try:
            chosen.append(targets.get(name))
        except ValueError:
            args.parser.error(
                f"unknown target {name!r} (choose from {', '.join(targets.names())}, "
                "or an alias such as v5e)"
            )
    names = list(dict.fromkeys(t.name for t in chosen))
    columns = [(t.name, "tpu" if t.kind == "tpu" else "other") for t in map(targets.get, names)]
    operands = [f for f in targets.OPERANDS if f not in formats.SCALE_ONLY]
    low = list(formats.LOW_PRECISION_OPERANDS)

    mark = {"native": "N", "emulated": "e"}
    status = {
        (r.target, r.format): f"{mark[r.same_type]}/{mark[r.weight_only]}"
        for r in targets.capability_matrix(names, operands)
    }
    lines = _grid(
        "Native operand pairs (N native, e emulated); cell: fmt x fmt / bfloat16 x fmt",
        operands,
        columns,
        lambda f, t: status[t, f],
    )
    lines.append("")
    by_source: dict[str, list[str]] = {}
    for name in names:
        t = targets.get(name)
        key = "compiler" if t.rules == "compiler" else t.source
        by_source.setdefault(key, []).append(short_target(name))
    if "compiler" in by_source:
        lines.append(
            f"real TPU compiler (libtpu {mosaic.recorded().libtpu}, compat off): "
            + ", ".join(by_source["compiler"])
        )
    if "jax" in by_source:
        lines.append(f"read from JAX's Pallas TPU table: {', '.join(by_source['jax'])}")
    if "builtin" in by_source:
        lines.append(f"emulate's builtin profiles: {', '.join(by_source['builtin'])}")
    lines.append("float8_e8m0fnu, a scale type and never a matmul operand, is left out.")
    lines += _table_disagreements([targets.get(n) for n in names], operands)

    # (lhs x rhs, fallback method, platform) -> targets whose native plan has that fallback
    fallbacks: dict[tuple[str, str, str], list[str]] = {}
    # format -> targets where fmt x fmt is native but the plan takes a faster route
    passed_over: dict[str, list[str]] = {}

    def method(lhs: str, rhs: str, t: str) -> str:
        try:
            p = plan(lhs, rhs, target=t, preferred_element_type="float32")
        except ValueError:
            return "none"
        if p.fallback is not None:
            key = (f"{lhs} x {rhs}", p.fallback.method, p.platform)
            fallbacks.setdefault(key, []).append(short_target(t))
        if p.method != "native" and lhs == rhs and targets.get(t).supports(lhs, rhs):
            passed_over.setdefault(lhs, []).append(short_target(t))
        return p.method

    lines += _grid(
        "Plan method, fmt x fmt (float32 result)", low, columns, lambda f, t: method(f, f, t)
    )
    lines += _grid(
        "Plan method, bfloat16 x fmt (float32 result)",
        low,
        columns,
        lambda f, t: method("bfloat16", f, t),
    )
    lines += ["", _METHOD_LEGEND]
    if passed_over:
        lines.append(
            "native pairs planned another way (that route is faster by the target's rates):"
        )
        lines += [f"  {f} x {f} on {', '.join(ts)}" for f, ts in passed_over.items()]
    if fallbacks:
        lines.append(
            "native plans the host CPU cannot compile take another route when the program is "
            "lowered\nfor any other platform (Plan.fallback):"
        )
        lines += [
            f"  {pair} on {', '.join(ts)}: the {m} route off {platform}"
            for (pair, m, platform), ts in fallbacks.items()
        ]
    lines.append("Details of one pair: emulate explain LHS RHS --target T")
    print("\n".join(lines[1:]))
    return 0


# --------------------------------------------------------------------------- explain


def _add_explain(sub: argparse._SubParsersAction) -> None:
    from emulate.planning.plan import MODES

    p = sub.add_parser(
        "explain",
        help="the plan for one operand pair on one target, and why",
        description=(
            "Print emulate.plan(LHS, RHS, ...).explain(): the method, the types the matrix "
            "unit sees, the accumulator, the exact K-chunk, the numerics and the candidates "
            "considered with their rates."
        ),
    )
    p.add_argument("lhs", metavar="LHS", help="left operand format (name or alias)")
    p.add_argument("rhs", metavar="RHS", help="right operand format (name or alias)")
    p.add_argument(
        "--target",
        metavar="T",
        help="target name or alias; default: the current target (EMULATE_TARGET or detection)",
    )
    p.add_argument(
        "--out",
        metavar="DTYPE",
        help="preferred_element_type; default: what lax.dot_general returns for the pair",
    )
    p.add_argument("--mode", choices=MODES, default="fast", help="numerics mode (default fast)")
    p.set_defaults(func=_run_explain)


#: Formats that can be matmul operands (float8_e8m0fnu is a scale type).
_OPERAND_CHOICES = tuple(n for n in formats.MATMUL_OPERANDS if n != "int32")


def _any_format(
    name: str, parser: argparse.ArgumentParser, what: str, choices: Sequence[str]
) -> str:
    """The canonical name of format ``name`` (or alias), or a one-line usage error."""
    try:
        return formats.get(name).name
    except ValueError:
        parser.error(
            f"unknown {what} format {name!r} "
            f"(choose from {', '.join(choices)}, or an alias such as e4m3)"
        )


def _run_explain(args: argparse.Namespace) -> int:
    from emulate import targets
    from emulate.planning.plan import plan

    parser = args.parser
    lhs = _any_format(args.lhs, parser, "operand", _OPERAND_CHOICES)
    rhs = _any_format(args.rhs, parser, "operand", _OPERAND_CHOICES)
    out = None if args.out is None else _any_format(args.out, parser, "result", formats.names())
    target = None
    if args.target is not None:
        try:
            target = targets.get(args.target)
        except ValueError:
            parser.error(
                f"unknown target {args.target!r} (choose from {', '.join(targets.names())}, "
                "or an alias such as v5e)"
            )
    try:
        p = plan(lhs, rhs, target=target, preferred_element_type=out, mode=args.mode)
    except (NotImplementedError, ValueError, TypeError) as e:
        parser.error(" ".join(str(e).split()))
    print(p.explain())
    return 0


# --------------------------------------------------------------------------- validate


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _mode(text: str) -> str:
    from emulate.planning.plan import MODES

    if text not in MODES:
        raise argparse.ArgumentTypeError(f"expected {' or '.join(MODES)}, got {text!r}")
    return text


def _add_validate(sub: argparse._SubParsersAction) -> None:
    from emulate.validate import DEFAULT_EXAMPLES

    p = sub.add_parser(
        "validate",
        help="check every plan against the reference oracle with property-based tests",
        description=(
            "For each target, operand pair (each format with itself, and bfloat16 x each) and "
            "mode, run emulate.dot_general on hypothesis-drawn problems (special values, "
            "permuted dimension numbers, K = 1 to 1100) and compare every result with "
            "emulate.reference: bit for bit for the exact classes, within the mode 'fast' "
            "bound for the others. Prints one row per check; a failing row prints a shrunk, "
            "ready-to-run example. Exit status: 0 all passed, 1 a mismatch, 2 bad arguments."
        ),
    )
    p.add_argument(
        "--target",
        dest="targets",
        action="extend",
        nargs="+",
        metavar="T",
        help="targets to check (names or aliases such as v5e, or 'all'); default: the "
        "detected target and tpu_v4",
    )
    p.add_argument(
        "--formats",
        action="extend",
        nargs="+",
        metavar="F",
        help="operand formats (names or aliases); default: every low-precision format "
        "except float8_e8m0fnu",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        type=_mode,
        metavar="MODE",
        help="numerics modes to check: fast, exact (default: both)",
    )
    p.add_argument(
        "--examples",
        type=_positive_int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"hypothesis examples per row (default {DEFAULT_EXAMPLES})",
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the examples (default 0)"
    )
    p.add_argument("--json", metavar="PATH", help="also write the rows to PATH as JSON")
    p.add_argument(
        "--all-layouts",
        action="store_true",
        help="draw from every layout in every row; by default a compile-heavy row (mode "
        "exact for a pair outside the exact class) uses one program",
    )
    p.set_defaults(func=_run_validate)


def _validate_targets(names: Sequence[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    from emulate import targets
    from emulate.validate import default_targets

    if not names:
        try:
            return default_targets()
        except ValueError as e:
            parser.error(" ".join(str(e).split()))
    return _resolve_targets(names, parser, list(targets.names()), "unknown target")


def _resolve_targets(
    names: Sequence[str], parser: argparse.ArgumentParser, pool: list[str], problem: str
) -> list[str]:
    """Target names (aliases and "all" accepted) within ``pool``, or a one-line error."""
    from emulate import targets

    if any(n.lower() == "all" for n in names):
        return pool
    chosen = []
    for name in names:
        try:
            t = targets.get(name).name
        except ValueError:
            t = None
        if t not in pool:
            parser.error(
                f"{problem} {name!r} (choose from {', '.join(pool)}, all, or an alias such as v5e)"
            )
        chosen.append(t)
    return list(dict.fromkeys(chosen))


def _validate_formats(names: Sequence[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    from emulate.validate import default_formats

    if not names:
        return default_formats()
    choices = [n for n in _OPERAND_CHOICES]
    chosen = []
    for name in names:
        try:
            f = formats.get(name).name
        except ValueError:
            f = None
        if f not in choices:
            what = "not a matmul operand format" if f is not None else "unknown format"
            parser.error(
                f"{what} {name!r} (choose from {', '.join(choices)}, or an alias such as e4m3)"
            )
        chosen.append(f)
    return list(dict.fromkeys(chosen))


def _run_validate(args: argparse.Namespace) -> int:
    import json

    from emulate import validate

    parser = args.parser
    target_names = _validate_targets(args.targets, parser)
    format_names = _validate_formats(args.formats, parser)
    modes = list(dict.fromkeys(args.modes or ("fast", "exact")))
    out = None
    if args.json is not None:
        try:
            out = open(args.json, "w")  # noqa: SIM115 - kept open until the rows are written
        except OSError as e:
            parser.error(
                f"cannot write --json {args.json!r}: {e.strerror or e} (give a path to a file "
                "in an existing, writable directory)"
            )
    try:
        rows = _validate_with_progress(validate, target_names, format_names, modes, args)
        print(validate.render(rows))
        failed = [r for r in rows if r.status == "mismatch"]
        for r in failed:
            print(
                f"\nMISMATCH {r.target} {r.lhs} x {r.rhs} mode {r.mode!r}: {r.mismatches} of "
                f"{r.examples} examples broke the contract. Minimal example (hypothesis-shrunk):"
            )
            print(r.report)
            print("\n# --- reproducer: save as repro.py and run python repro.py ---")
            print(r.reproducer)
        if out is not None:
            payload = {
                "seed": args.seed,
                "examples": args.examples,
                "all_layouts": args.all_layouts,
                "targets": target_names,
                "formats": format_names,
                "modes": modes,
                "rows": [r.to_json() for r in rows],
            }
            try:
                json.dump(payload, out, indent=1)
                out.write("\n")
                out.close()  # a full device reports here, when the buffer is flushed
            except OSError as e:
                parser.error(f"cannot write --json {args.json!r}: {e.strerror or e}")
    finally:
        if out is not None and not out.closed:
            try:
                out.close()
            except OSError:
                pass  # reported above, or an earlier error is on its way
    return 1 if failed else 0


def _validate_with_progress(validate, target_names, format_names, modes, args):
    """``validate.run`` with a progress bar on stderr when it is a terminal."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    n = len(target_names) * len(validate.pairs(format_names)) * len(modes)
    progress = Progress(
        TextColumn("validate"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    with progress:
        task = progress.add_task("", total=n)

        def on_row(row, desc):
            if row is None:
                progress.update(task, description=desc)
            else:
                progress.advance(task)

        return validate.run(
            target_names,
            format_names,
            modes,
            examples=args.examples,
            seed=args.seed,
            all_layouts=args.all_layouts,
            on_row=on_row,
        )


# --------------------------------------------------------------------------- check-kernel


def _add_check_kernel(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-kernel",
        help="predict Mosaic's 'Unsupported matmul ... type' errors of Pallas kernels (no TPU)",
        description=(
            "Compile MODULE:FUNCTION for each TPU target with the real compiler (libtpu; "
            "without it, by the recorded probe's rules) and report what Mosaic refuses, at "
            "the tpu.matmul's source line, and the matmuls that compile only because "
            "compatibility mode converts them, with the fix (emulate.pallas.check). Exit "
            "status 1 on any finding, 2 when the kernel does not load or trace."
        ),
    )
    p.add_argument(
        "function",
        metavar="MODULE:FUNCTION",
        help="a module (pkg.kernels) or file (path/to/kernels.py), a colon, and the name of "
        "the function that calls pallas_call",
    )
    p.add_argument(
        "--target",
        dest="targets",
        action="extend",
        nargs="+",
        metavar="T",
        help="TPU targets (names or aliases such as v4, v7x, or 'all'); default: the current "
        "target (EMULATE_TARGET) if it is a TPU",
    )
    p.add_argument(
        "--shapes",
        metavar="SPEC",
        help="the function's arguments, comma-separated SHAPE:DTYPE, e.g. "
        "256x256:int8,256x256:int8 (':float32' is a scalar); default: no arguments",
    )
    p.add_argument(
        "--no-compat",
        dest="compat",
        action="store_false",
        help="check with Mosaic's compatibility mode off (--xla_mosaic_compat_mode=false); "
        "default: on, as libtpu runs",
    )
    p.set_defaults(func=_run_check_kernel)


def _tpu_targets(names: Sequence[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    from emulate import targets

    tpus = [n for n in targets.names() if targets.get(n).kind == "tpu"]
    if not names:
        try:
            current = targets.current_target()
        except ValueError as e:
            parser.error(" ".join(str(e).split()))
        if current.kind != "tpu":
            parser.error(f"the current target is {current.name}; pass --target (a TPU, or all)")
        return [current.name]
    return _resolve_targets(names, parser, tpus, "not a TPU target:")


def parse_shapes(spec: str) -> list:
    """``"256x256:int8,8:bf16"`` -> ``jax.ShapeDtypeStruct`` arguments (ValueError if malformed)."""
    import jax

    args = []
    for item in spec.split(","):
        dims, sep, dtype = item.strip().partition(":")
        if not sep or not dtype:
            raise ValueError(f"{item.strip()!r} is not SHAPE:DTYPE (e.g. 256x256:int8)")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            shape = None
        if shape is None or any(d <= 0 for d in shape):
            raise ValueError(f"shape {dims!r} is not positive integers joined by x")
        try:
            f = formats.get(dtype)
        except ValueError:
            raise ValueError(f"unknown dtype {dtype!r}") from None
        if not f.xla_storable:
            raise ValueError(f"{f.name} arrays cannot be XLA arguments; pass uint8 codes")
        args.append(jax.ShapeDtypeStruct(shape, f.dtype))
    return args


def _load_function(ref: str, parser: argparse.ArgumentParser) -> Callable:
    import importlib
    import importlib.util

    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr:
        parser.error(f"expected MODULE:FUNCTION, got {ref!r}")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            name = os.path.splitext(os.path.basename(module_name))[0]
            spec = importlib.util.spec_from_file_location(name, module_name)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {module_name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if name not in sys.modules:
                # So that its functions pickle by reference for a compiler subprocess
                # (--no-compat), which imports the module by name from the same sys.path.
                sys.modules[name] = module
                sys.path.append(os.path.dirname(os.path.abspath(module_name)))
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as e:
        parser.error(f"cannot import {module_name!r}: {e}")
    except Exception as e:  # noqa: BLE001 - any failure of the module's own code
        parser.error(f"cannot import {module_name!r}: {_one_line(e)}")
    obj: object = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            parser.error(f"{module_name!r} has no attribute {attr!r}")
    if not callable(obj):
        parser.error(f"{ref!r} is not callable")
    return obj


def _run_check_kernel(args: argparse.Namespace) -> int:
    import emulate.pallas

    parser = args.parser
    target_names = _tpu_targets(args.targets, parser)
    try:
        fn_args = parse_shapes(args.shapes) if args.shapes else []
    except ValueError as e:
        parser.error(f"--shapes: {e}")
    fn = _load_function(args.function, parser)
    _check_arity(fn, fn_args, args.function, parser)
    from emulate.pallas import mosaic_check

    found = 0
    for name in target_names:
        try:
            findings = emulate.pallas.check(fn, *fn_args, target=name, compat=args.compat)
        except Exception as e:  # noqa: BLE001 - a kernel that does not trace: exit 2
            parser.error(f"cannot trace {args.function!r} for {name}: {_one_line(e)}")
        try:
            count = len(emulate.pallas.matmul_sites(fn, *fn_args, target=name))
        except Exception:  # noqa: BLE001 - refused by Pallas: a finding, no sites
            count = 0
        found += len(findings)
        verdict = f"{len(findings)} finding{'s' * (len(findings) != 1)}" if findings else "ok"
        how = {
            "compiler": "compiler",
            "recorded": "recorded rules",
            "table": "JAX's table",
        }[findings[0].basis if findings else mosaic_check.basis(name)]
        compat = "compat on" if args.compat else "compat off"
        print(f"{name}: {count} tpu.matmul, {verdict} ({how}, {compat})")
        for f in findings:
            print(f)
    return 1 if found else 0


def _check_arity(fn, fn_args: list, ref: str, parser: argparse.ArgumentParser) -> None:
    """Refuse a --shapes list that ``fn``'s signature cannot take (too few or too many)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to check (a builtin or a C callable): tracing will tell
    try:
        sig.bind(*fn_args)
    except TypeError:
        params = [
            p.name
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        parser.error(
            f"--shapes: {ref!r} takes {len(params)} array argument(s) ({', '.join(params)}), "
            f"--shapes gave {len(fn_args)}; give one SHAPE:DTYPE per argument, e.g. "
            "--shapes 256x256:bfloat16,256x256:int8"
        )


def _one_line(e: BaseException) -> str:
    """``Type: first line of the message`` (no traceback)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


# --------------------------------------------------------------------------- registry

#: Every subcommand, in the order ``--help`` lists them. Add new ones here.
_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_formats,
    _add_targets,
    _add_explain,
    _add_validate,
    _add_check_kernel,
)


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
