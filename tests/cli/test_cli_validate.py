"""emulate validate: rows, JSON, consistency with targets/explain, bad input, and a
deliberately broken decoder that must be caught with a shrunk reproducer.

Every run is in process; a run of ``python -m emulate validate`` in a fresh interpreter
(no traceback, no progress bar, no .hypothesis/ left in the working directory) is
tests/cli/test_cli_main.py's, its bad input under EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import contextlib
import io
import json
import re

import jax
import jax.numpy as jnp
import pytest

import emulate
from emulate import cli, formats
from emulate.numerics import codecs

LOW = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]


def _run(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(["validate", *argv])
    return rc, buf.getvalue()


def _table_rows(out: str) -> list[dict[str, str]]:
    """The table's rows as header -> cell (columns start where the dashes do)."""
    lines = out.splitlines()
    header, dashes = lines[0], lines[1]
    starts, pos = [], 0
    for d in dashes.split("  "):
        starts.append(pos)
        pos += len(d) + 2
    edges = [*starts, None]
    names = [header[a:b].strip() for a, b in zip(edges, edges[1:], strict=False)]
    rows = []
    for line in lines[2:]:
        if not line:
            break
        rows.append(
            dict(zip(names, [line[a:b].strip() for a, b in zip(edges, edges[1:], strict=False)]))
        )
    return rows


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> tuple[int, str, dict]:
    # 1 example a row (each compiles a program of its own): this module checks the table
    # and the JSON (tests/test_validate.py checks emulate.validate itself)
    path = tmp_path_factory.mktemp("validate") / "rows.json"
    argv = ["--target", "cpu", "v4", "--formats", "int8", "e2m1", "--examples", "1"]
    rc, out = _run([*argv, "--seed", "3", "--json", str(path)])
    return rc, out, json.loads(path.read_text())


def _built(lhs: str, rhs: str, target: str, mode: str) -> bool:
    """Whether emulate builds the pair in this mode (mode "exact" may not be built)."""
    try:
        emulate.plan(lhs, rhs, target=target, preferred_element_type="float32", mode=mode)
    except NotImplementedError:
        return False
    return True


SMALL_PAIRS = [
    ("int8", "int8"),
    ("float4_e2m1fn", "float4_e2m1fn"),
    ("bfloat16", "int8"),
    ("bfloat16", "float4_e2m1fn"),
]


def test_small_run_passes_and_lists_every_row(small_run) -> None:
    rc, out, data = small_run
    assert rc == 0
    rows = _table_rows(out)
    pairs = ["int8 x int8", "e2m1fn x e2m1fn", "bf16 x int8", "bf16 x e2m1fn"]
    assert [(r["target"], r["pair"], r["mode"]) for r in rows] == [
        (t, p, m) for t in ("cpu", "tpu_v4") for p in pairs for m in ("fast", "exact")
    ]
    by = {(r["target"], r["pair"], r["mode"]): r for r in rows}
    assert by["cpu", "int8 x int8", "fast"] == {
        "target": "cpu",
        "pair": "int8 x int8",
        "mode": "fast",
        "plan": "native",
        "contract": "exact",
        "tried": "1",
        "fail": "0",
        "ulps": "0",
        "err/bound": "-",
        "time": by["cpu", "int8 x int8", "fast"]["time"],
    }
    assert re.fullmatch(r"\d+\.\ds", by["cpu", "int8 x int8", "fast"]["time"])
    assert by["tpu_v4", "e2m1fn x e2m1fn", "exact"]["plan"] == "bf16"
    assert by["cpu", "e2m1fn x e2m1fn", "exact"]["plan"] == "int8"
    not_built = 0
    for t in ("cpu", "tpu_v4"):
        for (lhs, rhs), p in zip(SMALL_PAIRS[2:], pairs[2:], strict=True):
            assert by[t, p, "fast"]["contract"] == "bounded"
            assert float(by[t, p, "fast"]["err/bound"]) <= 1
            if _built(lhs, rhs, t, "exact"):
                assert by[t, p, "exact"]["contract"] == "exact"
                assert by[t, p, "exact"]["fail"] == "0"
                continue
            not_built += 1
            assert by[t, p, "exact"] == {
                "target": t,
                "pair": p,
                "mode": "exact",
                "plan": "-",
                "contract": "not built",
                "tried": "-",
                "fail": "-",
                "ulps": "-",
                "err/bound": "-",
                "time": "-",
            }
    # bf16 x int8 is the same bf16 program on both targets: checked once.
    assert by["tpu_v4", "bf16 x int8", "fast"]["time"] == "=cpu"
    checked = [r for r in rows if r["contract"] != "not built"]
    examples = sum(int(r["tried"]) for r in checked if not r["time"].startswith("="))
    assert out.splitlines()[-1] == (
        f"{16 - not_built} rows checked ({examples} examples), 0 with mismatches, "
        f"{not_built} exact mode not built"
    )


