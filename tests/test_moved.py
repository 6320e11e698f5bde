"""Every module path and public name any version of the docs named still imports.

:data:`DOCUMENTED` lists the paths the docs gave that have moved since (read from ``git
log -p -- docs/ README.md``); each imports as it did, with a DeprecationWarning naming the
new path, and is the object at the new path. :func:`test_every_name_the_docs_ever_gave`
reads the history itself where the checkout has it and resolves every ``emulate.``
name, ``emulate/`` module path, ``automodule`` member and ``from emulate... import`` the
docs ever held.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

import emulate
import emulate.pallas
from emulate import moved
from emulate.pallas.checking import mosaic_check

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: (old path, new path): what the docs named before it moved.
DOCUMENTED = [
    ("emulate.codecs", "emulate.numerics.codecs"),
    ("emulate.codecs.decode", "emulate.numerics.codecs.decode"),
    ("emulate.exact", "emulate.engine.exact"),
    ("emulate.exact.cost", "emulate.planning.slicing.cost"),
    ("emulate.tiled", "emulate.engine.tiled"),
    ("emulate.tiled.choose", "emulate.engine.tiled.tiling_for"),
    ("emulate.engine.tiled.choose", "emulate.engine.tiled.tiling_for"),
    ("emulate.tiled.settings", "emulate.engine.tiled.settings"),
    ("emulate.tiled.Settings", "emulate.engine.tiled.Settings"),
    ("emulate.qparts", "emulate.quantized.values"),
    ("emulate.qparts.broadcast_blocks", "emulate.quantized.values.broadcast_blocks"),
    ("emulate.pallas.mosaic_check", "emulate.pallas.checking.mosaic_check"),
    ("emulate.pallas.mosaic_check.check_many", "emulate.pallas.checking.mosaic_check.check_many"),
    ("emulate.pallas.mosaic_check.reports", "emulate.pallas.checking.mosaic_check.reports"),
    (
        "emulate.pallas.mosaic_check.RecordedRulesWarning",
        "emulate.pallas.checking.mosaic_check.RecordedRulesWarning",
    ),
    (
        "emulate.pallas.mosaic_check.NoMatmulWarning",
        "emulate.pallas.checking.mosaic_check.NoMatmulWarning",
    ),
    ("emulate.pallas.findings", "emulate.pallas.checking.findings"),
    ("emulate.pallas.op_rules", "emulate.pallas.checking.op_rules"),
    ("emulate.pallas.sites", "emulate.pallas.checking.sites"),
    ("emulate.pallas.qblocks", "emulate.pallas.qsteps"),
    ("emulate.compiler.verdict", "emulate.mosaic.verdict"),
    ("emulate.compiler.Verdict", "emulate.mosaic.Verdict"),
    ("emulate.conv.PaddingError", "emulate.engine.conv_args.PaddingError"),
    ("emulate.engine.args.PaddingError", "emulate.engine.conv_args.PaddingError"),
    ("emulate.route_setting", "emulate.routing.setting"),
    ("emulate.route_setting.use_cpu_kernel", "emulate.routing.setting.use_cpu_kernel"),
    ("emulate.pallas.route", "emulate.pallas.compute"),
    ("emulate.pallas.route.route", "emulate.pallas.compute.in_kernel"),
    ("emulate.pallas.route.Route", "emulate.pallas.compute.Compute"),
    ("emulate.kernel_route.partitioned_over", "emulate.sharding.partitioned_over"),
    ("emulate.scaled.dot_general", "emulate.dot_general"),
    ("emulate.scaled.scaled_dot_general", "emulate.scaled_dot_general"),
]


def _forget(module: str) -> None:
    """Drop an old module path's stand-in from ``sys.modules`` and its parent, so that the
    next import goes through the finder (and warns) again."""
    if module in moved.MODULES:
        sys.modules.pop(module, None)
        parent, _, child = module.rpartition(".")
        vars(sys.modules[parent]).pop(child, None)


def _moved_from(old: str) -> str:
    """The warning an old path gives: its own move, or its module's."""
    if old in moved.NAMES:
        return f"{old} moved to {moved.NAMES[old]};"
    module = old if old in moved.MODULES else old.rpartition(".")[0]
    return f"{module} moved to {moved.MODULES[module][0]};"


@pytest.mark.parametrize(("old", "new"), DOCUMENTED, ids=[o for o, _ in DOCUMENTED])
def test_a_moved_path_imports_and_names_its_new_home(old, new):
    _forget(old if old in moved.MODULES else old.rpartition(".")[0])
    with pytest.warns(DeprecationWarning) as caught:
        got = moved.resolve(old)
    if old in moved.MODULES:  # a stand-in that hands out the new module's names
        home = importlib.import_module(new)
        assert got.__name__ == old and set(home.__all__) <= set(got.__all__)
        assert all(getattr(got, n) is getattr(home, n) for n in home.__all__)
    else:
        assert got is moved.resolve(new)
    assert _moved_from(old) in [str(w.message).split(" the old")[0] for w in caught]


