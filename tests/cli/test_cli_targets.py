"""emulate targets: the native-pair matrix and the plan-method grids, checked against
the real compiler's recorded verdicts, JAX's table and emulate.plan."""

from __future__ import annotations

import dataclasses

import pytest

from emulate import capabilities, cli, formats

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


def test_targets_opens_with_the_library_matrix(targets_out: str) -> None:
    from emulate import targets

    # One renderer: the first table and its source lines are capabilities.render_matrix's.
    matrix = capabilities.render_matrix(targets.names(), MATRIX_ROWS)
    assert targets_out.startswith(matrix)
    assert targets_out[len(matrix) :].startswith(
        "float8_e8m0fnu, a scale type and never a matmul operand, is left out.\n"
    )


def test_targets_unknown_target_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["targets", "--target", "v4", "nope"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "emulate targets: error: unknown target 'nope' (choose from tpu_v2, tpu_v3, "
        "tpu_v4, tpu_v4i, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x, tpu_v8i, cpu, "
        "gpu_sm80, gpu_sm89, gpu_sm90, gpu_sm100, or an alias such as v5e)\n"
    )


def _first_of_each_verdict(rows):
    """Per target and compatibility setting, the first row of each distinct recorded
    verdict (ok, stage, message)."""
    seen, picked = set(), []
    for r in rows:
        kind = (r.case.target, r.case.compat, r.verdict.ok, r.verdict.stage, r.verdict.message)
        if kind not in seen:
            picked.append(r)
        seen.add(kind)
    return picked


#: The sample's targets: one of each family (v2/v3, v4, v5e/v5p/v6e, v7x).
SAMPLED = ("tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v7x")


# The probe cases compiled again through the command, against the recorded probe; this is
# also the suite's default reprobe (tests/compiler/test_probing.py's are long). By default
# (sample) the command probes SAMPLED, one case of each distinct recorded verdict of each
# target and setting (the probe's cases and the recorded probe it compares with are cut to
# those), or every case of SAMPLED where the installed compiler (libtpu, jax, jaxlib) is
# not the one the probe was recorded with; every case of tpu_v5e under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "every", [False, pytest.param(True, marks=pytest.mark.long)], ids=["sample", "every_case"]
)
def test_targets_probe_reprobes_the_recorded_cases(
    every, tmp_path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    import jax

    from emulate import compiler, mosaic
    from emulate.compiler import probing

    data = mosaic.recorded()
    targets = ("tpu_v5e",) if every else SAMPLED
    rows = [r for r in data.rows if r.case.target in targets]
    installed = (compiler.libtpu_version(), jax.__version__, importlib.metadata.version("jaxlib"))
    if not every and installed == (data.libtpu, data.jax, data.jaxlib):
        rows = _first_of_each_verdict(rows)
        assert len(rows) < len(data.rows) // 4
        cut = dataclasses.replace(data, rows=tuple(rows))

        def probe_cases(names):
            assert tuple(names) == targets
            return tuple(r.case for r in rows)

        monkeypatch.setattr(probing, "probe_cases", probe_cases)
        monkeypatch.setattr(probing, "recorded", lambda: cut)
    out = tmp_path / "probe.json"
    argv = ["targets", "--probe", "--target", *targets, "--out", str(out)]
    rc = cli.main(argv)
    text = capsys.readouterr().out
    assert (
        f"differences from the recorded probe (libtpu {data.libtpu}), for the targets probed: 0"
        in text
    ), (
        f"the compiler (libtpu {installed[0]}) differs from the recorded probe (libtpu "
        f"{data.libtpu}); re-record with python -m emulate targets --probe --out "
        "emulate/data/mosaic_probe.json and review:\n" + text[-4000:]
    )
    assert rc == 0
    assert "JAX's table vs the compiler, compat off:" in text
    fresh = mosaic.Probe.from_json(out.read_text())
    assert list(fresh.topologies) == list(targets)
    assert {r.case: r.verdict for r in fresh.rows} == {r.case: r.verdict for r in rows}
    assert fresh.libtpu == compiler.libtpu_version()
    assert compiler.differences(fresh, fresh) == []


def test_targets_out_needs_probe(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["targets", "--out", "x.json"])
    assert e.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "emulate targets: error: --out goes with --probe"
    )
