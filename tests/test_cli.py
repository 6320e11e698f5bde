"""The command line: the formats, targets and explain subcommands, and argument errors."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from emulate import cli, formats

HAND_KNOWN_MAX = {
    "int4": "7",
    "uint4": "15",
    "int8": "127",
    "uint8": "255",
    "float8_e4m3fn": "448",
    "float8_e5m2": "57344",
    "float8_e4m3fnuz": "240",
    "float8_e5m2fnuz": "57344",
    "float8_e4m3b11fnuz": "30",
    "float8_e3m4": "15.5",
    "float6_e2m3fn": "7.5",
    "float6_e3m2fn": "28",
    "float4_e2m1fn": "6",
    "float8_e8m0fnu": "2^127",
}


def _rows(out: str) -> dict[str, dict[str, str]]:
    """Parse the table: header, dashes, one row per format; columns start where dashes do."""
    lines = out.splitlines()
    assert lines[0].startswith("format")
    # Column starts from the dashes line, which has no spaces inside a column.
    starts, pos = [], 0
    for dashes in lines[1].split("  "):
        if dashes:
            starts.append(pos)
        pos += len(dashes) + 2
    rows: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        if not line.strip():
            break
        bounds = [*starts, None]
        cells = [line[a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]
        names = [lines[0][a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows


def test_formats_table_has_one_row_per_format_with_max(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["formats"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert list(rows) == list(formats.LOW_PRECISION)
    assert {n: r["max"] for n, r in rows.items()} == HAND_KNOWN_MAX


def test_formats_table_cells(capsys: pytest.CaptureFixture) -> None:
    cli.main(["formats"])
    rows = _rows(capsys.readouterr().out)
    e4m3 = rows["float8_e4m3fn"]
    assert (e4m3["bits"], e4m3["E"], e4m3["M"], e4m3["bias"]) == ("8", "4", "3", "7")
    assert e4m3["NaN codes"] == "0x7f,0xff" and e4m3["Inf codes"] == "-"
    assert e4m3["min normal"] == "2^-6" and e4m3["min subnormal"] == "2^-9"
    assert rows["float8_e5m2"]["Inf codes"] == "0x7c,0xfc"
    assert rows["float8_e5m2"]["NaN codes"] == "0x7d-0x7f,0xfd-0xff"
    assert rows["float8_e4m3fnuz"]["NaN codes"] == "0x80"
    assert rows["float8_e4m3fnuz"]["-0"] == "no"
    assert rows["float8_e8m0fnu"]["min subnormal"] == "-"
    assert rows["float8_e8m0fnu"]["signed"] == "no"
    assert rows["float4_e2m1fn"]["int8 k"] == "1"
    assert rows["float6_e2m3fn"]["int8 k"] == "3"
    assert rows["int4"]["int8 k"] == "0"
    assert rows["float6_e3m2fn"]["int8 k"] == "-"


def test_formats_selected_by_alias(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["formats", "e4m3", "fp4"]) == 0
    assert list(_rows(capsys.readouterr().out)) == ["float8_e4m3fn", "float4_e2m1fn"]


COMMANDS = ", ".join(cli.build_parser().get_default("commands"))


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bogus"], f"invalid choice: 'bogus' (choose from {COMMANDS})"),
        ([], f"missing command (choose from {COMMANDS})"),
        (["formats", "float7"], "unknown low-precision format 'float7' (choose from int4,"),
        (["formats", "bf16"], "unknown low-precision format 'bf16'"),
        (["formats", "--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("emulate")
    for command in cli.build_parser().get_default("commands"):
        err = err.replace(f"'{command}'", command)
    assert needle in err
    assert "Traceback" not in err


def test_python_dash_m_runs_without_traceback() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "emulate", "formats"], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0 and "float8_e4m3fn" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "emulate", "nope"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- targets

TPU_CHIPS = {  # column label -> JAX's ChipVersion value, written out independently of emulate
    "v2": "v2",
    "v3": "v3",
    "v4": "v4",
    "v4i": "v4i",
    "v5e": "v5e",
    "v5p": "v5p",
    "v6e": "v6e",
    "v7": "7",
    "v7x": "7x",
    "v8i": "8i",
}
ALL_COLUMNS = [*TPU_CHIPS, "cpu", "sm80", "sm89", "sm90", "sm100"]
MATRIX_ROWS = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"] + [
    "bfloat16",
    "float32",
    "float16",
]
PLAN_ROWS = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]
NATIVE = "Native operand pairs (N native, e emulated); cell: fmt x fmt / bfloat16 x fmt"
SAME = "Plan method, fmt x fmt (float32 result)"
WEIGHT = "Plan method, bfloat16 x fmt (float32 result)"


def _tables(out: str) -> dict[str, dict[str, dict[str, str]]]:
    """Every table in ``out`` as title -> row -> column -> cell.

    A table is a title line, a header line, a dashes line and rows up to a blank line;
    tables that share a title (column groups of one wide table) are merged.
    """
    lines = out.splitlines()
    tables: dict[str, dict[str, dict[str, str]]] = {}
    for i, line in enumerate(lines):
        if not line or set(line) - {"-", " "}:
            continue
        title, header = lines[i - 2], lines[i - 1]
        starts, pos = [], 0
        for dashes in line.split("  "):
            starts.append(pos)
            pos += len(dashes) + 2
        bounds = [*starts, None]
        names = [header[a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]
        table = tables.setdefault(title, {})
        for row in lines[i + 1 :]:
            if not row:
                break
            cells = [row[a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]
            table.setdefault(cells[0], {}).update(zip(names[1:], cells[1:], strict=True))
    return tables


@pytest.fixture(scope="module")
def targets_out() -> str:
    # Run once for the module: every plan of every target is computed.
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["targets"]) == 0
    return buf.getvalue()


def test_targets_prints_three_tables_of_every_target(targets_out: str) -> None:
    tables = _tables(targets_out)
    assert list(tables) == [NATIVE, SAME, WEIGHT]
    assert list(tables[NATIVE]) == MATRIX_ROWS
    assert list(tables[SAME]) == list(tables[WEIGHT]) == PLAN_ROWS
    for table in tables.values():
        for row in table.values():
            assert list(row) == ALL_COLUMNS
    assert max(len(line) for line in targets_out.splitlines()) <= 100


def _native_by_the_compiler_or_jax(name: str, chip: str, a: str, b: str) -> bool:
    """Probed generations: the recorded verdict of the real compiler (compat off, natural
    accumulator; tests/test_compiler.py reprobes them); the others: JAX's own table."""
    from jax.experimental.pallas import tpu as pltpu

    from emulate import mosaic

    probe = mosaic.recorded()
    if name in probe.topologies:
        ints = formats.get(a).is_integer and formats.get(b).is_integer
        case = mosaic.ProbeCase(name, a, b, "int32" if ints else "float32", False)
        return any(r.case == case and r.verdict.ok for r in probe.rows)
    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(chip), 1)
    return bool(info.is_matmul_supported(formats.get(a).dtype, formats.get(b).dtype))


