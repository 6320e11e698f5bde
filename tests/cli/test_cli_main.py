"""The emulate command line as a whole: unknown or missing commands, python -m emulate."""

from __future__ import annotations

import subprocess
import sys

import pytest

from emulate import cli

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
