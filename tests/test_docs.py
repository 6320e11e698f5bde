"""The docs site: it builds with sphinx -W, and its tables come from the code."""

from __future__ import annotations

import contextlib
import html
import inspect
import io
import pathlib
import re
import subprocess
import sys

from emulate import capabilities, cli, formats, targets

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import emulate_docs  # noqa: E402

#: The rows of `emulate targets`' first table: the operand formats, float8_e8m0fnu left out.
MATRIX_ROWS = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"] + [
    "bfloat16",
    "float32",
    "float16",
]


def _text(page: pathlib.Path) -> str:
    """The text of an HTML page, tags dropped and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def _stdout(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(argv) == 0
    return buf.getvalue()


def _build(out: pathlib.Path) -> pathlib.Path:
    built = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    problems = [ln for ln in built.stderr.splitlines() if "WARNING" in ln or "ERROR" in ln]
    assert built.returncode == 0, "\n".join(problems) or built.stderr[-3000:]
    return out


def test_docs_site(tmp_path) -> None:
    """One build (about 15 s) checked for everything, so that pytest-xdist workers do not
    each build the site."""
    site = _build(tmp_path / "html")
    _check_pages(site)
    _check_capability_tables(site)
    _check_cli_reference(site)
    _check_api_page(site)
    _check_tutorial(site)
    _check_generated_files(emulate_docs.GENERATED)
    _check_committed_pages(tmp_path / "generated")


def _check_pages(site) -> None:
    for page in ("index", "quickstart", "testing", "porting", "numerics", "targets", "cli"):
        assert (site / f"{page}.html").exists(), page
    assert (site / "api.html").exists()


def _check_capability_tables(site) -> None:
    text = _text(site / "targets.html")
    matrix = capabilities.render_matrix(["v4", "v5e"], ["int4", "uint4", "int8", "uint8"])
    # int8 x int8 and bf16 x int8 emulated on v4: the compiler refuses both without compat
    # mode; the integer pairs native on v5e, the unsigned ones nowhere
    assert [line.split() for line in matrix.splitlines()[3:7]] == [
        ["int4", "e/e", "N/e"],
        ["uint4", "e/e", "e/e"],
        ["int8", "e/e", "N/e"],
        ["uint8", "e/e", "e/e"],
    ]
    full = capabilities.render_matrix(targets.names(), MATRIX_ROWS)
    assert _stdout(["targets"]).startswith(full)  # the page's first table
    for line in _stdout(["targets"]).splitlines():
        assert line in text, line
    source = (DOCS / "targets.md").read_text()
    assert "```{literalinclude} _generated/targets.txt" in source
    assert "e/e  e/e  e/N" not in source  # not typed by hand


def _check_cli_reference(site) -> None:
    text = _text(site / "cli.html")
    for command in cli.build_parser().get_default("commands"):
        assert f"usage: emulate {command} [-h]" in text
    assert "--examples N" in text and "--json PATH" in text


def _check_api_page(site) -> None:
    page = (site / "api.html").read_text()
    import emulate
    from emulate import testing

    for name in emulate.__all__:
        if inspect.ismodule(getattr(emulate, name)):
            assert f'id="module-emulate.{name}"' in page, name
        else:
            assert f'id="emulate.{name}"' in page, name
    for name in testing.__all__:
        assert f'id="emulate.testing.{name}"' in page, name
    for name in emulate.importers.__all__:  # documented where they are defined
        owner = getattr(emulate.importers, name).__module__
        assert f'id="{owner}.{name}"' in page, name


def _check_tutorial(site) -> None:
    text = _text(site / "testing.html")
    assert "def test_fp4_is_exact_on_every_deployed_target(target, problem):" in text


def _check_committed_pages(fresh: pathlib.Path) -> None:
    """docs/_generated/ (committed, included by the pages) is what the code prints now."""
    emulate_docs.write_generated(fresh)
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in emulate_docs.GENERATED.iterdir())
    for name in names:
        now = emulate_docs.comparable(name, (fresh / name).read_text())
        committed = emulate_docs.comparable(name, (emulate_docs.GENERATED / name).read_text())
        assert committed == now, (
            f"docs/_generated/{name} is out of date: run python docs/_ext/emulate_docs.py"
        )


def _check_generated_files(tmp_path) -> None:
    assert (tmp_path / "targets.txt").read_text() == _stdout(["targets"])
    probe = (tmp_path / "mosaic.txt").read_text()
    assert probe.startswith("lhs x rhs ")
    rows = {line.split("  ")[0].strip(): line.split()[-7:] for line in probe.splitlines()[1:62]}
    # v2 v3 v4 v5e v5p v6e v7x, measured with the real compiler (design.md)
    assert rows["int8 x int8"] == ["-", "-", "-", "N", "N", "N", "c"]
    assert rows["e4m3fn x e4m3fn"] == ["-", "-", "-", "N", "N", "N", "N"]
    assert rows["f32 x f32"] == ["N"] * 7
    validate = (tmp_path / "validate.txt").read_text()
    assert validate.startswith("target  pair")
    rows = [line.split() for line in validate.splitlines()[2:18]]
    assert rows[0][:10] == ["cpu", "int4", "x", "int4", "fast", "int8", "exact", "4", "0", "0"]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        (t, a, b, m)
        for t in ("cpu", "tpu_v4")
        for a, b in (("int4", "int4"), ("e4m3fn", "e4m3fn"), ("bf16", "int4"), ("bf16", "e4m3fn"))
        for m in ("fast", "exact")
    ]
    md = (tmp_path / "cli.md").read_text()
    assert md.startswith("## emulate\n\n```text\nusage: emulate [-h] COMMAND ...\n")
    assert "\n## emulate validate\n\n```text\nusage: emulate validate [-h]" in md


def test_index_toctree_takes_in_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    block = index.split("```{toctree}\n", 1)[1].split("```", 1)[0]
    assert [ln for ln in block.splitlines() if not ln.startswith(":")] == list(emulate_docs.PAGES)

    class App:
        srcdir = str(DOCS)

    source = [index]
    emulate_docs._complete_toctree(App(), "index", source)
    extra = sorted(
        p.stem for p in DOCS.glob("*.md") if p.stem not in (*emulate_docs.PAGES, "index")
    )
    listed = source[0].split("```{toctree}\n", 1)[1].split("```", 1)[0].splitlines()
    assert [ln for ln in listed if not ln.startswith(":")] == [*emulate_docs.PAGES, *extra]


def test_toctree_completion_adds_a_new_page(tmp_path) -> None:
    (tmp_path / "index.md").write_text("x\n```{toctree}\n:caption: Contents\nquickstart\n```\n")
    (tmp_path / "quickstart.md").write_text("# q\n")
    (tmp_path / "performance.md").write_text("# p\n")

    class App:
        srcdir = str(tmp_path)

    source = [(tmp_path / "index.md").read_text()]
    emulate_docs._complete_toctree(App(), "index", source)
    assert source[0] == "x\n```{toctree}\n:caption: Contents\nquickstart\nperformance\n```\n"
    other = ["# not the index\n"]
    emulate_docs._complete_toctree(App(), "quickstart", other)
    assert other == ["# not the index\n"]


# --------------------------------------------------------------------------- README


def _fenced(path: pathlib.Path, lang: str) -> list[str]:
    """The bodies of the ```lang fenced blocks of a Markdown file."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", path.read_text(), flags=re.M | re.S)


def test_readme_examples_run() -> None:
    """Both README snippets, each in a namespace of its own (a missing import fails), in
    one fresh interpreter (one JAX start-up, not two)."""
    example, quantized = _fenced(ROOT / "README.md", "python")
    runner = (
        "import sys\n"
        "for i, code in enumerate(sys.argv[1:]):\n"
        "    print(f'--- README snippet {i}', flush=True)\n"
        "    exec(compile(code, f'README snippet {i}', 'exec'), {'__name__': '__main__'})\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", runner, quantized, example],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert ran.returncode == 0, ran.stderr
    head, first, second = ran.stdout.split("--- README snippet ")
    assert head == "" and first.startswith("0\n") and second.startswith("1\n")
    assert first == f"0\n{256 * 128 // 2 + 256 // 32 * 128} float32 (4, 128)\n"
    lines = second.splitlines()[1:]
    assert lines[0].startswith("float32 (8, 256) ")
    assert lines[1] == "float4_e2m1fn x float4_e2m1fn -> float4_e2m1fn on tpu_v5e (mode 'fast')"


#: Modules that moved into packages, under the paths the docs gave them before -> where
#: they live now (emulate/__init__ keeps the old paths importable).
MOVED = {
    "emulate.mx": "emulate.quantized.mx",
    "emulate.quant": "emulate.quantized.quantizing",
    "emulate.qarray": "emulate.quantized.array",
    "emulate.reference_codes": "emulate.reference.codes",
    "emulate.reference_rounding": "emulate.reference.rounding",
}


def test_moved_modules_import_under_their_documented_paths() -> None:
    import importlib

    import emulate

    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert getattr(emulate, old.removeprefix("emulate.")).__name__ == new
    from emulate.qarray import QArray, dequantize
    from emulate.quant import SCALE_FORMATS, Scheme, quantize

    assert (QArray, dequantize, quantize) == (emulate.QArray, emulate.dequantize, emulate.quantize)
    assert isinstance(emulate.mx.MXFP4, Scheme)
    assert (emulate.mx.MXFP4.format, emulate.mx.MXFP4.block) == ("float4_e2m1fn", (32,))
    assert "float8_e8m0fnu" in SCALE_FORMATS
