"""JAX's own dot_general / matmul / einsum / convolution test cases, run against emulate.

The cases are the parameter lists of JAX's tests (``tests/jax_cases/cases.py``, vendored
from jax-v0.10.2 with its origin and license). Each case runs three ways on the current
target: JAX itself, emulate's drop-in (``emulate.dot_general`` / ``matmul`` / ``einsum`` /
``conv_general_dilated``, where the JAX call has one), and the JAX function wrapped in
:func:`emulate.polyfill`. The drop-in and the polyfilled function must give what JAX gives:
the same result dtype, shape and bits, or the same exception type. The operands are small
integers (halves for floats), so every sum is exact in every type and bit-identity is the
bound for emulated pairs too.

Targets: ``cpu`` (XLA's CPU backend: emulate passes through what it runs natively) and
``tpu_v2`` (only float32 x float32 native, so every other pair of emulate's types is
emulated). By default (CI) the module runs :func:`subset`, 136 cases that cover every JAX
test method and every dtype pairing it samples; ``EMULATE_JAX_CASES=all`` runs all 339.
On ``cpu`` the default runs the first case of each test method only (:func:`_params`); the
rest of the cases on ``cpu`` under EMULATE_LONG_TESTS=1.

A case that behaves differently is listed in ``DIFFERENT`` with the reason.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax_cases.cases import CASES

import emulate

# Some JAX cases ask for float64 without x64, which JAX truncates with a warning.
pytestmark = pytest.mark.filterwarnings("ignore:Explicitly requested dtype")


def _decode(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return jnp.dtype(v["dtype"])
    if isinstance(v, dict) and set(v) == {"enum"}:
        cls, name = v["enum"].split(".")
        assert cls == "Precision", v
        return lax.Precision[name]
    if isinstance(v, dict) and set(v) == {"ConvDimensionNumbers"}:
        return lax.ConvDimensionNumbers(*(tuple(s) for s in v["ConvDimensionNumbers"]))
    if isinstance(v, dict):
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_decode(x) for x in v)
    return v


def _values(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Small exact values: every product and sum of them is exact in every type."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dt, np.unsignedinteger):
        return rng.integers(0, 4, shape).astype(dt)
    if np.issubdtype(dt, np.integer):
        return rng.integers(-3, 4, shape).astype(dt)
    if np.issubdtype(dt, np.complexfloating):
        return (rng.integers(-3, 4, shape) + 1j * rng.integers(-3, 4, shape)).astype(dt)
    if dt.name.startswith("int") or dt.name.startswith("uint"):  # ml_dtypes int4/uint4
        lo = 0 if dt.name.startswith("u") else -3
        return rng.integers(lo, 4, shape).astype(dt)
    return (rng.integers(-4, 5, shape) / 2).astype(dt)


def _dot_dn(lhs_ndim: int) -> Any:
    return (((lhs_ndim - 1,), (0,)), ((), ()))


def _case_functions(case: dict) -> tuple[Any, Any, list[np.ndarray]]:
    """(JAX function, emulate drop-in or None, operands) for one case."""
    test, p = case["test"], _decode(case["params"])
    rng = np.random.default_rng(zlib.crc32(f"{case['test']}:{case['index']}".encode()))
    if test in ("testDot", "testDotAgainstNumpy", "testDotPreferredElement"):
        ldt = p.get("lhs_dtype", p.get("dtype"))
        rdt = p.get("rhs_dtype", p.get("dtype"))
        prec = p.get("precision", lax.Precision.HIGHEST if "Numpy" in test else None)
        pet = p.get("preferred_element_type")
        args = [_values(p["lhs_shape"], ldt, rng), _values(p["rhs_shape"], rdt, rng)]
        dn = _dot_dn(len(p["lhs_shape"]))

        def jf(x, y):
            return lax.dot(x, y, precision=prec, preferred_element_type=pet)

        def ef(x, y):
            return emulate.dot_general(x, y, dn, prec, pet)

        # lax.dot is a front end over dot_general for 1-D and 2-D operands that contract
        # lhs's last dimension with rhs's first, and refuses other shapes itself: emulate
        # has no lax.dot, so those cases run through polyfill only.
        ls, rs = p["lhs_shape"], p["rhs_shape"]
        fits = 1 <= len(ls) <= 2 and 1 <= len(rs) <= 2 and ls[-1] == rs[0]
        return jf, ef if fits else None, args
    if test == "test_mixed_fp8_dot_general":
        args = [
            _values(p["lhs_shape"], p["dtype_lhs"], rng),
            _values(p["rhs_shape"], p["dtype_rhs"], rng),
        ]
        dn = _dot_dn(len(p["lhs_shape"]))
        return (
            lambda x, y: lax.dot(x, y, preferred_element_type=jnp.float32),
            lambda x, y: emulate.dot_general(x, y, dn, preferred_element_type=jnp.float32),
            args,
        )
    if test.startswith("testDotGeneral"):
        if "dimension_numbers" in p:
            dn = p["dimension_numbers"]
        else:
            dn = ((p["lhs_contracting"], p["rhs_contracting"]), ([], []))
        args = [_values(p["lhs_shape"], p["dtype"], rng), _values(p["rhs_shape"], p["dtype"], rng)]
        return (
            lambda x, y: lax.dot_general(x, y, dn),
            lambda x, y: emulate.dot_general(x, y, dn),
            args,
        )
    if test == "testBatchMatMul":
        nd = len(p["lhs_shape"])
        dn = (((nd - 1,), (nd - 2,)), (tuple(range(nd - 2)), tuple(range(nd - 2))))
        args = [_values(p["lhs_shape"], p["dtype"], rng), _values(p["rhs_shape"], p["dtype"], rng)]
        return lax.batch_matmul, lambda x, y: emulate.dot_general(x, y, dn), args
    if test.startswith("testConv"):
        return _conv_case(test, p, rng)
    if test == "testMatmul":
        args = [
            _values(p["lhs_shape"], p["lhs_dtype"], rng),
            _values(p["rhs_shape"], p["rhs_dtype"], rng),
        ]
        return jnp.matmul, emulate.matmul, args
    if test == "testMixedPrecisionDot":
        args = [_values((5,), p["lhs_dtype"], rng), _values((5,), p["rhs_dtype"], rng)]
        return jnp.dot, None, args
    if test == "test_einsum_mixed_precision":
        args = [_values((10,), p["lhs_dtype"], rng), _values((10,), p["rhs_dtype"], rng)]
        return (
            lambda x, y: jnp.einsum("a,a->a", x, y),
            lambda x, y: emulate.einsum("a,a->a", x, y),
            args,
        )
    if test == "test_from_dask":
        einstr = p["einstr"]
        sizes: dict[str, int] = {}
        cycle = iter([2, 3, 4] * 10)
        inputs = einstr.split("->")[0].split(",")
        shapes = [
            tuple(sizes.setdefault(c, next(cycle)) for c in names.replace("...", "01"))
            for names in inputs
        ]
        args = [_values(s, p["dtype"], rng) for s in shapes]
        return (
            lambda *a: jnp.einsum(einstr, *a),
            lambda *a: emulate.einsum(einstr, *a),
            args,
        )
    if test == "test_einsum_optimization_modes":
        sig, opt = p["signature"], p["optimize"]
        args = [_values(s, p["dtype"], rng) for s in p["shapes"]]
        return (
            lambda *a: jnp.einsum(sig, *a, optimize=opt),
            lambda *a: emulate.einsum(sig, *a, optimize=opt),
            args,
        )
    # The einsum tests written as plain methods.
    subs = p["subscripts"]
    args = [_values(s, p["dtype"], rng) for s in p["shapes"]]
    return (
        lambda *a: jnp.einsum(subs, *a, precision=lax.Precision.HIGHEST),
        lambda *a: emulate.einsum(subs, *a, precision=lax.Precision.HIGHEST),
        args,
    )


def _conv_case(test: str, p: dict, rng: np.random.Generator) -> tuple[Any, Any, list]:
    x = _values(p["lhs_shape"], p["dtype"], rng)
    w = _values(p["rhs_shape"], p["dtype"], rng)
    kw: dict[str, Any] = {}
    if test in ("testConv", "testConvAgainstNumpy"):
        strides, padding = p["strides"], p["padding"]
    elif test == "testConvPreferredElement":
        strides, padding = (1, 1), "VALID"
        kw["preferred_element_type"] = p["preferred_element_type"]
    else:
        strides = p.get("strides", ())
        padding = p.get("padding", ())
        kw.update(lhs_dilation=p.get("lhs_dilation"), rhs_dilation=p.get("rhs_dilation"))
        if "dimension_numbers" in p:
            lp, rp = p["perms"]
            x, w = np.transpose(x, lp), np.transpose(w, rp)
            kw.update(
                dimension_numbers=p["dimension_numbers"],
                feature_group_count=p["feature_group_count"],
                batch_group_count=p["batch_group_count"],
            )
        if test.endswith("0D"):
            strides, padding = (), ()
    if isinstance(padding, list):
        padding = tuple(tuple(q) for q in padding)

    def jf(a, b):
        return lax.conv_general_dilated(a, b, strides, padding, **kw)

    def ef(a, b):
        return emulate.conv_general_dilated(a, b, strides, padding, **kw)

    return jf, ef, [x, w]


def _outcome(fn: Any, args: list) -> tuple:
    """What a call gives: ("ok", dtype, shape, bytes) or ("raises", exception type)."""
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - the exception type is the observation
        return ("raises", type(e))
    a = np.asarray(out)
    return ("ok", a.dtype.name, a.shape, a.tobytes())


def _case_id(case: dict) -> str:
    return f"{case['test']}-{case['index']}"


def _family(dtype_name: str) -> str:
    for prefix in ("complex", "bool", "uint", "int", "float8", "bfloat16", "float16"):
        if dtype_name.startswith(prefix):
            return prefix
    return dtype_name  # float32, float64


def subset() -> list[dict]:
    """Per JAX test method, the first case of each combination of operand dtype families
    (complex, bool, unsigned, signed, float8, bfloat16, float16, float32, float64; 136 of
    the 339 cases): every method, every dtype pairing it samples, its layouts."""
    chosen, seen = [], set()
    for c in CASES:
        fams = tuple(
            sorted(
                (k, _family(v["dtype"]))
                for k, v in c["params"].items()
                if isinstance(v, dict) and set(v) == {"dtype"}
            )
        )
        if (c["test"], fams) not in seen:
            seen.add((c["test"], fams))
            chosen.append(c)
    return chosen


def _params() -> list[Any]:
    """The cases on each target. On ``cpu`` (emulate passes through what XLA runs), the
    first case of each JAX test method by default, the rest of the subset marked long."""
    every = os.environ.get("EMULATE_JAX_CASES", "") == "all"
    cases = CASES if every else subset()
    firsts = {id(next(c for c in cases if c["test"] == t)) for t in {c["test"] for c in cases}}
    return [
        pytest.param(
            c,
            target,
            id=f"{_case_id(c)}-{target}",
            marks=() if target != "cpu" or id(c) in firsts else pytest.mark.long,
        )
        for target in TARGETS
        for c in cases
    ]


TARGETS = ("cpu", "tpu_v2")


#: Cases whose emulate result differs from JAX's on purpose: id -> reason.
DIFFERENT: dict[str, str] = {}


def _show(o: tuple) -> str:
    if o[0] == "raises":
        return f"raises {o[1].__name__}"
    return f"{o[1]}{list(o[2])}"


@pytest.mark.parametrize("way", ["dropin", "polyfill"])
@pytest.mark.parametrize("case,target", _params())
def test_behaves_as_jax(case, target, way):
    jf, ef, args = _case_functions(case)
    if way == "dropin" and ef is None:
        # jnp.dot, and lax.dot on shapes it refuses, have no emulate drop-in: polyfill is
        # how they run, checked by the "polyfill" way.
        assert case["test"] in ("testMixedPrecisionDot", "testDot")
        return
    want = _outcome(jf, args)
    with emulate.use_target(target):
        got = _outcome(ef if way == "dropin" else emulate.polyfill(jf), args)
    key = _case_id(case)
    if key in DIFFERENT:
        assert got != want, f"{key} now behaves as JAX: remove it from DIFFERENT"
        return
    assert _show(got) == _show(want)
    assert got == want, f"{key}: {way} result bits differ from JAX's"
