"""``emulate targets [--target T ...] [--probe [--out PATH]]``: native pairs and plans.

Prints :func:`emulate.capabilities.render_matrix` (native / emulated operand pairs per target and
format), where JAX's table and the compiler disagree, then two
:func:`emulate.planning.matrix.method_matrix` grids: the plan method each format gets
against itself and against bfloat16, with the native pairs planned another way and the
fallbacks of native plans. ``--probe`` reruns the real compiler's probe instead.
"""

from __future__ import annotations

import argparse
import pathlib
import textwrap
from collections.abc import Sequence

from emulate import capabilities, formats, targets
from emulate.cli.args import output_file, target, write_output
from emulate.planning.matrix import MethodCell, method_matrix
from emulate.tables import WIDTH, grid, short_target

__all__ = ["add", "run"]

_METHOD_LEGEND = (
    "method: native = operands go to the matrix unit as they are; int8 = decoded to int8 after "
    "an\nexact power-of-two scaling, int32 accumulation; bf16 / f32 = decoded exactly to that "
    "type,\nf32 accumulation; none = no route on that target."
)


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``emulate targets``."""
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the tables (exit status 0), or run the probe (``--probe``)."""
    if args.probe:
        return _run_probe(args)
    if args.out is not None:
        args.parser.error("--out goes with --probe")
    chosen = [target(name, args.parser) for name in args.targets or targets.names()]
    names = list(dict.fromkeys(t.name for t in chosen))
    operands = [f for f in targets.OPERANDS if f not in formats.SCALE_ONLY]
    lines = capabilities.render_matrix(names, operands).splitlines()
    lines.append("float8_e8m0fnu, a scale type and never a matmul operand, is left out.")
    lines += _table_disagreements([targets.get(n) for n in names], operands)
    low = list(formats.LOW_PRECISION_OPERANDS)
    same = method_matrix(names, low)
    weight = method_matrix(names, low, lhs="bfloat16")
    for title, cells in (
        ("Plan method, fmt x fmt (float32 result)", same),
        ("Plan method, bfloat16 x fmt (float32 result)", weight),
    ):
        lines += ["", _method_grid(title, cells, names, low)]
    lines += ["", _METHOD_LEGEND]
    lines += _method_notes(same, weight, names, low)
    lines.append("Details of one pair: emulate explain LHS RHS --target T")
    print("\n".join(lines))
    return 0


def _method_grid(
    title: str, cells: list[MethodCell], names: Sequence[str], low: Sequence[str]
) -> str:
    """The methods of ``cells`` as :func:`emulate.tables.grid` tables: formats as rows."""
    kinds = {n: "tpu" if targets.get(n).kind == "tpu" else "other" for n in names}
    columns = [(short_target(n), kinds[n]) for n in names]
    return grid(title, low, columns, {(c.rhs, short_target(c.target)): c.method for c in cells})


def _method_notes(
    same: list[MethodCell], weight: list[MethodCell], names: Sequence[str], low: Sequence[str]
) -> list[str]:
    """Lines naming the native pairs planned another way, and the fallbacks of native plans
    (pairs in the order of the tables' rows, targets in the order of their columns)."""
    order = {(f, n): i for i, (f, n) in enumerate((f, n) for f in low for n in names)}
    passed_over: dict[str, list[str]] = {}
    fallbacks: dict[tuple[str, str, str | None], list[str]] = {}
    for cells in (same, weight):
        for c in sorted(cells, key=lambda c: order[c.rhs, c.target]):
            if c.passed_over and c.lhs == c.rhs:
                passed_over.setdefault(c.lhs, []).append(short_target(c.target))
            if c.fallback is not None:
                key = (f"{c.lhs} x {c.rhs}", c.fallback, c.platform)
                fallbacks.setdefault(key, []).append(short_target(c.target))
    lines = []
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
    return lines


def _table_disagreements(chosen: Sequence[targets.Target], operands: Sequence[str]) -> list[str]:
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
            out += textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent="    ")
    if out:
        out.insert(
            0, "where JAX's table and the compiler disagree (native = compiles, compat off):"
        )
    return out


def _run_probe(args: argparse.Namespace) -> int:
    """Check the targets and the output path, then run the probe (about a minute)."""
    from emulate import compiler

    parser = args.parser
    names = [target(name, parser) for name in args.targets or ()]
    for t in names:
        if t.kind != "tpu":
            parser.error(f"--probe: the TPU compiler compiles for TPU targets only, got {t.name}")
    out = None if args.out is None else output_file(args.out, "--out", parser)
    try:
        offered = compiler.generations()
    except compiler.CompilerUnavailable as e:
        parser.error(f"--probe: {' '.join(str(e).split())}")
    for t in names:
        if t.name not in offered:
            parser.error(
                f"--probe: libtpu {compiler.libtpu_version()} has no compile-only device for "
                f"{t.name} (choose from {', '.join(offered)})"
            )
    result = compiler.probe(list(dict.fromkeys(t.name for t in names)) or None)
    text, changed = compiler.report(result)
    print(text)
    if out is not None:
        write_output(result.to_json(), out, "--out", parser)
        print(f"wrote {pathlib.Path(out)}")
    return 1 if changed else 0
