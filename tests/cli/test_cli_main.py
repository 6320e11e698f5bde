"""The emulate command line as a whole: unknown or missing commands, python -m emulate.

Default vs long: the bad commands run in process; python -m emulate runs one command in a
fresh interpreter by default (validate, whose run also checks what
tests/cli/test_cli_validate.py leaves to it: no progress bar, no .hypothesis/ left behind),
the bad commands' runs under python -m are long."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from emulate import cli
from emulate.compiler import devices

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


# long: more fresh interpreters; by default the bad commands' one line and exit code 2 are
# checked in process (test_bad_arguments_exit_2_with_one_line's ["bogus"],
# tests/cli/test_cli_validate.py's bad input) and python -m emulate runs in
# test_python_dash_m_validate_without_libtpu_lines_or_traceback
@pytest.mark.long
@pytest.mark.parametrize("argv", [["nope"], ["validate", "--examples", "0"]])
def test_python_dash_m_bad_command_without_traceback(argv: list[str]) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "emulate", *argv], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_python_dash_m_validate_without_libtpu_lines_or_traceback(tmp_path) -> None:
    # ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu starts even where another process holds its lock
    # file, as it does on a CI machine; without the fix it printed five warning lines. JAX
    # picks its platform (JAX_PLATFORMS unset) and runs validate's checks on the CPU.
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    env.pop("JAX_PLATFORMS", None)
    run = subprocess.run(
        [sys.executable, "-m", "emulate", "validate", "--target", "cpu", "--formats", "uint4",
         "--modes", "fast", "--examples", "2"],
        capture_output=True, text=True, env=env, check=False, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # no libtpu lines; no progress bar when stderr is not a terminal
    assert "cpu     uint4 x uint4  fast  int8" in run.stdout
    assert list(tmp_path.iterdir()) == []  # no .hypothesis/ left in the working directory
    if devices.libtpu_version() is not None:  # and the compile-only devices still load
        probe = (
            "from emulate import cli, compiler; cli.main(['formats']) ; print(compiler.available())"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
        )
        assert out.stdout.splitlines()[-1] == "True"
