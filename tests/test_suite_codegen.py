"""The suite's XLA:CPU code generation settings (tests/_xla_flags.py) give the bits XLA's
defaults give: tests/_codegen_programs.py's programs, run in this process and in a
subprocess with XLA's default flags."""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
from _codegen_programs import results
from _xla_flags import with_flags

TESTS = pathlib.Path(__file__).resolve().parent

CHILD = """
import pickle, sys
sys.path[:0] = [{tests!r}]
from _codegen_programs import results
with open({out!r}, "wb") as f:
    pickle.dump(results(), f)
"""


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal dtype, shape and values, zeros' signs included; NaN where the other has NaN."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(g) & np.isnan(w)
    same = (g == w) & (np.signbit(g) == np.signbit(w))
    return bool(np.all(nan | same))


def test_programs_give_the_same_bits_with_xla_defaults(tmp_path: pathlib.Path) -> None:
    out = str(tmp_path / "default.pickle")
    env = dict(os.environ, XLA_FLAGS=with_flags(os.environ.get("XLA_FLAGS", ""), add=False))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile anew, with XLA's defaults
    subprocess.run(
        [sys.executable, "-c", CHILD.format(tests=str(TESTS), out=out)],
        env=env,
        check=True,
        capture_output=True,
    )
    with open(out, "rb") as f:
        want = pickle.load(f)
    got = results()
    assert sorted(got) == sorted(want)
    for name in got:
        assert np.isfinite(got[name].astype(np.float64)).mean() > 0.5, name
        assert _same_bits(got[name], want[name]), (name, got[name], want[name])
