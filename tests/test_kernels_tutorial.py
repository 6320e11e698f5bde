"""Collects docs/kernels_test.py, the suite of docs/testing.md for a user's own kernels
(docs/my_kernels.py), with docs/ on sys.path as when it runs from there."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

_DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
if str(_DOCS) not in sys.path:
    sys.path.insert(0, str(_DOCS))
_spec = importlib.util.spec_from_file_location(
    "emulate_docs_kernels_test", _DOCS / "kernels_test.py"
)
assert _spec is not None and _spec.loader is not None
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)

globals().update({k: v for k, v in vars(_suite).items() if k.startswith("test_")})


def test_the_suite_is_short_and_complete() -> None:
    names = sorted(k for k in vars(_suite) if k.startswith("test_"))
    assert names == [
        "test_a_broken_kernel_fails_with_a_reproducer",
        "test_bf16_times_fp8_pallas_kernel",
        "test_int4_weight_only",
        "test_int8_matmul",
    ]
    assert len((_DOCS / "kernels_test.py").read_text().splitlines()) <= 60
