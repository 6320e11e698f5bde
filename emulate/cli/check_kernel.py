"""``emulate check-kernel MODULE:FUNCTION``: Mosaic's operand-type errors, before a TPU.

Lowers a function's Pallas kernels for each TPU target and prints what Mosaic refuses at
each ``tpu.matmul`` (:func:`emulate.pallas.check`). Exit status 1 on any finding, 2 when
the arguments are bad or the kernel does not load or trace.

With a compatibility setting other than this process's (``--no-compat``; libtpu reads the
setting once, when it loads), the command runs again in a fresh process with that setting,
which loads MODULE:FUNCTION itself and compiles there: the real compiler decides whether or
not the function pickles (the API's subprocess needs it to). Where the recorded rules
decide all the same (no libtpu), each target's line says so and names the operations those
rules do not see.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

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
    status = _in_a_process_with_the_setting(args, target_names)
    if status is not None:
        return status
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
        if report.basis != "compiler":
            print(f"  note: {_unseen_by_rules(mosaic_check)}")
        for f in findings:
            print(f)
    return 1 if found else 0


#: Set in the environment of the fresh process :func:`_in_a_process_with_the_setting`
#: starts, so that it checks rather than starting another.
CHILD_VARIABLE = "EMULATE_CHECK_KERNEL_SETTING"


def _in_a_process_with_the_setting(args: argparse.Namespace, names: list[str]) -> int | None:
    """Where ``args.compat`` is not this process's compatibility setting and libtpu is
    installed: run the same check in a fresh process with that setting (it loads the
    function and compiles in-process), pass its output through and return its exit
    status. None to check here: the setting is this process's, libtpu is absent, or the
    fresh process died (then the API's own subprocess, or the recorded rules, decide)."""
    from emulate import compiler
    from emulate.compiler.devices import is_libtpu_noise
    from emulate.compiler.isolate import child_env

    if os.environ.get(CHILD_VARIABLE) or args.compat == compiler.compat_mode():
        return None
    if compiler.libtpu_version() is None:
        return None
    argv = [sys.executable, "-m", "emulate", "check-kernel", args.function, "--target", *names]
    argv += ["--shapes", args.shapes] if args.shapes else []
    argv += [] if args.compat else ["--no-compat"]
    env = child_env(args.compat)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [root] + [os.path.abspath(p or os.curdir) for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env[CHILD_VARIABLE] = "1"
    ran = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if ran.returncode not in (0, 1, 2):  # killed (an abort inside libtpu): check here
        return None
    sys.stdout.write(ran.stdout)
    sys.stderr.write("".join(ln for ln in ran.stderr.splitlines(True) if not is_libtpu_noise(ln)))
    return ran.returncode


def _unseen_by_rules(mosaic_check: Any) -> str:
    """What the recorded rules decide, and the operations they do not see."""
    ops = ", ".join(mosaic_check.op_rules.CHECKED_OPS)
    return (
        "decided without the compiler, by rules that see each tpu.matmul's operand and "
        f"accumulator types only: conversions, comparisons and transposes on types narrower "
        f"than 32 bits ({ops}; an in-kernel activation quantizer's f32 -> int8 astype is an "
        "arith.fptosi) are not checked; install libtpu (pip install 'jax[tpu]') for the "
        "compiler's verdict"
    )


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
