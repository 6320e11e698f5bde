"""The package's shape, read from the source: no upward import, no cycle, no private name
crossing modules; small modules; tests that use public names only and mirror the source
tree; and docs/architecture.md drawing the same layer table as :data:`LAYERS`.

Every module of ``emulate`` has a place in :data:`LAYERS`. A module may import a module of
a lower layer, or one listed before it in its own layer; nothing else. Imports are read
statically (``ast``) wherever they stand, inside functions too. Every exception to the
other rules is in an allowlist below that names it and says why.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest


@functools.cache
def _parsed(source: str) -> ast.Module:
    """``ast.parse(source)``, once per source text: the guards below read each module
    several times (every tree is only read, never changed)."""
    return ast.parse(source)


ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "emulate"

#: (layer, its modules in the order in which they may import each other).
LAYERS: list[tuple[str, list[str]]] = [
    (
        "records",
        [
            "emulate.format_record",
            "emulate.float_format",
            "emulate.formats",
            "emulate.codebooks",
            "emulate.tables",
            "emulate.mosaic",
            "emulate.moved",
        ],
    ),
    (
        "profiles, oracle, bounds",
        [
            "emulate.profiles",
            "emulate.context",
            "emulate.targets",
            "emulate.capabilities",
            "emulate.compiler.devices",
            "emulate.compiler.jobs",
            "emulate.compiler.isolate",
            "emulate.compiler.compiling",
            "emulate.compiler.probing",
            "emulate.compiler.bundles",
            "emulate.compiler.scalar",
            "emulate.compiler.steps",
            "emulate.compiler.replay",
            "emulate.compiler.cores",
            "emulate.compiler.timing",
            "emulate.compiler",
            "emulate.reference.codes",
            "emulate.reference.rounding",
            "emulate.reference.decoding",
            "emulate.reference.exact",
            "emulate.reference.quantizing",
            "emulate.reference",
            "emulate.bounds",
            "emulate.group_sizes",
        ],
    ),
    (
        "planning",
        [
            "emulate.planning",
            "emulate.planning.exactness",
            "emulate.planning.slicing",
            "emulate.planning.plan",
            "emulate.planning.matrix",
        ],
    ),
    (
        "bit-level numerics",
        [
            "emulate.numerics",
            "emulate.numerics.pytree",
            "emulate.numerics.storage",
            "emulate.numerics.bits",
            "emulate.numerics.rounding",
            "emulate.numerics.codecs",
            "emulate.numerics.scales",
            "emulate.numerics.accumulate",
        ],
    ),
    (
        "quantized operands",
        [
            "emulate.quantized",
            "emulate.quantized.checks",
            "emulate.quantized.index",
            "emulate.quantized.values",
            "emulate.quantized.layout",
            "emulate.quantized.array",
            "emulate.quantized.quantizing",
            "emulate.quantized.mx",
        ],
    ),
    (
        "importers: block layouts",
        [
            "emulate.importers.stored",
            "emulate.importers.ggml.blocks",
            "emulate.importers.ggml.legacy",
            "emulate.importers.ggml.kquants",
            "emulate.importers.ggml.iq",
            "emulate.importers.ggml",
            "emulate.importers.conventions",
            "emulate.importers.conventions.readers",
            "emulate.importers.conventions.config",
            "emulate.importers.conventions.integer",
            "emulate.importers.conventions.floats",
            "emulate.importers.conventions.bnb",
        ],
    ),
    (
        "importers",
        [
            "emulate.importers.as_qarray",
            "emulate.importers.gguf",
            "emulate.importers.safetensors",
            "emulate.importers",
        ],
    ),
    (
        "engine",
        [
            "emulate.engine",
            "emulate.engine.operands",
            "emulate.engine.prepared",
            "emulate.engine.qoperands",
            "emulate.engine.passthrough",
            "emulate.engine.layout",
            "emulate.engine.contract",
            "emulate.engine.limbs",
            "emulate.engine.slices",
            "emulate.engine.exact",
            "emulate.engine.tiled",
            "emulate.engine.qtiled",
            "emulate.engine.grad",
            "emulate.engine.out_sharding",
            "emulate.engine.run",
            "emulate.engine.sites",
            "emulate.engine.args",
            "emulate.engine.conv_args",
            "emulate.engine.ragged_args",
            "emulate.engine.plain",
            "emulate.engine.front",
        ],
    ),
    (
        "pallas",
        [
            "emulate.pallas.compute",
            "emulate.pallas.kernel_dot",
            "emulate.pallas.weights",
            "emulate.pallas.words",
            "emulate.pallas.qcodebook",
            "emulate.pallas.qgroups",
            "emulate.pallas.qoffsets",
            "emulate.pallas.qweight",
            "emulate.pallas.qsteps",
            "emulate.pallas.word_groups",
            "emulate.pallas.word_step",
            "emulate.pallas.matmul_config",
            "emulate.pallas.matmul_args",
            "emulate.pallas.matmul_kernel",
            "emulate.pallas.gmm_kernel",
            "emulate.pallas.checking",
            "emulate.pallas.checking.sites",
            "emulate.pallas.checking.op_rules",
            "emulate.pallas.checking.findings",
            "emulate.pallas.checking.mosaic_check",
            "emulate.pallas",
        ],
    ),
    (
        "cpu kernels",
        [
            "emulate.cpu",
            "emulate.cpu.kernel_cache",
            "emulate.cpu.form",
            "emulate.cpu.operands",
            "emulate.cpu.ffi",
            "emulate.cpu.parts",
            "emulate.cpu.vectors",
            "emulate.cpu.lanes",
            "emulate.cpu.tiles",
            "emulate.cpu.factors",
            "emulate.cpu.dequantized",
            "emulate.cpu.route",
            "emulate.cpu.gemv",
            "emulate.cpu.gemm",
            "emulate.cpu.handler",
            "emulate.cpu.call",
        ],
    ),
    (
        "kv cache",
        [
            "emulate.kvcache.formats",
            "emulate.kvcache.layout",
            "emulate.kvcache.writing",
            "emulate.kvcache.cache",
            "emulate.kvcache.blocks",
            "emulate.kvcache.queries",
            "emulate.kvcache.decode_kernel",
            "emulate.kvcache.prefill_kernel",
            "emulate.kvcache.xla_route",
            "emulate.kvcache.bounds",
        ],
    ),
    (
        "front ends",
        [
            "emulate.sharding",
            "emulate.routing.setting",
            "emulate.routing.ops",
            "emulate.routing.prepared",
            "emulate.routing.program",
            "emulate.routing.pallas_ops",
            "emulate.routing.cpu_op",
            "emulate.routing.choose",
            "emulate.routing.run",
            "emulate.routing.query",
            "emulate.routing",
            "emulate.kernel_route",
            "emulate.scaled",
            "emulate.dot",
            "emulate.conv",
            "emulate.ragged",
            "emulate.kvcache.attention",
            "emulate.kvcache",
            "emulate.flax.rounding",
            "emulate.flax.layers",
            "emulate.flax.quantize",
            "emulate.flax.load",
            "emulate.flax.kvcache",
            "emulate.flax",
        ],
    ),
    ("program transforms", ["emulate.program", "emulate.rewrite", "emulate.report"]),
    ("public API", ["emulate"]),
    (
        "validation",
        [
            "emulate.testing.strategies",
            "emulate.testing.operands",
            "emulate.testing.distance",
            "emulate.testing.comparison",
            "emulate.testing.hazards",
            "emulate.testing.reproducers",
            "emulate.testing.tpu_rounding",
            "emulate.testing.harness",
            "emulate.testing.report",
            "emulate.testing.plugin",
            "emulate.testing",
            "emulate.validate",
        ],
    ),
    (
        "command line",
        [
            "emulate.cli.args",
            "emulate.cli.formats",
            "emulate.cli.targets",
            "emulate.cli.explain",
            "emulate.cli.validate_fn",
            "emulate.cli.validate",
            "emulate.cli.check_kernel",
            "emulate.cli",
            "emulate.__main__",
        ],
    ),
]

#: Layers whose modules must not import JAX at all (pure Python and numpy).
NO_JAX = {"records", "planning", "importers: block layouts"}
#: Layers that may not reach past these layers (besides their own): the Pallas kernels use
#: records, profiles, planning, numerics and quantized operands, never the XLA engine or the
#: front ends built on it.
PALLAS_MAY_IMPORT = {
    "records",
    "profiles, oracle, bounds",
    "planning",
    "bit-level numerics",
    "quantized operands",
    "pallas",
}

#: The CPU kernels, the third branch: the trunk and themselves, never the engine or Pallas.
CPU_MAY_IMPORT = (PALLAS_MAY_IMPORT - {"pallas"}) | {"cpu kernels"}

RANK = {m: (i, j) for i, (_, mods) in enumerate(LAYERS) for j, m in enumerate(mods)}
LAYER_OF = {m: name for name, mods in LAYERS for m in mods}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module ``name`` lives in: itself, or the longest module prefix of it."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not MODULES[module].name == "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, source: str | None = None) -> tuple[set[str], list[str]]:
    """The emulate modules ``module`` imports, and the private names it takes from them
    (``source``: the module's text, by default read from its file)."""
    tree = _parsed(MODULES[module].read_text() if source is None else source)
    targets: set[str] = set()
    private: list[str] = []
    aliases: dict[str, str] = {}  # local name -> emulate module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                owner = _owner(a.name)
                if owner:
                    targets.add(owner)
                    aliases[a.asname or a.name.split(".")[0]] = owner if a.asname else "emulate"
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            if not base.startswith("emulate"):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                owner = full if full in MODULES else _owner(base)
                if owner is None:
                    continue
                targets.add(owner)
                if full in MODULES:
                    aliases[a.asname or a.name] = full
                elif a.name.startswith("_") and owner != module:
                    private.append(f"{module} imports {a.name} from {owner}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and aliases[node.value.id] != module
        ):
            private.append(f"{module} uses {aliases[node.value.id]}.{node.attr}")
    targets.discard(module)
    return targets, private


@functools.cache
def _graph() -> dict[str, tuple[set[str], list[str]]]:
    """Every module's imports of emulate modules and private crossings, parsed on first use:
    not at collection, which every pytest-xdist worker runs."""
    return {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    assert sorted(set(MODULES) - set(RANK)) == []
    assert sorted(set(RANK) - set(MODULES)) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    upward = [
        f"{module} ({LAYER_OF[module]}) imports {t} ({LAYER_OF[t]})"
        for t in sorted(_graph()[module][0])
        if RANK[t] >= RANK[module]
    ]
    assert upward == []


def test_pallas_stays_off_the_engine() -> None:
    reach = [
        f"{m} imports {t} ({LAYER_OF[t]})"
        for m, (ts, _) in _graph().items()
        if LAYER_OF[m] == "pallas"
        for t in sorted(ts)
        if LAYER_OF[t] not in PALLAS_MAY_IMPORT
    ]
    assert reach == []


def test_cpu_kernels_stay_off_the_other_branches() -> None:
    reach = [
        f"{m} imports {t} ({LAYER_OF[t]})"
        for m, (ts, _) in _graph().items()
        if LAYER_OF[m] == "cpu kernels"
        for t in sorted(ts)
        if LAYER_OF[t] not in CPU_MAY_IMPORT
    ]
    assert reach == []


@pytest.mark.parametrize("layer", sorted(NO_JAX))
def test_pure_python_layers_do_not_import_jax(layer: str) -> None:
    found = []
    for m in dict(LAYERS)[layer]:
        for node in ast.walk(_parsed(MODULES[m].read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{m} imports {n}" for n in names if n.split(".")[0] == "jax"]
    assert found == []


def test_no_private_name_crosses_modules() -> None:
    assert [p for _, (_, ps) in sorted(_graph().items()) for p in ps] == []


def test_no_cycle() -> None:
    # Tarjan's strongly connected components over the static graph.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in _graph()[v][0]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(_graph()):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_guard_sees_each_kind_of_violation() -> None:
    source = MODULES["emulate.formats"].read_text() + (
        "\nfrom emulate.dot import _with_format\nimport emulate.engine.run as run\nrun._route\n"
    )
    targets, private = _imports("emulate.formats", source)
    assert {"emulate.dot", "emulate.engine.run"} <= targets
    assert all(RANK[t] > RANK["emulate.formats"] for t in ("emulate.dot", "emulate.engine.run"))
    assert private == [
        "emulate.formats imports _with_format from emulate.dot",
        "emulate.formats uses emulate.engine.run._route",
    ]


# ------------------------------------------------------------------------ module size

MAX_LINES = 600
MAX_DEFINITIONS = 25  # top-level functions and classes
#: A module past this share of either cap is split by concept before it reaches the cap,
#: so that no commit moves code only to fit a number.
NEAR_CAP = 0.95

#: Modules allowed over :data:`MAX_LINES` or :data:`MAX_DEFINITIONS`, and why.
LARGE_MODULES: dict[str, str] = {}


def _size(source: str) -> tuple[int, int]:
    """(lines, top-level function and class definitions) of a module's text."""
    body = _parsed(source).body
    defs = [n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    return len(source.splitlines()), len(defs)


def _oversized(sources: dict[str, str], share: float = 1.0) -> dict[str, str]:
    """The modules past ``share`` of either limit, each with its size in words."""
    out = {}
    for module, source in sorted(sources.items()):
        lines, defs = _size(source)
        if lines > share * MAX_LINES or defs > share * MAX_DEFINITIONS:
            out[module] = f"{lines} lines, {defs} definitions"
    return out


BENCHMARKS = {f"benchmarks.{p.stem}": p for p in sorted((ROOT / "benchmarks").glob("*.py"))}
MAX_BODY_LINES = 80  # statements of one function, its docstring not counted

#: Functions allowed over :data:`MAX_BODY_LINES`, and why.
LONG_FUNCTIONS = {
    "emulate.engine.tiled.contract": (
        "the tiled contraction's one loop body, not yet split into stages (issue 37 names "
        "the front doors first)"
    ),
}


def test_modules_stay_small() -> None:
    sources = {m: p.read_text() for m, p in (MODULES | BENCHMARKS).items()}
    over = _oversized(sources, NEAR_CAP)
    near = {m: size for m, size in over.items() if m not in LARGE_MODULES}
    assert near == {}, (
        f"within {1 - NEAR_CAP:.0%} of a cap ({MAX_LINES} lines, {MAX_DEFINITIONS} "
        "definitions): split by concept, or name the reason in LARGE_MODULES"
    )
    stale = sorted(set(LARGE_MODULES) - set(over))
    assert stale == [], "within the limits now (or gone): remove from LARGE_MODULES"


def _long_functions(module: str, source: str) -> dict[str, int]:
    """``module.name`` (methods and nested functions by their qualified path) -> lines of
    body, for each function whose body runs over :data:`MAX_BODY_LINES`: from its first
    statement after the docstring to its last line."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = (
                f"{path}.{child.name}"
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                else path
            )
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                body = child.body
                if ast.get_docstring(child, clean=False) is not None:
                    body = body[1:]
                lines = child.end_lineno - body[0].lineno + 1 if body and child.end_lineno else 0
                if lines > MAX_BODY_LINES:
                    out[name] = lines
            visit(child, name)

    visit(_parsed(source), module)
    return out


def test_functions_stay_short() -> None:
    long = {}
    for module, path in (MODULES | BENCHMARKS).items():
        long |= _long_functions(module, path.read_text())
    assert {f: n for f, n in long.items() if f not in LONG_FUNCTIONS} == {}
    stale = sorted(set(LONG_FUNCTIONS) - set(long))
    assert stale == [], "within the limit now (or gone): remove from LONG_FUNCTIONS"


def _scripts() -> set[str]:
    """The benchmarks run as scripts (``python -m benchmarks.NAME``): those with a
    ``__main__`` guard. The others are the libraries they share."""
    return {m for m, p in BENCHMARKS.items() if 'if __name__ == "__main__"' in p.read_text()}


def _script_imports(sources: dict[str, str], scripts: set[str]) -> list[str]:
    """``"a imports b"`` for each module of ``sources`` that imports a script of
    ``scripts`` (one script importing another, or a library importing a script)."""
    out = []
    for module, source in sorted(sources.items()):
        for node in ast.walk(_parsed(source)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            out += [f"{module} imports {n}" for n in names if n in scripts and n != module]
    return sorted(set(out))


def test_no_benchmark_imports_a_script() -> None:
    scripts = _scripts()
    assert {"benchmarks.tpu", "benchmarks.quantized", "benchmarks.matmul"} <= scripts
    sources = {m: p.read_text() for m, p in BENCHMARKS.items()}
    assert _script_imports(sources, scripts) == []


# ---------------------------------------------------------------- tests use public names

TESTS = ROOT / "tests"

#: (test file, private name it reaches) -> why it may. Each is a public seam still missing.
PRIVATE_REACHES = {
    (
        "tests/pallas/checking/test_mosaic_check.py",
        "emulate.pallas.checking.mosaic_check._compiler_here",
    ): "a fixture makes the checker believe libtpu is absent, to test the recorded rules",
    (
        "tests/pallas/checking/test_mosaic_check.py",
        "emulate.pallas.checking.mosaic_check._warned",
    ): "the same fixture resets the once-per-process warnings",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_reaches(source: str) -> list[str]:
    """The private names of emulate that a test's text reaches: ``from emulate.x import
    _y``, ``x._y`` on a name bound to an emulate module (also ``setattr(x, "_y", ...)``
    and its kin, as monkeypatch takes them), and dotted strings passed to a call, such as
    ``monkeypatch.setattr("emulate.x._y", ...)``."""
    tree = _parsed(source)
    found: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> emulate module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "emulate":
                    aliases[a.asname or "emulate"] = a.name if a.asname else "emulate"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "emulate":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in MODULES:
                    aliases[a.asname or a.name] = full
                elif _is_private(a.name):
                    found.add(full)

    def module_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = module_of(node.value)
            if base is not None and f"{base}.{node.attr}" in MODULES:
                return f"{base}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = module_of(node.value)
            if base is not None:
                found.add(f"{base}.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("setattr", "delattr", "getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
        ):
            base = module_of(node.args[0])
            if base is not None:
                found.add(f"{base}.{node.args[1].value}")
        if isinstance(node, ast.Call):
            for arg in node.args:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and re.fullmatch(r"emulate(\.\w+)+", arg.value)
                    and any(_is_private(part) for part in arg.value.split("."))
                ):
                    found.add(arg.value)
    return sorted(found)


def _test_files() -> list[pathlib.Path]:
    return sorted(TESTS.rglob("*.py"))


def test_tests_reach_no_private_name() -> None:
    reaches = {
        (str(path.relative_to(ROOT)), name)
        for path in _test_files()
        for name in _private_reaches(path.read_text())
    }
    assert sorted(reaches - set(PRIVATE_REACHES)) == []
    stale = sorted(set(PRIVATE_REACHES) - reaches)
    assert stale == [], "no longer reached: remove from PRIVATE_REACHES"


# ---------------------------------------------------------------- the documented table

ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: The heading of the doc's layer table (the first code block after it); the picture of the
#: trunk and its branches above it is for reading, not checked.
DOC_TABLE_HEADING = "## The layers, module by module\n"
#: Where a module's name starts on each line of the doc's layer drawing.
DOC_MODULE_COLUMN = 24


def _doc_module(name: str) -> str:
    """A module as the doc names it (its path under emulate/, no .py) -> its module name."""
    path = name.removesuffix("__init__").rstrip("/")
    return ".".join(["emulate", *path.split("/")]) if path else "emulate"


def _doc_layers(text: str) -> list[tuple[str, list[str]]]:
    """The layer table of docs/architecture.md (the first code block after
    :data:`DOC_TABLE_HEADING`) as (layer name, modules) in the form of :data:`LAYERS`. Layers
    are separated by lines holding only a "│"; a layer's name is its first column with the
    "Ln" number and parentheses dropped."""
    block = text.split(DOC_TABLE_HEADING, 1)[1].split("```\n", 2)[1]
    layers: list[tuple[str, list[str]]] = []
    label: list[str] = []
    modules: list[str] = []
    for line in [*block.splitlines(), "│"]:
        if line.strip() == "│":
            name = re.sub(r"\([^)]*\)", "", " ".join(label))
            layers.append((" ".join(re.sub(r"^L\d+[a-z]?\b", "", name.strip()).split()), modules))
            label, modules = [], []
            continue
        head, rest = line[:DOC_MODULE_COLUMN], line[DOC_MODULE_COLUMN:]
        assert len(line) <= DOC_MODULE_COLUMN or head.endswith(" "), f"misaligned: {line!r}"
        label.append(head.strip())
        if rest.strip():
            modules.append(_doc_module(rest.split()[0]))
    return layers


def test_architecture_doc_draws_the_layers() -> None:
    assert _doc_layers(ARCHITECTURE.read_text()) == LAYERS


# ------------------------------------------------------------- tests mirror the source

#: Test files that name no module, and what they test instead.
CROSS_CUTTING = {
    "tests/test_layers.py": "the package's shape (this guard)",
    "tests/test_docs.py": "the documentation builds and matches the code",
    "tests/test_typing.py": "mypy over the package",
    "tests/test_bad_inputs.py": "every front end's argument errors, side by side",
    "tests/test_jax_cases.py": "JAX's own test cases through the drop-ins",
    "tests/test_tutorial.py": "docs/tutorial_test.py runs as written",
    "tests/test_kernels_tutorial.py": "docs/kernels_test.py (docs/testing.md's suite) as written",
    "tests/test_xla_cpu_patterns.py": "programs XLA's CPU backend is known to mishandle",
    "tests/test_tpu_compile.py": "emulated programs through the real TPU compiler",
    "tests/test_suite_codegen.py": "the suite's XLA:CPU settings give XLA's default bits",
    "tests/test_surface_sweep.py": "issue 49's sweep of the new callables (tests/_surface_sweep)",
}

GGML = "one family of GGML block layouts: importers/test_ggml (every type against gguf.quants)"
CONVENTIONS = "one family of conventions: importers/test_conventions (each project's decoder)"

#: Modules without a test file of their own, and where they are tested.
TESTED_ELSEWHERE = {
    "emulate": "re-exports only: every suite imports it; test_docs checks __all__ is documented",
    "emulate.__main__": "python -m emulate, run by test_validate and test_cli",
    "emulate.engine": "package docstring only",
    "emulate.cpu": "available / parallel: every kernel test of tests/cpu/ goes through them",
    "emulate.cpu.call": "contract: cpu/test_gemv's and the importers' kernel tests call it",
    "emulate.cpu.vectors": "the vector steps' IR helpers: cpu/test_lanes and cpu/test_tiles",
    "emulate.compiler": "re-exports only: tests/compiler/ reach every name through it",
    "emulate.cli.check_kernel": "emulate check-kernel: pallas/checking/test_mosaic_check",
    "emulate.profiles": "the builtin profile rows and JAX's table: test_targets",
    "emulate.testing.operands": "qarrays and operand specs: testing/test_hazards_quantized",
    "emulate.numerics": "package docstring only",
    "emulate.planning": "package docstring only",
    "emulate.pallas": "lazy re-exports: tests/pallas/ reach every name through it",
    "emulate.pallas.checking": "package docstring only",
    "emulate.engine.limbs": "the limb arithmetic of mode exact: engine/test_exact",
    "emulate.engine.contract": "the plain and K-chunked contraction: test_dot, test_conv",
    "emulate.engine.passthrough": "calls left to JAX: test_dot, test_jax_cases",
    "emulate.engine.run": "plan_for, run_plan: test_dot, engine/test_tiled",
    "emulate.engine.sites": "site scopes: test_program, test_rewrite (emulate.inspect)",
    "emulate.routing": "re-exports only: routing/test_choose reaches its names through it",
    "emulate.routing.setting": "use_route, use_cpu_kernel, WeightRoute: routing/, cpu/test_route",
    "emulate.routing.ops": "weight_side and operand pairs: routing/test_choose, test_ragged",
    "emulate.routing.prepared": "prepare_weights: routing/test_choose, test_ragged, flax/",
    "emulate.routing.program": "the traced kernel, its refusal and its cache: routing/test_choose",
    "emulate.routing.pallas_ops": "the Pallas kernels' routes: routing/test_choose, test_ragged",
    "emulate.routing.run": "the kernel route run: routing/test_choose, test_ragged, cpu/test_route",
    "emulate.routing.query": "weight_route, ragged_dot_route: routing/, test_ragged",
    "emulate.engine.plain": "the plain steps: test_dot, test_ragged, test_surface_sweep",
    "emulate.engine.front": "every front door's call: test_dot, test_conv, test_ragged",
    "emulate.quantized": "package docstring only",
    "emulate.reference.quantizing": (
        "the oracle's quantize / dequantize: quantized/test_quantizing, "
        "quantized/test_quantizing_scale_formats (emulate.quantize against it)"
    ),
    "emulate.quantized.mx": "the MX / NVFP4 schemes: quantized/test_quantizing, test_scaled",
    "emulate.quantized.values": (
        "dequantize and the part readers: quantized/test_array, quantized/test_quantizing "
        "(against reference.dequantize)"
    ),
    "emulate.flax": "re-exports only: tests/flax/ reach every name through it",
    "emulate.importers.stored": "StoredParts: importers/test_ggml, importers/test_conventions",
    "emulate.importers.ggml.blocks": GGML,
    "emulate.importers.ggml.legacy": GGML,
    "emulate.importers.ggml.kquants": GGML,
    "emulate.importers.ggml.iq": GGML,
    "emulate.importers.conventions.readers": CONVENTIONS,
    "emulate.importers.conventions.config": CONVENTIONS,
    "emulate.importers.conventions.integer": CONVENTIONS,
    "emulate.importers.conventions.floats": CONVENTIONS,
    "emulate.importers.conventions.bnb": CONVENTIONS,
    "emulate.importers.as_qarray": "parts into QArrays: importers/test_conventions_qarray",
    "emulate.quantized.checks": "a QArray's parts, checked: quantized/test_array",
    "emulate.numerics.scales": (
        "the scale rules: quantized/test_quantizing (every rule against numpy)"
    ),
    "emulate.pallas.compute": "a pair's compute: pallas/test_kernel_dot, pallas/test_matmul_kernel",
    "emulate.pallas.matmul_config": "blocks and layouts: pallas/test_matmul_kernel (defaults)",
    "emulate.planning.exactness": "exactness limits: planning/test_plan (K-chunks, k_limit)",
    "emulate.planning.slicing": "exponent slicing: engine/test_exact, planning/test_plan",
    "emulate.report": "emulate.inspect: test_program, test_rewrite",
    "emulate.kvcache": "re-exports only: tests/kvcache/ reach every name through it",
    "emulate.kvcache.layout": "the token layout: kvcache/test_kvcache_cache (numpy's unpacking)",
    "emulate.kvcache.writing": "written tokens: kvcache/test_kvcache_cache (reference.quantize)",
    "emulate.kvcache.blocks": "the kernels' pieces: kvcache/test_kvcache_*_kernel (interpret mode)",
    "emulate.kvcache.queries": "scaled queries: kvcache/test_kvcache_attention and the kernels",
    "emulate.kvcache.xla_route": "the XLA route: kvcache/test_kvcache_attention (float64 oracle)",
    "emulate.kvcache.bounds": "the stated bound: every kvcache attention test checks against it",
}


def _tested_by(test: pathlib.PurePosixPath, exists) -> str | None:
    """What ``tests/<path>/test_<name>[_<suffix>].py`` names: the module
    ``emulate.<path>.<name>`` (or package), or ``benchmarks/<name>.py`` / ``examples/<name>.py``
    under tests/benchmarks/ and tests/examples/; the longest ``<name>`` that exists
    (``exists(module or file)``). None if it names nothing.

    Test files need unique basenames (tests/ holds no ``__init__.py``), so under
    ``tests/<path>/`` a file may repeat the folder's name first: ``tests/cli/test_cli_args.py``
    names ``emulate.cli.args``, and ``tests/cli/test_cli_main.py`` the package ``emulate.cli``
    itself when no module ``main`` exists."""
    dirs = list(test.parts[1:-1])
    words = test.stem.removeprefix("test_").split("_")
    tries = [words]
    if dirs and words[0] == dirs[-1] and dirs[:1] not in (["benchmarks"], ["examples"]):
        tries.append(words[1:])
    for w in tries:
        for n in range(len(w), 0, -1):
            name = "_".join(w[:n])
            if dirs[:1] in (["benchmarks"], ["examples"]):
                candidate = "/".join([*dirs, f"{name}.py"])
            else:
                candidate = ".".join(["emulate", *dirs, name])
            if exists(candidate):
                return candidate
    if len(tries) > 1 and exists(".".join(["emulate", *dirs])):
        return ".".join(["emulate", *dirs])
    return None


def _exists(name: str) -> bool:
    return name in MODULES or (not name.startswith("emulate.") and (ROOT / name).is_file())


def _mirror(tests: list[str], exists) -> tuple[dict[str, str | None], set[str]]:
    """Each test file -> what it names; and the set of names tested by a file."""
    named = {t: _tested_by(pathlib.PurePosixPath(t), exists) for t in tests}
    return named, {n for n in named.values() if n is not None}


def test_tests_mirror_the_source_tree() -> None:
    tests = [str(p.relative_to(ROOT)) for p in sorted(TESTS.rglob("test_*.py"))]
    named, tested = _mirror(tests, _exists)
    assert sorted(t for t, n in named.items() if n is None and t not in CROSS_CUTTING) == []
    assert sorted(set(MODULES) - tested - set(TESTED_ELSEWHERE)) == []
    assert sorted(t for t in CROSS_CUTTING if named.get(t, "gone") is not None) == []
    assert sorted(set(TESTED_ELSEWHERE) & tested) == []
    assert sorted(set(TESTED_ELSEWHERE) - set(MODULES)) == []


def test_the_guard_sees_each_kind_of_misshapen_tree() -> None:
    big = "def f():\n    pass\n" * (MAX_DEFINITIONS + 1)
    assert _oversized({"emulate.a": big, "emulate.b": "x = 1\n" * 601, "emulate.c": "x = 1\n"}) == {
        "emulate.a": f"{2 * MAX_DEFINITIONS + 2} lines, {MAX_DEFINITIONS + 1} definitions",
        "emulate.b": "601 lines, 0 definitions",
    }
    near = "x = 1\n" * (int(NEAR_CAP * MAX_LINES) + 1)
    assert _oversized({"emulate.n": near}) == {}
    assert _oversized({"emulate.n": near}, NEAR_CAP) == {"emulate.n": "571 lines, 0 definitions"}

    def lines(indent: int, count: int) -> str:
        return (" " * indent + "x = 1\n") * count

    source = (
        f'def ok():\n    """Doc."""\n{lines(4, MAX_BODY_LINES)}'
        f"class C:\n    def long(self):\n        def inner():\n{lines(12, MAX_BODY_LINES + 1)}"
        f"{lines(8, MAX_BODY_LINES)}"
    )
    assert _long_functions("benchmarks.a", source) == {
        "benchmarks.a.C.long": 2 * MAX_BODY_LINES + 2,
        "benchmarks.a.C.long.inner": MAX_BODY_LINES + 1,
    }
    sources = {
        "benchmarks.a": "from benchmarks import b, harness\n",
        "benchmarks.b": "import benchmarks.c\n",
        "benchmarks.c": "from benchmarks.harness import ms\nfrom benchmarks.b import run\n",
    }
    assert _script_imports(sources, {"benchmarks.b", "benchmarks.c"}) == [
        "benchmarks.a imports benchmarks.b",
        "benchmarks.b imports benchmarks.c",
        "benchmarks.c imports benchmarks.b",
    ]
    test_source = (
        "import emulate\nfrom emulate import testing as et\nfrom emulate.engine import run\n"
        "from emulate.dot import _with_format, dot_general\n"
        "emulate.engine.run._run\net._array_expr\nrun.__name__\n"
        "def t(monkeypatch):\n"
        "    monkeypatch.setattr(run, '_route', None)\n"
        "    monkeypatch.setattr('emulate.conv._GATHER_TAPS', 0)\n"
    )
    assert _private_reaches(test_source) == [
        "emulate.conv._GATHER_TAPS",
        "emulate.dot._with_format",
        "emulate.engine.run._route",
        "emulate.engine.run._run",
        "emulate.testing._array_expr",
    ]
    doc = "```\n L0  records            a picture\n```\n" + DOC_TABLE_HEADING
    doc += "x\n```\n L0  records            formats   F\n" + " " * 24 + "tables\n  │\n"
    doc += " L1  profiles,          targets\n     oracle (and)\n```\n"
    assert _doc_layers(doc) == [
        ("records", ["emulate.formats", "emulate.tables"]),
        ("profiles, oracle", ["emulate.targets"]),
    ]
    assert _doc_module("engine/__init__") == "emulate.engine"
    assert _doc_module("__init__") == "emulate"
    known = {
        "emulate.engine.tiled",
        "benchmarks/tpu.py",
        "emulate.dot",
        "emulate.cli",
        "emulate.cli.args",
    }
    named, tested = _mirror(
        [
            "tests/engine/test_tiled_choices.py",
            "tests/benchmarks/test_tpu.py",
            "tests/test_dot.py",
            "tests/test_packing.py",
            "tests/engine/test_dot.py",
            "tests/cli/test_cli_args.py",
            "tests/cli/test_cli_main.py",
            "tests/engine/test_engine_dot.py",
        ],
        known.__contains__,
    )
    assert named == {
        "tests/engine/test_tiled_choices.py": "emulate.engine.tiled",
        "tests/benchmarks/test_tpu.py": "benchmarks/tpu.py",
        "tests/test_dot.py": "emulate.dot",
        "tests/test_packing.py": None,
        "tests/engine/test_dot.py": None,
        "tests/cli/test_cli_args.py": "emulate.cli.args",
        "tests/cli/test_cli_main.py": "emulate.cli",
        "tests/engine/test_engine_dot.py": None,
    }
    assert tested == known


# ------------------------------------------------------ one owner of the Mosaic rule

#: The functions that decide, from the recorded probe, what Mosaic compiles.
MOSAIC_RULE = ("verdict", "native_pairs", "compat_only_pairs")
#: The modules that may call them, and why; every other module asks
#: ``Target.compiles`` (recorded) or ``emulate.compiler.compiles`` (the real compiler).
MOSAIC_RULE_CALLERS = {
    "emulate.targets": "Target.compiles and the probe laid over a profile's native pairs",
    "emulate.pallas.checking.findings": (
        "a refusal's recorded message, once Target.compiles said no"
    ),
}


def _rule_calls(source: str) -> set[str]:
    """The :data:`MOSAIC_RULE` names a module's text takes from ``emulate.mosaic``."""
    found = set()
    for node in ast.walk(_parsed(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "emulate.mosaic":
            found |= {a.name for a in node.names if a.name in MOSAIC_RULE}
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "mosaic"
            and node.attr in MOSAIC_RULE
        ):
            found.add(node.attr)
    return found


def test_one_owner_of_the_mosaic_rule() -> None:
    callers = {
        m for m, path in MODULES.items() if m != "emulate.mosaic" and _rule_calls(path.read_text())
    }
    assert sorted(callers) == sorted(MOSAIC_RULE_CALLERS)
    # The real compiler's answer to the same question has one home too.
    defining = [
        m
        for m, path in MODULES.items()
        for node in _parsed(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == "compiles"
    ]
    assert defining == ["emulate.compiler.probing"]


def test_the_guard_sees_a_second_reader_of_the_mosaic_rule() -> None:
    source = "from emulate import mosaic\nfrom emulate.mosaic import native_pairs\nmosaic.verdict\n"
    assert _rule_calls(source) == {"verdict", "native_pairs"}
    assert _rule_calls("from emulate import mosaic\nmosaic.recorded()\n") == set()


# ------------------------------------------------ one owner of the route decision

#: What a route decision reads and runs, by the module that defines it: the route setting
#: and whether a program traced now may be lowered for a platform, the record of one
#: decision, the CPU kernel's own rule, and the kernels' entry points a route runs. Only
#: ``emulate.routing`` decides who runs a contraction (``emulate.routing.choose``); any
#: other module that uses one of these makes a second route decision.
ROUTE_RULE: dict[str, set[str]] = {
    "emulate.routing.setting": {
        "current_route",
        "cpu_kernel_enabled",
        "tpu_may_lower",
        "planning_now",
    },
    "emulate.routing": {"current_route", "tpu_may_lower"},
    # the deprecated paths (emulate.moved's stand-ins) reach the same names
    "emulate.route_setting": {
        "current_route",
        "cpu_kernel_enabled",
        "tpu_may_lower",
        "planning_now",
    },
    "emulate.kernel_route": {"choose", "decide", "run", "run_op", "tpu_may_lower"},
    "emulate.cpu.route": {"kernel_form", "many_rows", "MAX_ROWS"},
    "emulate.cpu.form": {"weight_form"},
    "emulate.cpu.call": {"contract"},
    "emulate.pallas": {"matmul", "ragged_dot"},
    "emulate.pallas.matmul_kernel": {"matmul"},
    "emulate.pallas.gmm_kernel": {"ragged_dot"},
}
#: Modules outside ``emulate.routing`` that may use :data:`ROUTE_RULE`, and why (a
#: kernel's own package may use its own names: ``emulate.pallas.*``, ``emulate.cpu.*``).
ROUTE_RULE_USERS = {
    "emulate": "re-exports the public names (WeightRoute, current_route) from routing",
    "emulate.kernel_route": "the deprecated path resolves the old names to routing's",
}


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of an attribute chain over a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _rule_path(path: str) -> set[str]:
    owner, _, name = path.rpartition(".")
    return {path} if name in ROUTE_RULE.get(owner, ()) else set()


def _route_scan(module: str, source: str | ast.Module) -> tuple[set[str], bool]:
    """In one walk of a module's text (or its parsed tree): the :data:`ROUTE_RULE` names
    (``owner.name``) it imports or reaches through a module it imports, and whether it
    defines a function named ``choose`` (the route decision's name)."""
    tree = _parsed(source) if isinstance(source, str) else source
    found: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> the dotted path it stands for
    reached: list[str] = []  # a.b.c of each attribute chain over a name
    chooses = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None:
                reached.append(dotted)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "emulate":
                    aliases[a.asname or "emulate"] = a.name if a.asname else "emulate"
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            if base.split(".")[0] != "emulate":
                continue
            for a in node.names:
                aliases[a.asname or a.name] = f"{base}.{a.name}"
                found |= _rule_path(f"{base}.{a.name}")
        elif isinstance(node, ast.FunctionDef) and node.name == "choose":
            chooses = True
    for dotted in reached:
        head, _, rest = dotted.partition(".")
        if head in aliases and rest:
            found |= _rule_path(f"{aliases[head]}.{rest}")
    return found, chooses


def _route_uses(module: str, source: str | ast.Module) -> set[str]:
    """The :data:`ROUTE_RULE` names a module uses (:func:`_route_scan`)."""
    return _route_scan(module, source)[0]


def _second_decisions(uses: dict[str, set[str]]) -> list[str]:
    """``"m uses owner.name"`` for each use outside ``emulate.routing``, the owner's own
    package and :data:`ROUTE_RULE_USERS`."""
    out = []
    for m, paths in sorted(uses.items()):
        for path in sorted(paths):
            package = ".".join(path.split(".")[:2])
            if m == package or m.startswith(package + ".") or m in ROUTE_RULE_USERS:
                continue
            if m == "emulate.routing" or m.startswith("emulate.routing."):
                continue
            out.append(f"{m} uses {path}")
    return out


def test_one_owner_of_the_route_decision() -> None:
    scans = {m: _route_scan(m, path.read_text()) for m, path in MODULES.items()}
    uses = {m: found for m, (found, _) in scans.items()}
    assert _second_decisions(uses) == []
    assert sorted(m for m in ROUTE_RULE_USERS if not uses.get(m)) == []  # stale entries
    # one function named choose, the route decision (the others say what they choose)
    assert [m for m, (_, chooses) in scans.items() if chooses] == ["emulate.routing.choose"]


#: A second route decision as main had it before emulate.routing (emulate/scaled.py's CPU
#: kernel rule, 2026-12-07), and a front end deciding for the Pallas kernel itself.
PLANTED_DECISION = """
from emulate.cpu import route as cpu_route
from emulate.route_setting import cpu_kernel_enabled, planning_now, tpu_may_lower
import emulate.routing as r
import emulate.pallas


def _cpu_kernel_form(dn, target, lhs, rhs):
    if not cpu_kernel_enabled() or tpu_may_lower() or planning_now():
        return None
    return cpu_route.kernel_form(rhs, 1, lhs.shape, dn)


def choose(call):
    if r.current_route() != "xla":
        return emulate.pallas.matmul(call.lhs, call.rhs)
"""


def test_the_guard_sees_a_second_route_decision() -> None:
    for module in ("emulate.scaled", "emulate.ragged"):
        source = MODULES[module].read_text() + PLANTED_DECISION
        found, chooses = _route_scan(module, source)
        assert chooses  # a second definition of choose, which the test above refuses
        assert _second_decisions({module: found}) == [
            f"{module} uses emulate.cpu.route.kernel_form",
            f"{module} uses emulate.pallas.matmul",
            f"{module} uses emulate.route_setting.cpu_kernel_enabled",
            f"{module} uses emulate.route_setting.planning_now",
            f"{module} uses emulate.route_setting.tpu_may_lower",
            f"{module} uses emulate.routing.current_route",
        ]
    # a kernel's own package, routing itself and the route setting alone are no decision
    assert _second_decisions({"emulate.pallas.gmm_kernel": {"emulate.pallas.matmul"}}) == []
    planted = _route_uses("emulate.routing.choose", PLANTED_DECISION)
    assert _second_decisions({"emulate.routing.choose": planted}) == []
    setting_only = "from emulate import routing\nwith routing.use_route('xla'):\n    pass\n"
    assert _route_uses("emulate.ragged", setting_only) == set()


# --------------------------------------------------- one reader of a QArray's parts

#: The QArray fields a reader must take from its layout (:mod:`emulate.quantized.layout`):
#: the optional parts whose kinds the layout describes. ``codes``, ``scales``, ``codebook``
#: and ``perm`` are read whole in many places; what they are (an array, Packed, a QArray:
#: two-level) is one of the layout's answers, so testing it is a part read too
#: (:data:`KIND_TESTED`), as is reading inside scales or offsets (:data:`INSIDE`).
QARRAY_PARTS = ("zero_points", "offsets", "tensor_scale", "element_exponent")
KIND_TESTED = ("codes", "scales", "zero_points", "offsets")
INSIDE = ("scales", "offsets")

#: The modules that read a QArray's parts themselves, and why: the QArray's own package
#: (the record, its checks, indexing, values, quantizing, and the layout every kernel
#: takes), and the XLA route's readers, which contract every part as it is stored.
PART_READERS = {
    **{
        m: "the QArray's own package: the record, its checks, values, layout and builders"
        for m in MODULES
        if m == "emulate.quantized" or m.startswith("emulate.quantized.")
    },
    "emulate.engine.qoperands": "the XLA route's operands: codes minus zero points, offsets",
    "emulate.engine.qtiled": "the XLA route's K tiles: each part sliced along K",
    "emulate.engine.grad": "the gradient: each part's tangent, part by part",
}
#: Other records with fields of those names, read in these modules through these names:
#: (the names, what they are).
OTHER_RECORDS = {
    "emulate.importers.stored": ({"self"}, "StoredParts, a checkpoint's parts as stored"),
    "emulate.importers.as_qarray": ({"parts"}, "StoredParts"),
    "emulate.importers.ggml": ({"parts"}, "StoredParts"),
    "emulate.engine.sites": ({"s"}, "an emulate.mx scheme's tensor_scale flag"),
    "emulate.testing.operands": ({"scheme", "spec"}, "the strategies' scheme records"),
    "emulate.pallas.matmul_args": ({"self"}, "MatmulArgs' kernel operands"),
    "emulate.pallas.gmm_kernel": ({"a"}, "MatmulArgs' tensor scale"),
    "emulate.pallas.qweight": ({"kw", "self", "s"}, "KernelQWeight (kw, self) and Scaling (s)"),
    "emulate.pallas.qoffsets": ({"p", "self"}, "AffineParts, the kernel's zero points, offsets"),
    "emulate.pallas.qsteps": ({"sc", "self"}, "Scaling, the kernel's group terms"),
    "emulate.pallas.word_step": ({"scaling"}, "Scaling, the word step's scales"),
    "emulate.sharding": ({"kw", "a"}, "KernelQWeight (kw) and AffineParts (a)"),
}


def _root(node: ast.expr) -> str:
    """The name an attribute chain starts from (``q`` of ``q.scales.codes``), or ""."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _part_reads(source: str) -> list[tuple[str, str]]:
    """``(name it starts from, the read as written)`` of each read of a QArray's parts in a
    module's text (:data:`QARRAY_PARTS`, :data:`KIND_TESTED`, :data:`INSIDE`)."""
    found = []
    for node in ast.walk(_parsed(source)):
        read = None
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            inner = node.value
            if node.attr in QARRAY_PARTS or (
                isinstance(inner, ast.Attribute) and inner.attr in INSIDE
            ):
                read = node
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and node.args
            and isinstance(node.args[0], ast.Attribute)
            and node.args[0].attr in KIND_TESTED
        ):
            read = node.args[0]
        if read is not None:
            where = (node.lineno, node.col_offset, node.end_col_offset)
            found.append((where, _root(read), ast.unparse(node)))
    return [(root, text) for _, root, text in sorted(found)]


def _stray_part_reads(module: str, source: str) -> list[str]:
    """The reads of a QArray's parts in ``module`` that neither :data:`PART_READERS` nor
    :data:`OTHER_RECORDS` allow."""
    if module in PART_READERS:
        return []
    names = OTHER_RECORDS.get(module, (set(), ""))[0]
    return [f"{module}: {text}" for root, text in _part_reads(source) if root not in names]


def test_one_reader_of_a_qarrays_parts() -> None:
    sources = {m: path.read_text() for m, path in sorted(MODULES.items())}
    stray = [r for m, source in sources.items() for r in _stray_part_reads(m, source)]
    assert stray == []
    # every allowance is still needed (the QArray's package as a whole)
    reads = {m: _part_reads(sources[m]) for m in (*PART_READERS, *OTHER_RECORDS)}
    unused = [m for m in PART_READERS if ".quantized" not in m and not reads[m]]
    unused += [
        m for m, (names, _) in OTHER_RECORDS.items() if not any(r in names for r, _ in reads[m])
    ]
    assert unused == []


def test_the_guard_sees_a_stray_read_of_a_qarrays_parts() -> None:
    planted = (
        "\nq.zero_points\nw.tensor_scale is None\nisinstance(q.scales, QArray)\n"
        "isinstance(q.codes, Packed)\nq.offsets.codes\nkw.element_exponent\n"
    )
    source = MODULES["emulate.pallas.qweight"].read_text() + planted
    assert _stray_part_reads("emulate.pallas.qweight", source) == [
        "emulate.pallas.qweight: q.zero_points",
        "emulate.pallas.qweight: w.tensor_scale",
        "emulate.pallas.qweight: isinstance(q.scales, QArray)",
        "emulate.pallas.qweight: isinstance(q.codes, Packed)",
        "emulate.pallas.qweight: q.offsets",
        "emulate.pallas.qweight: q.offsets.codes",
    ]
    # the layout's own answers are no part reads
    assert _part_reads("lay = layout_of(q)\nlay.zero\nlay.tensor.array\nlay.exponent\n") == []


def _clashing_basenames(tests: list[str]) -> list[str]:
    """Test files that share a basename: tests/ has no ``__init__.py``, so pytest imports
    each file as a top-level module by its basename, and the second one fails to import."""
    seen: dict[str, list[str]] = {}
    for t in tests:
        seen.setdefault(pathlib.PurePosixPath(t).name, []).append(t)
    return sorted(p for paths in seen.values() if len(paths) > 1 for p in paths)


def test_test_files_have_unique_basenames() -> None:
    tests = [str(p.relative_to(ROOT)) for p in sorted(TESTS.rglob("test_*.py"))]
    assert _clashing_basenames(tests) == []
    clash = ["tests/benchmarks/test_harness.py", "tests/testing/test_harness.py", "tests/a.py"]
    assert _clashing_basenames(clash) == clash[:2]
