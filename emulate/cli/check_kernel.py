"""``emulate check-kernel MODULE:FUNCTION``: Mosaic's operand-type errors, before a TPU.

Lowers a function's Pallas kernels for each TPU target and prints what Mosaic refuses at
each ``tpu.matmul`` (:func:`emulate.pallas.check`). Exit status 1 on any finding, 2 when
the arguments are bad or the kernel does not load or trace.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable

from emulate.cli.args import parse_shapes, tpu_target_names

__all__ = ["add", "run"]


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``emulate check-kernel``."""
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the kernel on each target; exit status 1 on any finding."""
    from emulate.pallas.checking import mosaic_check

    parser = args.parser
    target_names = tpu_target_names(args.targets, parser)
    try:
        fn_args = parse_shapes(args.shapes) if args.shapes else []
    except ValueError as e:
        parser.error(f"--shapes: {e}")
    fn = _load_function(args.function, parser)
    _check_arity(fn, fn_args, args.function, parser)
    found = 0
    for name in target_names:
        try:
            (report,) = mosaic_check.reports([(fn, fn_args, name)], compat=args.compat)
        except Exception as e:  # noqa: BLE001 - a kernel that does not trace: exit 2
            parser.error(f"cannot trace {args.function!r} for {name}: {_one_line(e)}")
        findings = report.findings
        found += len(findings)
        verdict = f"{len(findings)} finding{'s' * (len(findings) != 1)}" if findings else "ok"
        how = {"compiler": "compiler", "recorded": "recorded rules", "table": "JAX's table"}
        compat = "compat on" if args.compat else "compat off"
        count = len(report.matmuls)
        print(f"{name}: {count} tpu.matmul, {verdict} ({how[report.basis]}, {compat})")
        if report.empty:
            print(f"  warning: {report.empty}")
        for f in findings:
            print(f)
    return 1 if found else 0


def _load_function(ref: str, parser: argparse.ArgumentParser) -> Callable:
    """The callable ``ref`` names (``pkg.module:name`` or ``path/to/file.py:name``, the name
    dotted for an attribute of an attribute), or a one-line usage error."""
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


def _check_arity(fn, fn_args: list, ref: str, parser: argparse.ArgumentParser) -> None:
    """Refuse a --shapes list that ``fn``'s signature cannot take (too few or too many)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to check (a builtin or a C callable): tracing will tell
    keyword_only = [
        p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY and p.default is p.empty
    ]
    if keyword_only:
        names = ", ".join(keyword_only)
        parser.error(
            f"--shapes: {ref!r} has required keyword-only argument(s) ({names}), which "
            "--shapes cannot give; check a module-level function of the arrays alone that "
            f"passes them, e.g. def f(x, y): return fn(x, y, {keyword_only[0]}=...)"
        )
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
