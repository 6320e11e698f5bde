"""Regenerate ``tests/jax_cases/cases.py`` from JAX's own test files (run by hand).

    python tests/jax_cases/extract.py /path/to/jax/checkout

Reads, at the tag in ``TAG``, the parameter lists of JAX's dot_general / matmul / einsum /
convolution tests: the cases that JAX's ``parameterized`` and ``jtu.sample_product``
decorators generate (with JAX's default ``JAX_NUM_GENERATED_CASES`` of 10, the sampling
JAX's own test runs use; JAX seeds it, so the list is deterministic), and, for the einsum
tests written as plain methods, the subscripts and operand shapes they pass. Only the data
is written; none of JAX's test code.
"""

from __future__ import annotations

import ast
import enum
import pathlib
import pprint
import subprocess
import sys
import types

import numpy as np

TAG = "jax-v0.10.2"
FILES = {
    "tests/lax_test.py": [
        "testConv",
        "testConvPreferredElement",
        "testConvAgainstNumpy",
        "testConvWithGeneralPadding",
        "testConvWithGeneralPaddingAgainstNumpy",
        "testConvGeneralDilated0D",
        "testConvGeneralDilated",
        "testDot",
        "testDotPreferredElement",
        "test_mixed_fp8_dot_general",
        "testDotAgainstNumpy",
        "testDotGeneralContractOnly",
        "testDotGeneralContractAndBatch",
        "testDotGeneralAgainstNumpy",
        "testBatchMatMul",
    ],
    "tests/lax_numpy_test.py": ["testMatmul", "testMixedPrecisionDot", "testDot"],
    "tests/lax_numpy_einsum_test.py": [
        "test_from_dask",
        "test_einsum_mixed_precision",
        "test_einsum_optimization_modes",
    ],
}
#: Plain einsum test methods: ``s = '...'`` and ``x = r.randn(shape...)`` in their bodies.
PLAIN_EINSUM_FILE = "tests/lax_numpy_einsum_test.py"


def encode(v):
    """Parameters as plain data: dtypes by name, enums by name, tuples kept."""
    from jax import lax

    if isinstance(v, lax.ConvDimensionNumbers):
        return {"ConvDimensionNumbers": [list(map(int, s)) for s in v]}
    if isinstance(v, (type, np.dtype)) and not isinstance(v, enum.EnumMeta):
        try:
            return {"dtype": np.dtype(v).name}
        except TypeError:
            pass
    if isinstance(v, enum.Enum):
        return {"enum": f"{type(v).__name__}.{v.name}"}
    if isinstance(v, (list, tuple)):
        return type(v)(encode(x) for x in v)
    if isinstance(v, dict):
        return {k: encode(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    raise TypeError(f"cannot encode {v!r}")


def parameterized_cases(path: str, source: str, wanted: list[str]) -> list[dict]:
    from absl.testing import parameterized

    recorded: dict[str, list[dict]] = {}

    def recorder(named):
        def make(*cases):
            if len(cases) == 1 and not isinstance(cases[0], (dict, tuple)):
                cases = tuple(cases[0])

            def deco(fn):
                recorded.setdefault(fn.__name__, []).extend(cases)
                return fn

            return deco

        return make

    saved = parameterized.parameters, parameterized.named_parameters
    parameterized.parameters = recorder(False)
    parameterized.named_parameters = recorder(True)
    try:
        mod = types.ModuleType("jax_case_source")
        mod.__file__ = path
        exec(compile(source, path, "exec"), mod.__dict__)
    finally:
        parameterized.parameters, parameterized.named_parameters = saved
    out = []
    for name in wanted:
        for i, raw in enumerate(recorded[name]):
            case = dict(raw) if isinstance(raw, dict) else {"args": tuple(raw)}
            case.pop("testcase_name", None)
            out.append({"file": path, "test": name, "index": i, "params": encode(case)})
    return out


def plain_einsum_cases(path: str, source: str) -> list[dict]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
            continue
        shapes: dict[str, tuple[int, ...]] = {}
        subscripts = None
        operands = None
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                tgt, val = stmt.targets[0], stmt.value
                if not isinstance(tgt, ast.Name):
                    continue
                if isinstance(val, ast.Constant) and isinstance(val.value, str):
                    subscripts = val.value
                if (
                    isinstance(val, ast.Call)
                    and isinstance(val.func, ast.Attribute)
                    and val.func.attr in ("randn", "ones")
                ):
                    args = val.args[0].elts if val.func.attr == "ones" else val.args
                    try:
                        shapes[tgt.id] = tuple(ast.literal_eval(a) for a in args)
                    except ValueError:  # sizes named by variables: not a plain case
                        pass
            if (
                isinstance(stmt, ast.Call)
                and isinstance(stmt.func, ast.Attribute)
                and stmt.func.attr == "_check"
            ):
                if all(isinstance(a, ast.Name) for a in stmt.args[1:]):
                    operands = [a.id for a in stmt.args[1:]]
        if subscripts is not None and operands is not None and all(o in shapes for o in operands):
            out.append(
                {
                    "file": path,
                    "test": node.name,
                    "index": 0,
                    "params": {
                        "subscripts": subscripts,
                        "shapes": [shapes[o] for o in operands],
                        "dtype": {"dtype": "float32"},
                    },
                }
            )
    return out


HEADER = '''"""Parameter lists of JAX's own dot_general / matmul / einsum / convolution tests.

Vendored data (no test code) from https://github.com/jax-ml/jax at tag {tag}
(commit {commit}), files:
{files}
JAX is Copyright The JAX Authors, licensed under the Apache License, Version 2.0
(https://www.apache.org/licenses/LICENSE-2.0).
Generated by ``tests/jax_cases/extract.py``; do not edit by hand.

Each case: the JAX file and test method, the index of the case among that method's
generated cases (JAX's default ``JAX_NUM_GENERATED_CASES`` = 10 sampling), and its
parameters: dtypes as ``{{"dtype": name}}``, enums as ``{{"enum": "Class.NAME"}}``,
``lax.ConvDimensionNumbers`` as ``{{"ConvDimensionNumbers": [lhs, rhs, out]}}``.
"""

# fmt: off
CASES = '''


def main(repo: str) -> None:
    root = pathlib.Path(repo)

    def show(path):
        return subprocess.run(
            ["git", "-C", str(root), "show", f"{TAG}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", f"{TAG}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    cases = []
    for path, wanted in FILES.items():
        cases += parameterized_cases(path, show(path), wanted)
    cases += plain_einsum_cases(PLAIN_EINSUM_FILE, show(PLAIN_EINSUM_FILE))
    files = "\n".join(f"  {f}" for f in FILES)
    text = HEADER.format(tag=TAG, commit=commit, files=files)
    text += pprint.pformat(cases, width=100, sort_dicts=False)
    dest = pathlib.Path(__file__).with_name("cases.py")
    dest.write_text(text + "\n")
    print(f"{len(cases)} cases -> {dest}")


if __name__ == "__main__":
    main(sys.argv[1])
