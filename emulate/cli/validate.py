"""``emulate validate``: property-based checks of every plan against the reference oracle.

Runs :func:`emulate.validate.run` over targets, operand pairs and modes, prints
:func:`emulate.validate.render`'s table, then a shrunk example and a ready-to-run
reproducer for each failing row. Exit status: 0 all passed, 1 a mismatch, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json

from emulate import validate
from emulate.cli import validate_fn
from emulate.cli.args import (
    mode,
    operand_formats,
    output_file,
    positive_int,
    target_names,
    write_output,
)
from emulate.validate import DEFAULT_EXAMPLES

__all__ = ["add", "run"]


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``emulate validate``."""
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
        type=mode,
        metavar="MODE",
        help="numerics modes to check: fast, exact (default: both)",
    )
    p.add_argument(
        "--examples",
        type=positive_int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"hypothesis examples per row (default {DEFAULT_EXAMPLES})",
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the examples (default 0)"
    )
    p.add_argument("--json", metavar="PATH", help="also write the rows to PATH as JSON")
    validate_fn.add_arguments(p)
    p.add_argument(
        "--all-layouts",
        action="store_true",
        help="draw from every layout in every row; by default a compile-heavy row (mode "
        "exact for a pair outside the exact class) uses one program",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the checks and print their table; exit status 1 on any mismatch."""
    parser = args.parser
    if args.fn is not None:
        return validate_fn.run(args)
    if args.pair is not None:
        parser.error("--pair needs --fn MODULE:FUNCTION (emulate's own plans take --formats)")
    if args.tpu_numerics:
        parser.error("--tpu-numerics needs --fn MODULE:FUNCTION (it rewrites your function)")
    chosen_targets = target_names(args.targets, parser)
    chosen_formats = operand_formats(args.formats, parser)
    modes = list(dict.fromkeys(args.modes or ("fast", "exact")))
    out = None if args.json is None else output_file(args.json, "--json", parser)
    rows = _run_with_progress(chosen_targets, chosen_formats, modes, args)
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
            "targets": chosen_targets,
            "formats": chosen_formats,
            "modes": modes,
            "rows": [r.to_json() for r in rows],
        }
        write_output(json.dumps(payload, indent=1) + "\n", out, "--json", parser)
    return 1 if failed else 0


def _run_with_progress(
    chosen_targets: list[str], chosen_formats: list[str], modes: list[str], args: argparse.Namespace
) -> list[validate.Row]:
    """:func:`emulate.validate.run` with a progress bar on stderr when it is a terminal."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    n = len(chosen_targets) * len(validate.pairs(chosen_formats)) * len(modes)
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

        def on_row(row: validate.Row | None, desc: str) -> None:
            if row is None:
                progress.update(task, description=desc)
            else:
                progress.advance(task)

        return validate.run(
            chosen_targets,
            chosen_formats,
            modes,
            examples=args.examples,
            seed=args.seed,
            all_layouts=args.all_layouts,
            on_row=on_row,
        )
