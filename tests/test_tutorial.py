"""Collects the tests of docs/tutorial_test.py, the tutorial suite shown in docs/testing.md."""

from __future__ import annotations

import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).resolve().parent.parent / "docs" / "tutorial_test.py"
_spec = importlib.util.spec_from_file_location("emulate_docs_tutorial_test", _PATH)
assert _spec is not None and _spec.loader is not None
_tutorial = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tutorial)

globals().update({k: v for k, v in vars(_tutorial).items() if k.startswith("test_")})


def test_the_tutorial_has_its_tests() -> None:
    names = sorted(k for k in vars(_tutorial) if k.startswith("test_"))
    assert names == [
        "test_a_wrong_result_is_reported_element_by_element",
        "test_bf16_activations_times_fp8_weights_on_tpu_v4",
        "test_fp4_is_exact_on_every_deployed_target",
        "test_int4_projection",
    ]
