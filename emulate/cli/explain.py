"""``emulate explain LHS RHS [--target T] [--out DTYPE] [--mode fast|exact]``: one plan."""

from __future__ import annotations

import argparse

from emulate import formats
from emulate.cli.args import OPERAND_CHOICES, format_name, target
from emulate.planning.plan import MODES, plan

__all__ = ["add", "run"]


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``emulate explain``."""
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the plan's explanation; exit status 0."""
    parser = args.parser
    lhs = format_name(args.lhs, parser, "operand", OPERAND_CHOICES)
    rhs = format_name(args.rhs, parser, "operand", OPERAND_CHOICES)
    out = None if args.out is None else format_name(args.out, parser, "result", formats.names())
    t = None if args.target is None else target(args.target, parser)
    try:
        p = plan(lhs, rhs, target=t, preferred_element_type=out, mode=args.mode)
    except (NotImplementedError, ValueError, TypeError) as e:
        parser.error(" ".join(str(e).split()))
    print(p.explain())
    return 0
