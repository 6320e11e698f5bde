"""The emulate command line as a whole: unknown or missing commands, python -m emulate.

Default vs long: the bad commands run in process; python -m emulate runs one command in a
fresh interpreter by default (explain), the bad command's run under python -m is long."""

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


# long: a second fresh interpreter; by default the bad command's one line and exit code 2
# are checked in process (test_bad_arguments_exit_2_with_one_line's ["bogus"]) and
# python -m emulate runs in test_no_libtpu_start_up_lines_on_a_machine_without_a_tpu
@pytest.mark.long
def test_python_dash_m_runs_without_traceback() -> None:
    # a command that runs: test_no_libtpu_start_up_lines_on_a_machine_without_a_tpu
    bad = subprocess.run(
        [sys.executable, "-m", "emulate", "nope"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_no_libtpu_start_up_lines_on_a_machine_without_a_tpu():
    # ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu starts even where another process holds its lock
    # file, as it does on a CI machine; without the fix it printed five warning lines.
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    env.pop("JAX_PLATFORMS", None)
    run = subprocess.run(
        [sys.executable, "-m", "emulate", "explain", "int8", "int8"],
        capture_output=True, text=True, env=env, check=False, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0 and "int8 x int8" in run.stdout
    assert run.stderr == ""
    if devices.libtpu_version() is not None:  # and the compile-only devices still load
        probe = (
            "from emulate import cli, compiler; cli.main(['formats']) ; print(compiler.available())"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
        )
        assert out.stdout.splitlines()[-1] == "True"