def test_old_module_paths_import_with_the_import_statement():
    _forget("emulate.pallas.mosaic_check")
    with pytest.warns(
        DeprecationWarning,
        match=r"^emulate\.pallas\.mosaic_check moved to emulate\.pallas\.checking\.mosaic_check;",
    ):
        from emulate.pallas.mosaic_check import NoMatmulWarning, RecordedRulesWarning, check_many
    assert (RecordedRulesWarning, NoMatmulWarning, check_many) == (
        mosaic_check.RecordedRulesWarning,
        mosaic_check.NoMatmulWarning,
        mosaic_check.check_many,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # imported once: no second warning
        import emulate.pallas.mosaic_check as again
    assert again.check is mosaic_check.check
    assert "reports" in dir(again) and "reports" in again.__all__


def test_a_name_no_home_has_is_an_attribute_error():
    _forget("emulate.tiled")
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("emulate.tiled")
    with pytest.raises(
        AttributeError,
        match=r"^module 'emulate\.tiled' \(moved to emulate\.engine\.tiled\) has no attribute "
        r"'nothing'$",
    ):
        old.nothing  # noqa: B018
    with pytest.raises(AttributeError, match=r"^module 'emulate\.conv' has no attribute 'nope'$"):
        emulate.conv.nope  # type: ignore[attr-defined]  # noqa: B018


def test_the_warnings_users_filter_are_in_emulate_pallas():
    assert emulate.pallas.RecordedRulesWarning is mosaic_check.RecordedRulesWarning
    assert emulate.pallas.NoMatmulWarning is mosaic_check.NoMatmulWarning
    assert {"RecordedRulesWarning", "NoMatmulWarning"} <= set(emulate.pallas.__all__)


# --- the docs' whole history ------------------------------------------------------------

#: Paths under emulate/ that the docs name and that are no modules (data files).
NOT_MODULES = {"emulate/data"}


def _history() -> str | None:
    """Every line the docs and README ever held (``git log -p``), or None without git
    history."""
    try:
        out = subprocess.run(
            ["git", "log", "-p", "--format=", "--", "docs", "README.md"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out or None


def documented_names(text: str) -> set[str]:
    """The dotted paths a docs text names: ``emulate.x.y`` tokens, ``emulate/x/y.py`` module
    paths (``emulate/x.name``: a name in module x), ``automodule`` members and ``from
    emulate.x import a, b``."""
    lines = [
        ln[1:] if ln[:1] in "+- " else ln
        for ln in text.splitlines()
        if not ln.startswith(("@@", "diff --git", "index ", "--- ", "+++ "))  # diff headers
    ]
    body = "\n".join(lines)
    names = set(re.findall(r"\bemulate(?:\.[A-Za-z_]\w*)+", body))
    for path, ext in re.findall(r"\b(emulate(?:/\w+)+)(\.\w+)?", body):
        if path in NOT_MODULES or path.startswith("emulate/data/"):
            continue
        module = path.removesuffix("/__init__").replace("/", ".")
        names.add(module if ext in ("", ".py") else module + ext)
    for m in re.finditer(r"\.\. automodule:: (\S+)\n((?:[ \t]+:[a-z-]+:.*\n)*)", body + "\n"):
        names.add(m.group(1))
        members = re.search(r":members:(.*)", m.group(2))
        if members:
            names |= {f"{m.group(1)}.{n.strip()}" for n in members.group(1).split(",") if n.strip()}
    for module, grouped, imported in re.findall(
        r"from (emulate[\w.]*) import (?:\(([^)]*)\)|([\w, ]+))", body
    ):
        for n in (grouped or imported).split(","):
            n = n.split("#")[0].split(" as ")[0].strip()
            names |= {f"{module}.{n}"} if n else set()
    return names


def test_documented_names_reads_each_form():
    text = (
        "+see `emulate.tiled.choose` and emulate/exact.py and `emulate/qparts.broadcast_blocks`\n"
        "-`emulate/data/mosaic_probe.json`\n"
        " .. automodule:: emulate.compiler\n"
        "    :members: verdict, Verdict\n"
        "+from emulate.pallas import (dot,\n"
        "+    check)\n"
    )
    assert documented_names(text) == {
        "emulate.pallas",
        "emulate.tiled.choose",
        "emulate.exact",
        "emulate.qparts.broadcast_blocks",
        "emulate.compiler",
        "emulate.compiler.verdict",
        "emulate.compiler.Verdict",
        "emulate.pallas.dot",
        "emulate.pallas.check",
    }


def test_every_name_the_docs_ever_gave():
    texts = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    history = _history()
    if history is not None:  # a checkout with history: every version of the docs
        texts.append(history)
    names = set().union(*(documented_names(t) for t in texts))
    unresolved = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in sorted(names):
            try:
                moved.resolve(name)
            except (ImportError, AttributeError) as e:
                unresolved.append(f"{name}: {type(e).__name__}: {e}")
    assert unresolved == []
