"""emulate.testing's reproducers: reproducer scripts, plan_key, representative_targets."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate import formats, targets
from emulate import testing as et
from emulate.testing.reproducers import array_source

DN = (((1,), (0,)), ((), ()))
LOW = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]


def test_reproducer_runs_and_checks():
    a = np.array([[0x01, 0x38]], np.uint8).view(ml_dtypes.float8_e4m3fn)
    b = np.array([[0x3F80], [0xC000]], np.uint16).view(ml_dtypes.bfloat16)
    problem = et.DotProblem(b.T, a.T, DN, "float32")
    script = et.reproducer(problem, target="v4", mode="fast")
    assert script.splitlines()[6:11] == [
        "lhs = np.array([[0x3f80, 0xc000]], dtype=np.uint16).view(ml_dtypes.bfloat16)",
        "# lhs values: [[1.0, -2.0]]",
        "rhs = np.array([[0x01],",
        "                [0x38]], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)",
        "# rhs values: [[0.001953125], [1.0]]",
    ]
    assert "target='tpu_v4', mode='fast'" in script
    exec(compile(script, "<reproducer>", "exec"), {})


def test_reproducer_of_every_operand_dtype_round_trips():
    for name in [*LOW, "bfloat16", "float16", "float32"]:
        f = formats.get(name)
        x = np.arange(4).astype(np.uint8).view(f.dtype) if f.bits <= 8 else np.ones(4, f.dtype)
        scope: dict = {}
        line = array_source("x", x).splitlines()[0]
        exec("import numpy as np\nimport ml_dtypes\n" + line, scope)
        assert scope["x"].dtype == x.dtype
        assert scope["x"].tobytes() == x.tobytes()


def test_representative_targets_one_per_program():
    assert et.representative_targets("int8", "int8") == ["tpu_v2", "tpu_v4", "tpu_v5e"]
    for lhs, rhs in [("int4", "int4"), ("bfloat16", "float8_e4m3fn")]:
        reps = et.representative_targets(lhs, rhs)
        keys = {
            t.name: et.plan_key(emulate.plan(lhs, rhs, target=t, preferred_element_type="float32"))
            for t in targets.all_targets()
        }
        assert sorted(keys[t] for t in reps) == sorted(set(keys.values()))


def test_reproducer_bad_mode():
    x = np.ones((1, 1), np.int8)
    problem = et.DotProblem(x, x, DN, None)
    with pytest.raises(ValueError, match=r"^mode: expected one of 'fast', 'exact', got 'quick'$"):
        et.reproducer(problem, target="v4", mode="quick")
    with pytest.raises(ValueError, match=r"^mode: expected one of 'fast', 'exact', got None$"):
        et.reproducer(problem, target="v4", mode=None)