def test_json_rows(small_run) -> None:
    _, out, data = small_run
    assert (data["seed"], data["examples"], data["modes"]) == (3, 1, ["fast", "exact"])
    assert data["targets"] == ["cpu", "tpu_v4"]
    assert data["formats"] == ["int8", "float4_e2m1fn"]
    rows = data["rows"]
    assert len(rows) == 16
    first = rows[0]
    assert {k: first[k] for k in first if k != "seconds"} == {
        "target": "cpu",
        "lhs": "int8",
        "rhs": "int8",
        "mode": "fast",
        "plan": "native",
        "fallback": None,
        "runs": "native",
        "contract": "exact",
        "status": "ok",
        "examples": 1,
        "mismatches": 0,
        "max_ulps": 0.0,
        "worst_ratio": None,
        "same_as": None,
        "reproducer": None,
        "report": None,
    }
    for r in rows:
        built = _built(r["lhs"], r["rhs"], r["target"], r["mode"])
        assert r["status"] == ("ok" if built else "not built"), r
    table = _table_rows(out)
    assert [r["status"] == "not built" for r in rows] == [
        r["contract"] == "not built" for r in table
    ]
    shared = {(r["target"], r["lhs"], r["rhs"], r["mode"]): r["same_as"] for r in rows}
    assert shared["tpu_v4", "bfloat16", "int8", "fast"] == "cpu"
    assert shared["tpu_v4", "bfloat16", "float4_e2m1fn", "fast"] == "cpu"
    assert shared["tpu_v4", "int8", "int8", "fast"] is None  # bf16 on v4, native on cpu


