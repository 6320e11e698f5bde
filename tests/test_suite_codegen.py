"""The suite's XLA:CPU code generation settings (tests/_xla_flags.py) against XLA's
defaults: tests/_codegen_programs.py's programs run in this process and in a subprocess
with the other setting. Exact results are the same bits; bounded ones (f32 multiply-adds
that LLVM contracts into FMAs at -O2, not at -O0) are each within the contract's bound."""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
from _codegen_programs import BOUNDED, DN, EXACT
from _xla_flags import with_flags

from emulate import bounds

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


def _other_setting(tmp_path: pathlib.Path) -> dict[str, np.ndarray]:
    """The programs' results in a subprocess with the setting this session does not use
    (XLA's defaults, or the suite's under ``EMULATE_TEST_XLA_DEFAULT=1``)."""
    out = str(tmp_path / "other.pickle")
    quick = os.environ.get("EMULATE_TEST_XLA_DEFAULT", "") != "1"
    env = dict(os.environ, XLA_FLAGS=with_flags(os.environ.get("XLA_FLAGS", ""), not quick))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile anew, with the other setting
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(tests=str(TESTS), out=out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, "rb") as f:
        return pickle.load(f)


def test_programs_under_both_settings_keep_the_contract(tmp_path: pathlib.Path) -> None:
    other = _other_setting(tmp_path)
    assert sorted(other) == sorted([*EXACT, *BOUNDED])
    for name, program in EXACT.items():
        got = program()
        assert np.isfinite(got.astype(np.float64)).mean() > 0.5, name
        assert _same_bits(got, other[name]), (name, got, other[name])
    for name, bounded in BOUNDED.items():
        got, x, w, magnitudes, extra = bounded()
        x64 = np.asarray(x, np.float64)
        want = x64 @ w
        bound = bounds.dot_general_bound(
            x64.astype(np.float32), magnitudes.astype(np.float32), DN, extra_terms=extra
        )
        for r in (got, other[name]):
            err = np.abs(r.astype(np.float64) - want)
            assert np.all(err <= bound + np.abs(want) * 2.0**-24), (name, np.max(err - bound))