def test_targets_matrix_matches_the_compiler_and_jax_tpu_table(targets_out: str) -> None:
    matrix = _tables(targets_out)[NATIVE]
    for column, chip in TPU_CHIPS.items():
        for f in MATRIX_ROWS:
            same = "N" if _native_by_the_compiler_or_jax(f"tpu_{column}", chip, f, f) else "e"
            weight = "e"
            if _native_by_the_compiler_or_jax(f"tpu_{column}", chip, "bfloat16", f):
                weight = "N"
            assert matrix[f][column] == f"{same}/{weight}", (column, f)


def test_targets_matrix_matches_profiles_elsewhere(targets_out: str) -> None:
    from emulate import targets

    matrix = _tables(targets_out)[NATIVE]
    for name in ("cpu", "gpu_sm80", "gpu_sm89", "gpu_sm90", "gpu_sm100"):
        t = targets.get(name)
        for f in MATRIX_ROWS:
            same = "N" if t.supports(f, f) else "e"
            weight = "N" if t.supports("bfloat16", f) else "e"
            assert matrix[f][name.removeprefix("gpu_")] == f"{same}/{weight}", (name, f)


def test_targets_matrix_known_cells(targets_out: str) -> None:
    m = _tables(targets_out)[NATIVE]
    assert m["int8"]["v4"] == "e/e"  # Mosaic refuses bf16 x int8 without compat mode
    assert m["int8"]["v5e"] == "N/e"
    assert m["int8"]["v7x"] == "e/e"
    assert m["float8_e4m3fn"]["v7x"] == "N/e"
    assert m["float8_e4m3fn"]["v7"] == "N/N"  # JAX's table: v7 is not probed
    assert m["float8_e4m3fn"]["v5e"] == "N/e"  # compiles, though JAX's table says not
    assert m["float4_e2m1fn"]["v5e"] == "e/e"
    assert m["bfloat16"]["v2"] == "e/e"
    assert m["float32"]["v2"] == "N/e"
    assert m["int4"]["cpu"] == "e/e"
    assert m["float8_e4m3fn"]["sm90"] == "N/e"


