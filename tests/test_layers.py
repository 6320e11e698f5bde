"""The package's layers, read from the source: no upward import, no cycle, no private name
crossing modules. docs/architecture.md draws the same table.

Every module of ``emulate`` has a place in :data:`LAYERS`. A module may import a module of
a lower layer, or one listed before it in its own layer; nothing else. Imports are read
statically (``ast``) wherever they stand, inside functions too.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "emulate"

#: (layer, its modules in the order in which they may import each other).
LAYERS: list[tuple[str, list[str]]] = [
    ("records", ["emulate.formats", "emulate.tables", "emulate.mosaic"]),
    (
        "profiles, oracle, bounds",
        ["emulate.targets", "emulate.compiler", "emulate.reference", "emulate.bounds"],
    ),
    (
        "planning",
        [
            "emulate.planning",
            "emulate.planning.exactness",
            "emulate.planning.slicing",
            "emulate.planning.plan",
        ],
    ),
    (
        "bit-level numerics",
        [
            "emulate.numerics",
            "emulate.numerics.storage",
            "emulate.numerics.bits",
            "emulate.numerics.codecs",
            "emulate.numerics.accumulate",
        ],
    ),
    ("quantized operands", ["emulate.quant", "emulate.mx"]),
    (
        "importers: block layouts",
        [
            "emulate.importers",
            "emulate.importers.ggml_parts",
            "emulate.importers.ggml_legacy",
            "emulate.importers.ggml_kquants",
            "emulate.importers.ggml_iq",
            "emulate.importers.ggml",
        ],
    ),
    ("importers", ["emulate.importers.gguf"]),
    (
        "engine",
        [
            "emulate.engine",
            "emulate.engine.operands",
            "emulate.engine.passthrough",
            "emulate.engine.layout",
            "emulate.engine.contract",
            "emulate.engine.exact",
            "emulate.engine.tiled",
            "emulate.engine.grad",
            "emulate.engine.run",
            "emulate.engine.sites",
        ],
    ),
    (
        "front ends",
        [
            "emulate.scaled",
            "emulate.dot",
            "emulate.conv",
            "emulate.flax.quantize",
            "emulate.flax.load",
            "emulate.flax",
        ],
    ),
    ("program transforms", ["emulate.program", "emulate.rewrite", "emulate.report"]),
    (
        "pallas",
        [
            "emulate.pallas.route",
            "emulate.pallas.kernel_dot",
            "emulate.pallas.matmul_kernel",
            "emulate.pallas.mosaic_check",
            "emulate.pallas",
        ],
    ),
    ("public API", ["emulate"]),
    ("validation", ["emulate.testing", "emulate.validate"]),
    ("command line", ["emulate.cli", "emulate.__main__"]),
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
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
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


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    assert sorted(set(MODULES) - set(RANK)) == []
    assert sorted(set(RANK) - set(MODULES)) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    upward = [
        f"{module} ({LAYER_OF[module]}) imports {t} ({LAYER_OF[t]})"
        for t in sorted(GRAPH[module][0])
        if RANK[t] >= RANK[module]
    ]
    assert upward == []


def test_pallas_stays_off_the_engine() -> None:
    reach = [
        f"{m} imports {t} ({LAYER_OF[t]})"
        for m, (ts, _) in GRAPH.items()
        if LAYER_OF[m] == "pallas"
        for t in sorted(ts)
        if LAYER_OF[t] not in PALLAS_MAY_IMPORT
    ]
    assert reach == []


@pytest.mark.parametrize("layer", sorted(NO_JAX))
def test_pure_python_layers_do_not_import_jax(layer: str) -> None:
    found = []
    for m in dict(LAYERS)[layer]:
        for node in ast.walk(ast.parse(MODULES[m].read_text())):
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
    assert [p for _, (_, ps) in sorted(GRAPH.items()) for p in ps] == []


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
        for w in GRAPH[v][0]:
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

    for v in sorted(GRAPH):
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
