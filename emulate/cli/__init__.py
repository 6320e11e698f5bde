"""The ``emulate`` command line.

One module per subcommand, each with an ``add(sub)`` that builds its sub-parser and sets
``run`` (a ``Namespace -> int`` handler) as its ``func``; ``_SUBCOMMANDS`` lists them
in the one place where a new subcommand is registered. Argument types and validators that
the subcommands share live in :mod:`emulate.cli.args`. The subcommands:

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
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from emulate.cli import check_kernel, explain, formats, targets, validate
from emulate.cli.args import parse_shapes
from emulate.compiler import devices as tpu_devices

__all__ = ["build_parser", "main", "parse_shapes"]

Handler = Callable[[argparse.Namespace], int]

#: Every subcommand's ``add``, in the order ``--help`` lists them. Add new ones here.
_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    formats.add,
    targets.add,
    explain.add,
    validate.add,
    check_kernel.add,
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


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
    # On a machine without a TPU, libtpu's start-up warnings would open every command's
    # stderr; nothing else is silenced (tpu_devices.skip_absent_tpu_backend says when).
    tpu_devices.skip_absent_tpu_backend()
    try:
        return handler(args)
    except BrokenPipeError:
        # Output piped into e.g. `head`: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
