"""Sphinx extension: pages generated from the code when the docs are built.

The files under ``docs/_generated/`` are committed (so that GitHub shows them) and the
build includes them as they are; ``python docs/_ext/emulate_docs.py`` writes them again,
and tests/test_docs.py fails when they differ from what the code prints now
(:func:`comparable`: the timings of ``validate.txt`` left out). They are:

- ``targets.txt``: the output of ``python -m emulate targets`` (native pairs and the plan
  each format gets, per target), included by targets.md;
- ``mosaic.txt``: :func:`emulate.mosaic.render`, the recorded probe of the real compiler;
- ``validate.txt``: a short ``python -m emulate validate`` run, shown by quickstart.md;
- ``cli.md``: the ``--help`` text of ``emulate`` and of every subcommand, included by
  cli.md.

So the capability tables and the CLI reference are never typed by hand. On
``source-read`` of the index it adds to the toctree every other page in docs/ (pages that
other work adds, such as performance.md), so that no page is left out of the navigation.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import sys
from typing import Any

#: Where the generated files are committed.
GENERATED = pathlib.Path(__file__).resolve().parent.parent / "_generated"

#: The pages the index's toctree names itself, in order.
PAGES = (
    "quickstart",
    "testing",
    "porting",
    "quantized",
    "numerics",
    "targets",
    "cli",
    "api",
    "architecture",
)


def _capture(argv: list[str]) -> str:
    from emulate import cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # --help exits 0
            code = e.code
    if code not in (0, None):
        raise RuntimeError(f"emulate {' '.join(argv)} exited with {code}")
    return buf.getvalue()


def write_generated(out: pathlib.Path) -> None:
    """Write the generated files into ``out``."""
    from emulate import cli, mosaic

    out.mkdir(parents=True, exist_ok=True)
    (out / "targets.txt").write_text(_capture(["targets"]))
    (out / "mosaic.txt").write_text(mosaic.render())
    validate = ["validate", "--target", "cpu", "tpu_v4", "--formats", "int4", "e4m3fn"]
    (out / "validate.txt").write_text(_capture([*validate, "--examples", "4"]))
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps help text to the terminal width
    try:
        commands = list(cli.build_parser().get_default("commands"))
        parts = ["## emulate\n", "```text", _capture(["--help"]).rstrip(), "```"]
        for name in commands:
            parts += [f"\n## emulate {name}\n", "```text", _capture([name, "--help"]).rstrip()]
            parts.append("```")
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    (out / "cli.md").write_text("\n".join(parts) + "\n")


# The last column of validate.txt: seconds per row ("3.5s", "=cpu"), its header and rule.
_TIME_COLUMN = re.compile(r"\s+(\d+(\.\d+)?s|=\S+|-+|time)$")


def comparable(name: str, text: str) -> str:
    """``text`` of the generated file ``name`` without what changes from run to run: the
    time column of ``validate.txt``."""
    if name != "validate.txt":
        return text
    return "\n".join(_TIME_COLUMN.sub("", line) for line in text.splitlines())


def _complete_toctree(app: Any, docname: str, source: list[str]) -> None:
    if docname != "index":
        return
    srcdir = pathlib.Path(app.srcdir)
    extra = sorted(p.stem for p in srcdir.glob("*.md") if p.stem not in PAGES and p.stem != "index")
    marker = ":caption: Contents\n"
    if extra and marker in source[0]:
        head, tail = source[0].split(marker, 1)
        listed, rest = tail.split("```", 1)
        source[0] = head + marker + listed + "".join(f"{e}\n" for e in extra) + "```" + rest


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _complete_toctree)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.path.insert(0, str(GENERATED.parent.parent))
    write_generated(GENERATED)
    print(f"wrote {', '.join(sorted(p.name for p in GENERATED.iterdir()))} in {GENERATED}")