def test_targets_plan_tables_are_what_plan_says(targets_out: str) -> None:
    import emulate

    tables = _tables(targets_out)
    for column in ALL_COLUMNS:
        name = f"tpu_{column}" if column in TPU_CHIPS else column
        name = f"gpu_{column}" if column.startswith("sm") else name
        for f in PLAN_ROWS:
            same = emulate.plan(f, f, target=name, preferred_element_type="float32")
            weight = emulate.plan("bfloat16", f, target=name, preferred_element_type="float32")
            assert tables[SAME][f][column] == same.method, (column, f)
            assert tables[WEIGHT][f][column] == weight.method, (column, f)


def test_targets_plan_known_cells(targets_out: str) -> None:
    tables = _tables(targets_out)
    same, weight = tables[SAME], tables[WEIGHT]
    assert same["float4_e2m1fn"]["v5e"] == "int8"
    assert same["float6_e2m3fn"]["v6e"] == "int8"
    assert same["float4_e2m1fn"]["v4"] == "bf16"
    assert same["float8_e4m3fn"]["v4"] == "bf16"
    assert same["float8_e4m3fn"]["v7x"] == "native"
    assert same["int4"]["v5e"] == "native"
    assert same["int8"]["v7x"] == "bf16"
    assert same["int8"]["v2"] == "f32"
    assert same["int4"]["cpu"] == "int8"
    assert weight["int8"]["v2"] == "f32"
    assert weight["int8"]["v4"] == "bf16"  # mixed pairs are decoded to one type


def test_targets_notes(targets_out: str) -> None:
    lines = targets_out.splitlines()
    assert (
        "real TPU compiler (libtpu 0.0.42.1, compat off): v2, v3, v4, v5e, v5p, v6e, v7x"
    ) in lines
    assert "read from JAX's Pallas TPU table: v4i, v7, v8i" in lines
    assert "  v4: JAX's table only: bfloat16 x int8, bfloat16 x float32" in lines
    assert "emulate's builtin profiles: cpu, sm80, sm89, sm90, sm100" in lines
    assert "  int4 x int4 on v5e, v5p, v6e: the int8 route off tpu" in lines


def test_targets_selected_by_alias(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["targets", "--target", "v5e", "--target", "host", "tpu_v5e"]) == 0
    tables = _tables(capsys.readouterr().out)
    assert list(tables) == [NATIVE, SAME, WEIGHT]
    assert list(tables[NATIVE]["int8"]) == ["v5e", "cpu"]
    assert tables[SAME]["float8_e5m2"] == {"v5e": "bf16", "cpu": "native"}


# --------------------------------------------------------------------------- explain


def test_explain_fp4_on_v5e_takes_the_exact_int8_route(capsys: pytest.CaptureFixture) -> None:
    import emulate

    assert cli.main(["explain", "float4_e2m1fn", "float4_e2m1fn", "--target", "tpu_v5e"]) == 0
    out = capsys.readouterr().out
    p = emulate.plan("float4_e2m1fn", "float4_e2m1fn", target="tpu_v5e")
    assert out == p.explain() + "\n"
    lines = out.splitlines()
    assert lines[0] == "float4_e2m1fn x float4_e2m1fn -> float4_e2m1fn on tpu_v5e (mode 'fast')"
    assert "  method: decode to int8 (exact power-of-two scaling), int32 accumulation" in lines
    assert "  matrix unit sees: int8 x int8, accumulating in int32" in lines
    assert "  numerics: exact; the result is the exact sum rounded once" in lines


def test_explain_options(capsys: pytest.CaptureFixture) -> None:
    import emulate

    argv = ["explain", "e2m1", "int4", "--target", "v4", "--out", "f32", "--mode", "exact"]
    assert cli.main(argv) == 0
    p = emulate.plan(
        "float4_e2m1fn", "int4", target="tpu_v4", preferred_element_type="float32", mode="exact"
    )
    assert capsys.readouterr().out == p.explain() + "\n"
    assert p.out == "float32" and p.mode == "exact" and p.exact


