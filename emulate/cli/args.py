"""Argument types and validators shared by the subcommands.

Each validator takes the raw strings argparse collected and the sub-parser they came from,
and returns canonical names (aliases resolved, repeats dropped) or stops with
``parser.error``: one line, ``emulate <command>: error: <problem> (choose from ...)``, exit
status 2. :func:`positive_int` and :func:`mode` are argparse ``type=`` functions, whose
errors argparse words as ``argument --option: <problem>``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import jax

from emulate import formats, targets
from emulate.planning.plan import MODES
from emulate.validate import default_formats, default_targets

__all__ = [
    "OPERAND_CHOICES",
    "format_name",
    "low_precision",
    "mode",
    "operand_formats",
    "output_file",
    "parse_shapes",
    "positive_int",
    "target",
    "target_names",
    "tpu_target_names",
    "write_output",
]

#: Formats that can be matmul operands (float8_e8m0fnu is a scale type).
OPERAND_CHOICES = tuple(n for n in formats.MATMUL_OPERANDS if n != "int32")


def positive_int(text: str) -> int:
    """``text`` as an integer of at least 1 (an argparse ``type=``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def mode(text: str) -> str:
    """``text`` if it is a numerics mode, "fast" or "exact" (an argparse ``type=``)."""
    if text not in MODES:
        raise argparse.ArgumentTypeError(f"expected {' or '.join(MODES)}, got {text!r}")
    return text


def low_precision(name: str, parser: argparse.ArgumentParser) -> formats.Format:
    """The low-precision format ``name`` (or alias), or a one-line usage error."""
    try:
        f = formats.get(name)
    except ValueError as e:
        if " is not built: " in str(e):  # a P3109 name the record refuses, with the reason
            parser.error(str(e).removeprefix("fmt: "))
        f = None
    if f is None or not f.is_low_precision:
        parser.error(
            f"unknown low-precision format {name!r} "
            f"(choose from {', '.join(formats.LOW_PRECISION + formats.registered())}, "
            "or an alias such as e4m3)"
        )
    return f


def format_name(
    name: str, parser: argparse.ArgumentParser, what: str, choices: Sequence[str]
) -> str:
    """The canonical name of format ``name`` (or alias), or a one-line usage error naming
    it the unknown ``what`` format and listing ``choices``."""
    try:
        return formats.get(name).name
    except ValueError:
        parser.error(
            f"unknown {what} format {name!r} "
            f"(choose from {', '.join(choices)}, or an alias such as e4m3)"
        )


def operand_formats(names: Sequence[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    """Operand format names (aliases accepted, repeats dropped) among
    :data:`OPERAND_CHOICES`; default: :func:`emulate.validate.default_formats`."""
    if not names:
        return default_formats()
    chosen = []
    for name in names:
        try:
            f = formats.get(name).name
        except ValueError:
            f = None
        if f not in OPERAND_CHOICES:
            what = "not a matmul operand format" if f is not None else "unknown format"
            parser.error(
                f"{what} {name!r} (choose from {', '.join(OPERAND_CHOICES)}, or an alias "
                "such as e4m3)"
            )
        chosen.append(f)
    return list(dict.fromkeys(chosen))


def target(name: str, parser: argparse.ArgumentParser) -> targets.Target:
    """The target ``name`` (or alias), or a one-line usage error."""
    try:
        return targets.get(name)
    except ValueError:
        parser.error(
            f"unknown target {name!r} (choose from {', '.join(targets.names())}, "
            "or an alias such as v5e)"
        )


def target_names(names: Sequence[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    """Target names (aliases and "all" accepted, repeats dropped); default:
    :func:`emulate.validate.default_targets` (the current target and tpu_v4)."""
    if not names:
        try:
            return default_targets()
        except ValueError as e:  # a bad EMULATE_TARGET
            parser.error(" ".join(str(e).split()))
    return _within(names, parser, list(targets.names()), "unknown target")


def tpu_target_names(names: Sequence[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    """TPU target names (aliases and "all" accepted, repeats dropped); default: the
    current target, which must then be a TPU."""
    tpus = [n for n in targets.names() if targets.get(n).kind == "tpu"]
    if not names:
        try:
            current = targets.current_target()
        except ValueError as e:
            parser.error(" ".join(str(e).split()))
        if current.kind != "tpu":
            parser.error(f"the current target is {current.name}; pass --target (a TPU, or all)")
        return [current.name]
    return _within(names, parser, tpus, "not a TPU target:")


def _within(
    names: Sequence[str], parser: argparse.ArgumentParser, pool: list[str], problem: str
) -> list[str]:
    """Target names (aliases and "all" accepted) within ``pool``, or a one-line error."""
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


def output_file(path: str, option: str, parser: argparse.ArgumentParser) -> str:
    """``path`` if a file can be written there, checked before any long work starts by
    opening it for appending (a file this creates is removed again), or a one-line usage
    error: an empty path, a directory, a directory that does not exist or cannot be
    written. :func:`write_output` writes it at the end."""
    if not path:
        parser.error(f"{option}: expected a path to a file, got ''")
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        parser.error(
            f"cannot write {option} {path!r}: {e.strerror or e} (give a path to a file in an "
            "existing, writable directory)"
        )
    if not existed:
        os.remove(path)
    return path


def write_output(text: str, path: str, option: str, parser: argparse.ArgumentParser) -> None:
    """Write ``text`` to ``path`` (checked by :func:`output_file`), or a one-line usage
    error (a full device reports when the buffer is flushed, at the close)."""
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as e:
        parser.error(f"cannot write {option} {path!r}: {e.strerror or e}")


def parse_shapes(spec: str) -> list:
    """``"256x256:int8,8:bf16"`` -> ``jax.ShapeDtypeStruct`` arguments (ValueError if malformed)."""
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
