"""emulate validate --fn: the differential harness on a user's kernel from the command line:
a right kernel passes, a broken one exits 1 with a reproducer, reports are written, bad
arguments are usage errors."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from emulate import cli


def _run(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(["validate", *argv])
    return rc, buf.getvalue()


def test_fn_passes_and_fails(tmp_path):
    rc, out = _run(
        ["--fn", "_user_kernels:int4_weight_only", "--pair", "float32", "INT4_G128",
         "--contract", "fast", "--target", "v5e", "--examples", "8"]
    )  # fmt: skip
    assert rc == 0
    assert out.startswith("ok _user_kernels:int4_weight_only on tpu_v5e: 8 examples, max ")
    js, page = tmp_path / "r.json", tmp_path / "r.html"
    rc, out = _run(
        ["--fn", "_user_kernels:int8_via_f32", "--pair", "int8", "int8", "--target", "v4",
         "v7x", "--json", str(js), "--html", str(page)]
    )  # fmt: skip
    assert rc == 1
    assert out.count("FAILED on tpu_") == 2
    assert "lhs = np.full((1, 1041), 127, dtype=np.int8)" in out.splitlines()
    checks = json.loads(js.read_text())["checks"]
    assert [(c["test"], c["target"], c["failure"] is None) for c in checks] == [
        ("_user_kernels:int8_via_f32 on tpu_v4", "tpu_v4", False),
        ("_user_kernels:int8_via_f32 on tpu_v7x", "tpu_v7x", False),
    ]
    # Exact checks: a passed/failed bar plot each (no err/bound to histogram), with the seed.
    assert [c["seed"] for c in checks] == [0, 0]
    assert page.read_text().count('<svg class="outcomes"') == 2


def test_fn_with_tpu_numerics_sees_the_bf16_block_sums():
    argv = ["--fn", "_user_kernels:xla_blocks_bf16", "--pair", "bfloat16", "bfloat16",
            "--contract", "fast", "--target", "v5e", "--examples", "6"]  # fmt: skip
    assert _run(argv)[0] == 0  # a CPU run: XLA folds the bfloat16 roundings away
    rc, out = _run([*argv, "--tpu-numerics"])
    assert rc == 1 and out.startswith("FAILED on tpu_v5e: _user_kernels:xla_blocks_bf16 broke")
    assert "testing.tpu_numerics(xla_blocks_bf16, target='tpu_v5e')(lhs, rhs)" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--fn", "_user_kernels", "--pair", "int8", "int8"],
         "--fn: expected MODULE:FUNCTION, got '_user_kernels'"),
        (["--fn", "no_such_module:f", "--pair", "int8", "int8"], "--fn: cannot import"),
        (["--fn", "_user_kernels:nope", "--pair", "int8", "int8"],
         "--fn: module '_user_kernels' has no 'nope'"),
        (["--fn", "_user_kernels:int8_exact"], "--fn needs --pair LHS RHS"),
        (["--fn", "_user_kernels:int8_exact", "--pair", "int9", "int8"],
         "unknown --pair lhs format 'int9'"),
        (["--fn", "_user_kernels:int8_exact", "--pair", "int8", "int8", "--contract", "close"],
         "--contract: expected exact, fast or a non-negative number, got 'close'"),
        (["--pair", "int8", "int8"], "--pair needs --fn MODULE:FUNCTION"),
        (["--fn", "_user_kernels:int8_exact", "--pair", "int8", "int8", "--tpu-numerics",
          "--target", "v5e", "cpu"],
         "--tpu-numerics: needs TPU targets (--target v4 v5e ...); got cpu"),
        (["--tpu-numerics"], "--tpu-numerics needs --fn MODULE:FUNCTION"),
    ],
)  # fmt: skip
def test_fn_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