def _targets_cells(target: str) -> dict[tuple[str, str], str]:
    """(lhs, rhs) -> the plan method `emulate targets --target T` prints."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["targets", "--target", target]) == 0
    out = buf.getvalue()
    cells = {}
    for title, lhs in (
        ("Plan method, fmt x fmt (float32 result)", None),
        ("Plan method, bfloat16 x fmt (float32 result)", "bfloat16"),
    ):
        block = out.split(title + "\n", 1)[1]
        for line in block.splitlines()[2:]:
            if not line:
                break
            fmt, method = line.split()
            cells[lhs or fmt, fmt] = method
    return cells


def _explain_method(lhs: str, rhs: str, target: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["explain", lhs, rhs, "--target", target, "--out", "float32"]) == 0
    (line,) = [ln for ln in buf.getvalue().splitlines() if ln.lstrip().startswith("* ")]
    return line.split()[1]


def test_plans_agree_with_targets_and_explain(tmp_path) -> None:
    # v5e: int4 x int4 is native there (the host runs its int8 fallback), e2m1 takes int8.
    path = tmp_path / "rows.json"
    argv = ["--target", "v5e", "--formats", "int4", "e2m1", "e5m2", "--modes", "fast"]
    rc, out = _run([*argv, "--examples", "2", "--json", str(path)])
    assert rc == 0
    rows = json.loads(path.read_text())["rows"]
    cells = _targets_cells("v5e")
    for r in rows:
        assert r["plan"] == cells[r["lhs"], r["rhs"]], r
        assert r["plan"] == _explain_method(r["lhs"], r["rhs"], "tpu_v5e")
    int4 = next(r for r in rows if r["lhs"] == r["rhs"] == "int4")
    assert (int4["plan"], int4["fallback"], int4["runs"]) == ("native", "int8", "int8")
    assert _table_rows(out)[0]["plan"] == "native*"


TARGET_CHOICES = (
    "tpu_v2, tpu_v3, tpu_v4, tpu_v4i, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x, tpu_v8i, "
    "cpu, gpu_sm80, gpu_sm89, gpu_sm90, gpu_sm100"
)
FORMAT_CHOICES = ", ".join([*LOW, "bfloat16", "float16", "float32"])


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--target", "tpu_v9"],
            f"unknown target 'tpu_v9' (choose from {TARGET_CHOICES}, all, or an alias such as v5e)",
        ),
        (
            ["--formats", "e4m3", "fp7"],
            f"unknown format 'fp7' (choose from {FORMAT_CHOICES}, or an alias such as e4m3)",
        ),
        (
            ["--formats", "e8m0"],
            f"not a matmul operand format 'e8m0' (choose from {FORMAT_CHOICES}, or an alias "
            "such as e4m3)",
        ),
        (["--examples", "0"], "argument --examples: expected a positive integer, got 0"),
        (["--examples", "many"], "argument --examples: expected a positive integer, got 'many'"),
        (
            ["--modes", "quick"],
            "argument --modes: expected fast or exact, got 'quick'",
        ),
        (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["validate", *argv])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"emulate validate: error: {message}\n"


def test_unwritable_json_path(tmp_path, capsys) -> None:
    for path, why in (
        (tmp_path / "missing" / "rows.json", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ):
        with pytest.raises(SystemExit) as exc:
            cli.main(["validate", "--formats", "int8", "--json", str(path)])
        assert exc.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (
            f"emulate validate: error: cannot write --json {str(path)!r}: {why} (give a path "
            "to a file in an existing, writable directory)\n"
        )


def test_bad_environment_target_is_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setenv("EMULATE_TARGET", "tpu_v99")
    with pytest.raises(SystemExit) as exc:
        cli.main(["validate", "--formats", "int8"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        f"emulate validate: error: EMULATE_TARGET: unknown target 'tpu_v99'; known targets: "
        f"{TARGET_CHOICES}\n"
    )


# --------------------------------------------------------------------------- broken decoder


@pytest.fixture
def broken_decoder(monkeypatch):
    """float decoding with the sign of every odd code flipped; jit caches cleared around."""
    original = codecs.decode_float_bits

    def broken(codes, f):
        bits = original(codes, f)
        odd = (codes.astype(jnp.uint32) & 1) == 1
        return jnp.where(odd, bits ^ jnp.uint32(0x80000000), bits)

    jax.clear_caches()
    monkeypatch.setattr(codecs, "decode_float_bits", broken)
    yield
    monkeypatch.undo()
    jax.clear_caches()


def test_broken_decoder_fails_with_a_shrunk_reproducer_that_passes_once_fixed(
    broken_decoder, tmp_path, monkeypatch
) -> None:
    path = tmp_path / "rows.json"
    argv = ["--target", "tpu_v4", "--formats", "e4m3fn", "--modes", "fast", "--examples", "16"]
    rc, out = _run([*argv, "--json", str(path)])
    assert rc == 1
    rows = _table_rows(out)
    assert [(r["pair"], r["plan"], r["contract"]) for r in rows] == [
        ("e4m3fn x e4m3fn", "bf16", "bounded"),
        ("bf16 x e4m3fn", "bf16", "bounded"),
    ]
    assert all(int(r["fail"]) > 0 for r in rows)
    assert "2 rows checked (32 examples), 2 with mismatches, 0 exact mode not built" in out
    header = re.search(
        r"^MISMATCH tpu_v4 float8_e4m3fn x float8_e4m3fn mode 'fast': (\d+) of 16 examples "
        r"broke the contract\. Minimal example \(hypothesis-shrunk\):$",
        out,
        flags=re.M,
    )
    assert header is not None
    data = json.loads(path.read_text())
    row = data["rows"][0]
    assert row["status"] == "mismatch" and row["mismatches"] == int(header[1])
    assert row["report"].startswith("result differs from emulate.reference in ")
    script = row["reproducer"]
    assert script in out
    # Shrunk: a one-element contraction (the smallest layout).
    assert "dimension_numbers = (((1,), (0,)), ((), ()))" in script
    lhs_line = next(ln for ln in script.splitlines() if ln.startswith("lhs = "))
    assert lhs_line.count("0x") <= 3
    # The reproducer fails while the decoder is broken ...
    with pytest.raises(AssertionError, match=r"^result differs from emulate.reference in "):
        exec(compile(script, "<reproducer>", "exec"), {})
    # ... and passes once it is fixed
    monkeypatch.undo()
    jax.clear_caches()
    exec(compile(script, "<reproducer>", "exec"), {})