def test_explain_uses_the_current_target(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("EMULATE_TARGET", "ironwood")
    assert cli.main(["explain", "e4m3", "e4m3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "float8_e4m3fn x float8_e4m3fn -> float8_e4m3fn on tpu_v7x (mode 'fast')"
    assert lines[1] == "  method: native: the operands go to the matrix unit as they are"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["explain", "float7", "int8"],
            "emulate explain: error: unknown operand format 'float7' (choose from int4, uint4, "
            "int8, uint8, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz, "
            "float8_e4m3b11fnuz, float8_e3m4, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn, "
            "bfloat16, float16, float32, or an alias such as e4m3)",
        ),
        (
            ["explain", "int8", "int8", "--target", "tpu_v9"],
            "emulate explain: error: unknown target 'tpu_v9' (choose from tpu_v2, tpu_v3, "
            "tpu_v4, tpu_v4i, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x, tpu_v8i, cpu, "
            "gpu_sm80, gpu_sm89, gpu_sm90, gpu_sm100, or an alias such as v5e)",
        ),
        (
            ["explain", "int32", "int32", "--target", "v4", "--mode", "exact"],
            "emulate explain: error: mode='exact' for int32 x int32 is not built: it covers "
            "the low-precision formats (integers, float8, float6, float4), bfloat16, float16 "
            "and float32 with each other; use mode='fast'",
        ),
        (
            ["explain", "e8m0", "int8", "--target", "v4"],
            "emulate explain: error: lhs: float8_e8m0fnu is a scale type, not a matmul "
            "operand; pass it as the scales of a scaled operand",
        ),
        (
            ["explain", "int8", "e4m3", "--target", "v4", "--out", "int8"],
            "emulate explain: error: preferred_element_type: an integer result (int8) needs "
            "integer operands, got int8 x float8_e4m3fn",
        ),
        (
            ["targets", "--target", "v4", "nope"],
            "emulate targets: error: unknown target 'nope' (choose from tpu_v2, tpu_v3, "
            "tpu_v4, tpu_v4i, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x, tpu_v8i, cpu, "
            "gpu_sm80, gpu_sm89, gpu_sm90, gpu_sm100, or an alias such as v5e)",
        ),
    ],
)
def test_explain_and_targets_errors_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == message + "\n"


def test_explain_bad_environment_target_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("EMULATE_TARGET", "tpu_v99")
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain", "int8", "int8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("emulate explain: error: EMULATE_TARGET: unknown target 'tpu_v99'")
    assert err.count("\n") == 1


def test_explain_exact_on_a_bounded_pair_exits_2_without_traceback() -> None:
    argv = ["explain", "int32", "int32", "--target", "v5e", "--mode", "exact"]
    bad = subprocess.run(
        [sys.executable, "-m", "emulate", *argv], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (
        "emulate explain: error: mode='exact' for int32 x int32 is not built: it covers the "
        "low-precision formats (integers, float8, float6, float4), bfloat16, float16 and "
        "float32 with each other; use mode='fast'\n"
    )


# --------------------------------------------------------------------------- docs

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _fenced(path: pathlib.Path, lang: str) -> list[str]:
    """The bodies of the ```lang fenced blocks of a Markdown file."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", path.read_text(), flags=re.M | re.S)


def test_readme_examples_run() -> None:
    example, quantized = _fenced(ROOT / "README.md", "python")
    ran = subprocess.run(
        [sys.executable, "-c", quantized], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"{256 * 128 // 2 + 256 // 32 * 128} float32 (4, 128)\n"
    ran = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("float32 (8, 256) ")
    assert lines[1] == "float4_e2m1fn x float4_e2m1fn -> float4_e2m1fn on tpu_v5e (mode 'fast')"


def test_targets_probe_reprobes_one_generation(tmp_path, capsys: pytest.CaptureFixture) -> None:
    from emulate import compiler, mosaic

    out = tmp_path / "probe.json"
    assert cli.main(["targets", "--probe", "--target", "v5e", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    libtpu = mosaic.recorded().libtpu
    assert (
        f"differences from the recorded probe (libtpu {libtpu}), for the targets probed: 0" in text
    )
    assert "JAX's table vs the compiler, compat off:" in text
    fresh = mosaic.Probe.from_json(out.read_text())
    assert list(fresh.topologies) == ["tpu_v5e"]
    recorded = {r.case: r.verdict for r in mosaic.recorded().rows if r.case.target == "tpu_v5e"}
    assert {r.case: r.verdict for r in fresh.rows} == recorded
    assert compiler.differences(fresh, fresh) == []


def test_targets_out_needs_probe(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["targets", "--out", "x.json"])
    assert e.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "emulate targets: error: --out goes with --probe"
    )
