"""The package type-checks: mypy, with the ``[mypy]`` settings of setup.cfg, finds no error.

mypy runs in a subprocess from the project root, so that the settings (``files = emulate``)
and the cache (``.mypy_cache``) are the same as for ``mypy`` run by hand there. A cold run
(no cache) takes some 15 to 25 s; a warm one under a second.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mypy_finds_no_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "setup.cfg")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"mypy reports errors (exit {proc.returncode}):\n{report}"
