"""``emulate validate --fn module:function --pair LHS RHS``: the differential harness
(:func:`emulate.testing.check_function`) on your own kernel, from the command line.

The function is imported by ``module:qualname`` (the current directory is searched first)
and called as ``fn(lhs, rhs)`` on drawn ``(M, K) x (K, N)`` operands; an operand is a
format name (an array of that dtype) or an :data:`emulate.mx.SCHEMES` name (a QArray,
blocked along K). Prints one line per target, and for a failure its report and
reproducer. Exit status: 0 all passed, 1 a failure, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from emulate import targets, testing
from emulate.cli.args import OPERAND_CHOICES, format_name, target_names
from emulate.quantized import mx
from emulate.testing.report import render_html, render_json

__all__ = ["add_arguments", "load_function", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``emulate validate --fn``."""
    p.add_argument(
        "--fn",
        metavar="MODULE:FUNCTION",
        help="check your own function instead of emulate's plans: it is called as "
        "fn(lhs, rhs) on drawn operands (with --pair) and compared with the reference",
    )
    p.add_argument(
        "--pair",
        nargs=2,
        metavar=("LHS", "RHS"),
        help="with --fn: the operands, each a format (int8, bfloat16, float8_e4m3fn, ...) or "
        f"a quantization scheme ({', '.join(mx.SCHEMES)}), blocked along K",
    )
    p.add_argument(
        "--contract",
        default="exact",
        metavar="C",
        help="with --fn: exact (bit for bit, default), fast (emulate's mode-fast bound) or a "
        "number: the largest |result - exact sum| allowed",
    )
    p.add_argument(
        "--extra-roundings",
        type=int,
        default=0,
        metavar="N",
        help="with --fn and --contract fast: further float32 roundings your kernel makes",
    )
    p.add_argument("--html", metavar="PATH", help="with --fn: also write an HTML report")
    p.add_argument(
        "--tpu-numerics",
        action="store_true",
        help="with --fn: run your function as emulate.testing.tpu_numerics rewrites it for "
        "each --target (TPU targets only): every matmul rounds as that TPU's does",
    )


def load_function(spec: str, parser: argparse.ArgumentParser) -> Callable[..., Any]:
    """The function named ``module:qualname``, or a one-line usage error."""
    module, sep, qualname = spec.partition(":")
    if not sep or not module or not qualname:
        parser.error(f"--fn: expected MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except ImportError as e:
        parser.error(f"--fn: cannot import {module!r}: {e}")
    except AttributeError:
        parser.error(f"--fn: module {module!r} has no {qualname!r}")
    if not callable(obj):
        parser.error(f"--fn: {spec} is a {type(obj).__name__}, not a function")
    return obj


def _operand(name: str, side: str, parser: argparse.ArgumentParser) -> Any:
    if name in mx.SCHEMES:
        return testing.quantized(mx.SCHEMES[name], axis=-1 if side == "lhs" else 0)
    return format_name(name, parser, f"--pair {side}", [*OPERAND_CHOICES, *mx.SCHEMES])


def _contract(text: str, parser: argparse.ArgumentParser) -> str | float:
    if text in ("exact", "fast"):
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        parser.error(f"--contract: expected exact, fast or a non-negative number, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Check ``args.fn`` on every target given; exit status 1 on a failure."""
    parser = args.parser
    if not args.pair:
        parser.error("--fn needs --pair LHS RHS: the operands' formats or schemes")
    fn = load_function(args.fn, parser)
    lhs = _operand(args.pair[0], "lhs", parser)
    rhs = _operand(args.pair[1], "rhs", parser)
    contract = _contract(args.contract, parser)
    chosen: list[str | None] = list(target_names(args.targets, parser)) if args.targets else [None]
    if args.tpu_numerics:
        chosen_targets = [targets.current_target(t) for t in chosen]
        if others := [t.name for t in chosen_targets if t.kind != "tpu"]:
            parser.error(
                f"--tpu-numerics: needs TPU targets (--target v4 v5e ...); got {', '.join(others)}"
            )
    with testing.collect_results() as results:
        for t in chosen:
            try:
                testing.check_function(
                    fn,
                    lhs,
                    rhs,
                    contract=contract,
                    target=t,
                    examples=args.examples,
                    seed=args.seed,
                    extra_roundings=args.extra_roundings,
                    tpu_numerics=args.tpu_numerics,
                )
            except AssertionError as e:
                print(f"FAILED on {results[-1].target}: {e}\n")
                continue
            r = results[-1]
            worst = f", err/bound {max(r.ratios):.3g}" if r.ratios else ""
            print(
                f"ok {r.name} on {r.target}: {r.examples} examples, max {r.max_ulps:g} ulps{worst}"
            )
    entries = [(f"{args.fn} on {r.target}", r) for r in results]
    if args.json:
        pathlib.Path(args.json).write_text(render_json(entries))
    if args.html:
        pathlib.Path(args.html).write_text(render_html(entries, title=args.fn))
    return 0 if all(r.ok for r in results) else 1
