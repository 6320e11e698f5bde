"""The sweep of the public callables added since the third sweep (issue 49, item 4).

Callables: ``emulate.ragged_dot``, ``ragged_dot_general``, ``polyfill`` of
``lax.ragged_dot``, ``emulate.pallas.ragged_dot``, ``ragged_dot_route``, ``weight_route``,
``prepare_weights(experts=)``, ``use_route``, ``use_cpu_kernel`` (and its
``EMULATE_CPU_KERNEL`` switch), and ``emulate.compiler.compile``'s ``donate_argnums``.

Each :class:`Case` is one call and what it must give: JAX's own answer where JAX has the
call (the same dtype, shape and bits: the operands are small halves, so every sum is
exact), the oracle's (``emulate.reference``, float64 with mode "fast"'s bound for QArray
experts) where JAX has none, or a clear error: a ``TypeError`` / ``ValueError`` /
``NotImplementedError`` whose message starts with the argument's name (``"rhs: ..."``), or
the exception type JAX raises for the same call. A call with a weight operand runs under
every route setting (``auto`` with the CPU kernel on and off, ``xla``, ``kernel``,
``interpret``): each gives the ``xla`` setting's answer (bits for exact pairs, the bound for
QArray experts) or the same error; ``kernel`` / ``interpret`` may refuse with their
documented ValueError (a call their kernel cannot take). Anything else is a *finding*.

Run it::

    python -m tests._surface_sweep            # every case, counts per callable
    python -m tests._surface_sweep --list     # the findings' cases and what they gave
    python -m tests._surface_sweep -k ragged  # callables whose name contains "ragged"

``tests/test_surface_sweep.py`` runs :data:`SUBSET` by default and every case under
``EMULATE_LONG_TESTS=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

import emulate
import emulate.compiler
import emulate.pallas
from emulate import bounds, reference

E4 = ml_dtypes.float8_e4m3fn
BF16 = jnp.bfloat16
BASIC = lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (0,), (0,))
#: rows stored (K, M): lhs contracting axis 0, ragged axis 1
KM = lax.RaggedDotDimensionNumbers((((0,), (1,)), ((), ())), (1,), (0,))
#: the lhs ragged dimension contracting: one partial sum per group
CONTRACTING = lax.RaggedDotDimensionNumbers((((1,), (0,)), ((), ())), (1,), ())
#: the route settings a weight call runs under: (use_route, use_cpu_kernel)
SETTINGS = (("xla", True), ("auto", True), ("auto", False), ("kernel", True), ("interpret", True))

#: what a clear error's message starts with: the argument(s) it is about, then a colon
NAMED = re.compile(r"^[A-Za-z_][\w.\[\]']*(, [A-Za-z_][\w.\[\]']*)*: \S")


def halves(seed: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Small halves (integers for integer types): every product and sum exact."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if np.issubdtype(dt, np.integer) or dt.name.startswith(("int", "uint")):
        lo = 0 if dt.name.startswith("u") else -3
        return rng.integers(lo, 4, shape).astype(dt)
    return (rng.integers(-4, 5, shape) / 2).astype(dt)


@functools.cache  # the same experts for every front end and target: quantized once
def experts(fmt: str = "int8", e: int = 3, k: int = 64, n: int = 16, seed: int = 1, **kw: Any):
    """A stacked QArray: ``(e, k, n)`` values quantized with scales along K."""
    w = np.random.default_rng(seed).standard_normal((e, k, n)).astype(np.float32)
    kw.setdefault("axis", 1)
    if fmt == "MXFP4":
        return emulate.quantize(w, emulate.mx.MXFP4, **kw)
    kw.setdefault("block_shape", 32)
    return emulate.quantize(w, fmt, **kw)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A call's result (``value``) or its exception (``error``)."""

    value: Any = None
    error: BaseException | None = None

    def describe(self) -> str:
        if self.error is not None:
            return f"{type(self.error).__name__}: {str(self.error)[:300]}"
        v = self.value
        if isinstance(v, (jax.Array, np.ndarray)):
            return f"{v.dtype}{list(v.shape)}"
        return repr(v)[:200]


def outcome(thunk: Callable[[], Any]) -> Outcome:
    try:
        value = thunk()
        if isinstance(value, jax.Array):
            value.block_until_ready()
        return Outcome(value=value)
    except Exception as e:  # noqa: BLE001 - the sweep records every exception
        return Outcome(error=e)


@dataclasses.dataclass(frozen=True)
class Case:
    """One call of a callable and what it must give.

    Attributes:
      callable: the public name swept.
      name: the case, in words.
      run: the call (under the current route setting).
      want: the oracle: JAX's call or the reference; returns the expected value or raises
        what JAX raises. None: the call must raise a clear error (``errors``).
      bound: for a result within a bound: a function of the result giving the elementwise
        bound on ``|result - want|`` (float64); None: bits.
      errors: the exception types accepted where ``want`` is None or raises.
      weight: the call has a weight operand: it runs under every route setting.
      differs: why emulate refuses (with a clear error) what JAX computes; "" where it
        must not.
    """

    callable: str
    name: str
    run: Callable[[], Any]
    want: Callable[[], Any] | None = None
    bound: Callable[[Any], np.ndarray] | None = None
    errors: tuple[type[BaseException], ...] = (TypeError, ValueError)
    weight: bool = False
    differs: str = ""
    call: tuple[Any, ...] = ()  # (args, kwargs, target) of a front end's case


@contextlib.contextmanager
def setting(route: str, cpu_kernel: bool) -> Iterator[None]:
    with emulate.use_route(route), emulate.use_cpu_kernel(cpu_kernel):
        yield


def _same_value(got: Any, want: Any, bound: Any) -> str:
    """ "" where ``got`` is ``want`` (dtype, shape, bits or within ``bound``), else why not."""
    if isinstance(want, (jax.Array, np.ndarray)) and not isinstance(want, (jax.Array, np.ndarray)):
        return f"a {type(got).__name__} where an array was expected"
    if not isinstance(want, (jax.Array, np.ndarray)):
        return "" if got == want else f"{got!r} != {want!r}"
    if not isinstance(got, (jax.Array, np.ndarray)):
        return f"a {type(got).__name__} where an array was expected"
    if np.dtype(got.dtype) != np.dtype(want.dtype) or tuple(got.shape) != tuple(want.shape):
        return f"{got.dtype}{list(got.shape)} where {want.dtype}{list(want.shape)} was expected"
    g, w = np.asarray(got), np.asarray(want)
    if np.iscomplexobj(g):  # real and imaginary parts side by side
        g, w = g.view(g.real.dtype), w.view(w.real.dtype)
    g, w = g.astype(np.float64), w.astype(np.float64)
    if bound is None:
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        if not same.all():
            i = tuple(int(j) for j in np.argwhere(~same)[0])
            return f"{int((~same).sum())} element(s) differ, e.g. at {i}: {g[i]} != {w[i]}"
        return ""
    b = np.broadcast_to(bound, g.shape)
    finite = np.isfinite(b)
    ok = np.where(finite, np.abs(g - w) <= b, (g == w) | (np.isnan(g) & np.isnan(w)))
    if not ok.all():
        i = tuple(int(j) for j in np.argwhere(~ok)[0])
        return f"{int((~ok).sum())} element(s) off, e.g. at {i}: {g[i]} vs {w[i]} (bound {b[i]})"
    return ""


def _clear(e: BaseException, case: Case, jax_error: BaseException | None) -> str:
    """ "" where ``e`` is a clear error for the case, else why not."""
    if jax_error is not None and type(e) is type(jax_error):
        return ""
    if isinstance(jax_error, jax.errors.JaxRuntimeError) and isinstance(e, case.errors):
        jax_error = None  # XLA refuses what emulate refuses up front: a clear error is due
    elif jax_error is not None and not case.differs:
        return f"{type(e).__name__} where JAX raises {type(jax_error).__name__}"
    if not isinstance(e, case.errors + (NotImplementedError,)):
        return f"unclear: {type(e).__name__}: {str(e)[:200]}"
    if not NAMED.match(str(e)):
        return f"names no argument: {type(e).__name__}: {str(e)[:200]}"
    return ""


def judge(case: Case) -> list[str]:
    """The case's findings (empty: it behaves)."""
    want = outcome(case.want) if case.want is not None else None
    jax_error = want.error if want is not None else None
    runs = [("", outcome(case.run))]
    if case.weight:
        runs = []
        for route, cpu in SETTINGS:
            with setting(route, cpu):
                runs.append((f"{route}{'' if cpu else ' (no CPU kernel)'}", outcome(case.run)))
    found = []
    base = runs[0][1]
    for label, got in runs:
        where = f"[{label}] " if label else ""
        if got.error is not None:
            e = got.error
            if label in ("kernel", "interpret") and base.error is None:
                if (
                    isinstance(e, ValueError)
                    and f"route '{label}'" in str(e)
                    and NAMED.match(str(e))
                ):
                    continue  # the documented refusal of the kernel settings
            if (
                base.error is not None
                and label
                and (type(e) is not type(base.error) or str(e) != str(base.error))
            ):
                found.append(
                    f"{where}raises {type(e).__name__} where xla raises "
                    f"{base.describe()}: {str(e)[:200]}"
                )
                continue
            if want is not None and want.error is None and not case.differs:
                found.append(f"{where}raises where JAX computes: {got.describe()}")
                continue
            why = _clear(e, case, jax_error)
            if why:
                found.append(where + why)
            continue
        if want is None:
            found.append(f"{where}returns {got.describe()} where a clear error is expected")
        elif want.error is not None:
            found.append(f"{where}returns {got.describe()} where JAX raises {want.describe()}")
        else:
            bound = case.bound(got.value) if case.bound is not None else None
            why = _same_value(got.value, want.value, bound)
            if why:
                found.append(where + why)
    return found


# --- the cases, per callable ------------------------------------------------------------

FRONT_ENDS: dict[str, Callable[..., Any]] = {
    "ragged_dot": emulate.ragged_dot,
    "ragged_dot_general": lambda a, b, g, *r, **kw: emulate.ragged_dot_general(
        a, b, g, BASIC, *r, **kw
    ),
    # the keyword arguments are static, as in a user's function
    "polyfill(lax.ragged_dot)": lambda a, b, g, target=None, **kw: emulate.polyfill(
        functools.partial(lax.ragged_dot, **kw), target=target
    )(a, b, g),
}


def _jax_ragged(a: Any, b: Any, g: Any, *rest: Any, **kw: Any) -> Any:
    return lax.ragged_dot(a, b, g, *rest, **kw)


def _ref_ragged(a: Any, b: Any, g: Any, pet: Any = None) -> np.ndarray:
    return reference.ragged_dot(np.asarray(a), np.asarray(b), np.asarray(g), pet)


def _codes(q: emulate.QArray) -> np.ndarray:
    """The QArray's codes, unpacked by numpy where packed (storage's rule: element 2j is
    the low nibble of byte j along the packed axis)."""
    c = q.codes
    if not isinstance(c, emulate.Packed):
        return np.asarray(c)
    data = np.moveaxis(np.asarray(c.data), c.axis, -1)
    nib = np.stack([data & 0xF, data >> 4], axis=-1).reshape(*data.shape[:-1], -1)
    nib = nib[..., : c.length]
    dt = getattr(ml_dtypes, c.format_name)
    return np.moveaxis(nib.astype(np.uint8).view(dt), -1, c.axis)


def _dequantized(q: emulate.QArray) -> np.ndarray:
    """float64 values of ``q`` by the oracle."""
    return reference.dequantize(
        _codes(q), np.asarray(q.scales).astype(np.float32), q.block_shape
    ).astype(np.float64)


def _qarray_oracle(x: Any, q: emulate.QArray, sizes: Any) -> tuple[Any, Any]:
    """float64 per-row products of ``x`` with its group's dequantized expert (the oracle),
    and the bound of mode "fast" (gamma_(K + S + 4), S the scale segments)."""
    xv = np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)
    w = _dequantized(q)
    m, k = xv.shape
    ends = np.minimum(np.cumsum(np.asarray(sizes)), m)
    gid = np.searchsorted(ends, np.arange(m), side="right")
    want = np.zeros((m, w.shape[2]))
    bnd = np.zeros((m, w.shape[2]))
    dn = (((1,), (0,)), ((), ()))
    for i in range(m):
        if gid[i] < w.shape[0]:
            with np.errstate(invalid="ignore", over="ignore"):
                want[i] = xv[i] @ w[gid[i]]
            bnd[i] = bounds.dot_general_bound(
                xv[i : i + 1], w[gid[i]], dn, extra_terms=k // 32 + 4
            )[0]
    return want, bnd


def _against_oracle(x: Any, q: emulate.QArray, sizes: Any) -> dict[str, Any]:
    """A case's ``want`` and ``bound`` for QArray experts: :func:`_qarray_oracle`'s."""
    oracle = functools.cache(lambda: _qarray_oracle(x, q, sizes))  # computed when judged
    return {"want": lambda: oracle()[0].astype(np.float32), "bound": lambda _: oracle()[1]}


def _with_nan(x: Any, nan_at: tuple[int, ...], inf_at: tuple[int, ...]) -> Any:
    """``x`` with a NaN and an Inf (in its own dtype)."""
    v = np.asarray(x).astype(np.float32)
    v[nan_at], v[inf_at] = np.nan, np.inf
    return v.astype(np.asarray(x).dtype)


def _with_nan_scales(q: emulate.QArray) -> emulate.QArray:
    """``q`` with a NaN and an Inf scale."""
    scales = np.asarray(q.scales).astype(np.float32)
    scales[0, 0, 0], scales[-1, -1, -1] = np.nan, np.inf
    return dataclasses.replace(q, scales=jnp.asarray(scales, q.scales.dtype))


def ragged_cases() -> Iterator[Case]:
    """Every front end of ``lax.ragged_dot`` on the same calls."""
    for fe_name, fe in FRONT_ENDS.items():
        for target in ("cpu", "tpu_v5e"):
            yield from _ragged_cases(fe_name, fe, target)


def _ragged_cases(fe_name: str, fe: Callable[..., Any], target: str) -> Iterator[Case]:
    polyfill = fe_name.startswith("polyfill")

    def case(name, args, kw=None, want="jax", **more):
        kw = dict(kw or {})
        if polyfill and want == "jax arrays":
            want = "jax"  # lax itself sees the arguments as given
        elif want == "jax arrays":
            args0 = args
            want = lambda: _jax_ragged(*args0[:2], jnp.asarray(args0[2]), **kw)  # noqa: E731
        run = lambda: fe(*args, target=target, **kw)  # noqa: E731
        if want == "jax":
            oracle = lambda: _jax_ragged(*args, **kw)  # noqa: E731
        elif want == "ref":
            oracle = lambda: _ref_ragged(*args, kw.get("preferred_element_type"))  # noqa: E731
        else:
            oracle = want
        return Case(fe_name, f"{target}: {name}", run, oracle, call=(args, kw, target), **more)

    x = halves(1, (8, 16), np.float32)
    w = halves(2, (3, 16, 4), np.float32)
    gs = np.array([3, 0, 4], np.int32)
    # dtypes, as JAX takes them
    for dt in (np.float32, BF16, np.float16, np.int8, np.int32):
        a, b = halves(1, (8, 16), dt), halves(2, (3, 16, 4), dt)
        yield case(f"{np.dtype(dt).name} x {np.dtype(dt).name}", (a, b, gs))
    yield case("bf16 x f32", (x.astype(BF16), w, gs))
    yield case(
        "int8 x int8 -> int32",
        (x.astype(np.int8), w.astype(np.int8), gs),
        {"preferred_element_type": jnp.int32},
    )
    yield case("f32 x f32 -> bf16", (x, w, gs), {"preferred_element_type": BF16})
    yield case("bool x bool", (x > 0, w > 0, gs))
    yield case("complex64 x complex64", (x.astype(np.complex64), w.astype(np.complex64), gs))
    # low-precision operands JAX's CPU cannot be compared with: the oracle's exact sums
    for fmt in ("float8_e4m3fn", "float8_e5m2", "int4", "float4_e2m1fn"):
        dt = np.dtype(getattr(ml_dtypes, fmt))
        a = (
            halves(1, (8, 16), dt)
            if "int" in fmt
            else (halves(1, (8, 16), np.float32) / 2).astype(dt)
        )
        b = (
            halves(2, (3, 16, 4), dt)
            if "int" in fmt
            else (halves(2, (3, 16, 4), np.float32) / 2).astype(dt)
        )
        pet = jnp.int32 if "int" in fmt else jnp.float32
        yield case(
            f"{fmt} x {fmt} -> {np.dtype(pet).name}",
            (a, b, gs),
            {"preferred_element_type": pet},
            want="ref",
            weight=True,
        )
    yield case(
        "bf16 x float8_e4m3fn",
        (x.astype(BF16), (w / 2).astype(E4), gs),
        want=lambda: _ref_ragged(x.astype(BF16), (w / 2).astype(E4), gs),
        weight=True,
    )
    # group sizes
    for label, sizes in (
        ("zero-size groups", np.array([0, 8, 0], np.int32)),
        ("all groups empty", np.array([0, 0, 0], np.int32)),
        ("sizes summing under m", np.array([1, 2, 1], np.int32)),
        ("sizes summing over m", np.array([5, 0, 9], np.int32)),
        ("uint8 sizes", np.array([3, 0, 4], np.uint8)),
        ("int16 sizes", np.array([3, 0, 4], np.int16)),
        ("list sizes", [3, 0, 4]),
        ("tuple sizes", (3, 0, 4)),
        ("jnp sizes", jnp.array([3, 0, 4])),
    ):
        yield case(label, (x, w, sizes), want="jax arrays")
    for label, sizes in (
        ("float sizes", np.array([1.5, 0, 4.5], np.float32)),
        ("bool sizes", np.array([True, False, True])),
        ("scalar sizes", np.int32(3)),
        ("sizes of rank 2", np.array([[3, 0, 4]], np.int32)),
        ("too few sizes", np.array([3, 4], np.int32)),
        ("too many sizes", np.array([3, 0, 4, 1], np.int32)),
        ("None sizes", None),
        ("str sizes", "3,0,4"),
        ("dict sizes", {"a": 1}),
    ):
        yield case(label, (x, w, sizes))
    yield case(
        "negative size",
        (x, w, np.array([-1, 5, 4], np.int32)),
        differs="negative sizes are refused (emulate.group_sizes)",
    )
    # shapes and ranks
    yield case("m = 0", (x[:0], w, np.array([0, 0, 0], np.int32)))
    yield case("k = 0", (x[:, :0], w[:, :0], gs))
    yield case("n = 0", (x, w[:, :, :0], gs))
    yield case("no groups", (x, w[:0], np.zeros((0,), np.int32)))
    yield case("lhs rank 1", (x[0], w, gs))
    yield case("lhs rank 3", (x[None], w, gs))
    yield case("rhs rank 2", (x, w[0], gs))
    yield case("rhs rank 4", (x, w[None], gs))
    yield case("k differs", (x, w[:, :8], gs))
    # None, lists, other objects
    yield case("lhs None", (None, w, gs))
    yield case("rhs None", (x, None, gs))
    yield case("lhs a list", (x.tolist(), w, gs))
    yield case("rhs a list", (x, w.tolist(), gs))
    yield case("lhs a str", ("x", w, gs))
    yield case("lhs a Python float", (1.5, w, gs))
    # NaN and Inf, in each operand
    xn, wn = x.copy(), w.copy()
    xn[1, 2], xn[5, 0], wn[2, 3, 1], wn[0, 0, 0] = np.nan, np.inf, -np.inf, np.nan
    yield case("NaN/Inf in lhs", (xn, w, gs))
    yield case("NaN/Inf in rhs", (x, wn, gs))
    yield case(
        "NaN/Inf in rhs of an empty group",
        (x, np.where(np.arange(3)[:, None, None] == 1, np.nan, w).astype(np.float32), gs),
    )
    # keyword arguments
    yield case("precision HIGHEST", (x, w, gs), {"precision": lax.Precision.HIGHEST})
    yield case("precision a pair", (x, w, gs), {"precision": (lax.Precision.HIGH, "highest")})
    yield case("precision a bad string", (x, w, gs), {"precision": "fastest"})
    yield case(
        "preferred_element_type int32 for floats", (x, w, gs), {"preferred_element_type": jnp.int32}
    )
    yield case(
        "preferred_element_type a bad name", (x, w, gs), {"preferred_element_type": "float7"}
    )
    yield case(
        "preferred_element_type float4_e2m1fn",
        (x, w, gs),
        {"preferred_element_type": ml_dtypes.float4_e2m1fn},
        want=lambda: _ref_ragged(x, w, gs, ml_dtypes.float4_e2m1fn),
    )
    yield case(
        "preferred_element_type float6_e2m3fn",
        (x, w, gs),
        {"preferred_element_type": "float6_e2m3fn"},
    )
    # lax.ragged_dot raises a TypeError for it (an unhashable parameter); the drop-ins
    # refuse it by name (NotImplementedError)
    yield case(
        "group_offset",
        (x, w, gs),
        {"group_offset": jnp.array([0])},
        want="jax" if polyfill else None,
        errors=(NotImplementedError,),
    )
    if polyfill:  # lax.ragged_dot takes no QArray
        return
    # QArray experts (the weight): the oracle within mode "fast"'s bound
    q = experts("int8")
    xq = halves(3, (8, 64), np.float32).astype(BF16)
    for label, qq, xx, sizes in (
        ("QArray int8 experts", q, xq, gs),
        ("QArray, zero-size groups", q, xq, np.array([0, 8, 0], np.int32)),
        ("QArray, sizes over m", q, xq, np.array([5, 0, 9], np.int32)),
        ("QArray MXFP4 experts", experts("MXFP4"), xq, gs),
        ("QArray, NaN/Inf scales", _with_nan_scales(q), xq, gs),
        ("QArray, NaN/Inf in lhs", q, _with_nan(xq, (0, 0), (4, 1)), gs),
    ):
        yield case(label, (xx, qq, sizes), weight=True, **_against_oracle(xx, qq, sizes))
    yield case("QArray, m = 0", (xq[:0], q, np.zeros(3, np.int32)), weight=True,
               **_against_oracle(xq[:0], q, np.zeros(3, np.int32)))  # fmt: skip
    yield case("QArray, all groups empty", (xq, q, np.zeros(3, np.int32)), weight=True,
               **_against_oracle(xq, q, np.zeros(3, np.int32)))  # fmt: skip
    yield case("QArray, list sizes", (xq, q, [3, 0, 4]), weight=True, **_against_oracle(xq, q, gs))
    yield case("QArray, float sizes", (xq, q, np.array([3.0, 0, 4])), want=None, weight=True)
    yield case("QArray, k differs", (xq[:, :32], q, gs), want=None, weight=True)
    yield case("QArray, 2-D experts", (xq, q[0], gs), want=None, weight=True)
    yield case("QArray experts, lhs None", (None, q, gs), want=None, weight=True)


def transform_cases() -> Iterator[Case]:
    """jit, vmap and grad of each front end against JAX's (plain operands: bits) and
    against the front end's own eager calls (QArray experts)."""
    x = halves(1, (8, 16), np.float32)
    w = halves(2, (3, 16, 4), np.float32)
    gs = jnp.array([3, 0, 4], jnp.int32)
    xs = np.stack([x, -x, 2 * x])
    q = experts("int8")
    xq = halves(3, (8, 64), np.float32).astype(BF16)
    xqs = jnp.stack([xq, -xq])
    for fe_name, fe in FRONT_ENDS.items():
        for target in ("cpu", "tpu_v5e", "tpu_v2"):
            f = lambda a, b, g, t=target, fe=fe: fe(a, b, g, target=t)  # noqa: E731

            def c(name, run, want, fe_name=fe_name, target=target, **kw):
                return Case(fe_name, f"{target}: {name}", run, want, **kw)

            yield c(
                "jit", lambda f=f: jax.jit(f)(x, w, gs), lambda: jax.jit(lax.ragged_dot)(x, w, gs)
            )
            yield c(
                "jit, bf16",
                lambda f=f: jax.jit(f)(x.astype(BF16), w.astype(BF16), gs),
                lambda: jax.jit(lax.ragged_dot)(x.astype(BF16), w.astype(BF16), gs),
            )
            yield c(
                "vmap over lhs",
                lambda f=f: jax.vmap(f, (0, None, None))(xs, w, gs),
                lambda: jax.vmap(lax.ragged_dot, (0, None, None))(xs, w, gs),
            )
            yield c(
                "vmap over group_sizes",
                lambda f=f: jax.vmap(f, (None, None, 0))(x, w, jnp.stack([gs, gs[::-1]])),
                lambda: jax.vmap(lax.ragged_dot, (None, None, 0))(x, w, jnp.stack([gs, gs[::-1]])),
            )
            for argnum in (0, 1):
                yield c(
                    f"grad wrt argument {argnum}",
                    lambda f=f, i=argnum: jax.grad(lambda a, b: jnp.sum(f(a, b, gs) ** 2), i)(x, w),
                    lambda i=argnum: jax.grad(
                        lambda a, b: jnp.sum(lax.ragged_dot(a, b, gs) ** 2), i
                    )(x, w),
                )
            yield c(
                "grad wrt argument 0, bf16",
                lambda f=f: jax.grad(lambda a: jnp.sum(f(a, w.astype(BF16), gs)))(x.astype(BF16)),
                lambda: jax.grad(lambda a: jnp.sum(lax.ragged_dot(a, w.astype(BF16), gs)))(
                    x.astype(BF16)
                ),
            )
            if fe_name.startswith("polyfill"):  # lax.ragged_dot takes no QArray
                continue
            yield c(
                "QArray experts, jit",
                lambda f=f: jax.jit(f)(xq, q, gs),
                lambda f=f: f(xq, q, gs),
                weight=True,
            )
            once = jax.jit(f)  # one jitted function, called under every route setting
            yield Case(
                fe_name,
                f"{target}: QArray experts, one jit under every setting",
                lambda once=once: once(xq, q, gs),
                weight=True,
                **_against_oracle(xq, q, gs),
            )
            yield c(
                "QArray experts, vmap over lhs",
                lambda f=f: jax.vmap(f, (0, None, None))(xqs, q, gs),
                lambda f=f: jnp.stack([f(xqs[0], q, gs), f(xqs[1], q, gs)]),
                weight=True,
            )
            yield c(
                "QArray experts, grad wrt lhs",
                lambda f=f: jax.grad(lambda a: jnp.sum(f(a, q, gs)))(xq),
                lambda: _qarray_row_sums(xq, q, gs),
                bound=lambda g: _bf16_bound(g),
                weight=True,
            )


def _qarray_row_sums(x: Any, q: emulate.QArray, sizes: Any) -> np.ndarray:
    """d/dx of the sum of ``ragged_dot(x, q, sizes)``: each row its expert's row sums."""
    w = _dequantized(q)
    m = x.shape[0]
    ends = np.minimum(np.cumsum(np.asarray(sizes)), m)
    gid = np.searchsorted(ends, np.arange(m), side="right")
    out = np.zeros(x.shape)
    for i in range(m):
        if gid[i] < w.shape[0]:
            out[i] = w[gid[i]].sum(axis=1)
    return out.astype(BF16)


def _bf16_bound(g: Any) -> np.ndarray:
    """One bf16 rounding of the exact f32 sums (2**-8 relative) and the f32 sums' bound."""
    return np.abs(np.asarray(g, np.float64)) * 2.0**-7 + 1e-6


def general_cases() -> Iterator[Case]:
    """``ragged_dot_general``'s layouts and modes against JAX's."""
    rng_x = halves(4, (16, 8), np.float32)  # (K, M)
    w = halves(5, (2, 16, 4), np.float32)
    gs = jnp.array([3, 5], jnp.int32)
    for target in ("cpu", "tpu_v5e", "tpu_v2"):
        for dt in (np.float32, BF16, np.int8):
            a, b = rng_x.astype(dt), w.astype(dt)
            kw = {"preferred_element_type": jnp.int32} if dt == np.int8 else {}
            yield Case(
                "ragged_dot_general",
                f"{target}: rows stored (K, M), {np.dtype(dt).name}",
                lambda a=a, b=b, t=target, kw=kw: emulate.ragged_dot_general(
                    a, b, gs, KM, target=t, **kw
                ),
                lambda a=a, b=b, kw=kw: lax.ragged_dot_general(a, b, gs, KM, **kw),
            )
            a2, b2 = halves(6, (8, 16), dt), halves(7, (16, 4), dt)
            yield Case(
                "ragged_dot_general",
                f"{target}: ragged contracting, {np.dtype(dt).name}",
                lambda a=a2, b=b2, t=target, kw=kw: emulate.ragged_dot_general(
                    a, b, jnp.array([6, 10], jnp.int32), CONTRACTING, target=t, **kw
                ),
                lambda a=a2, b=b2, kw=kw: lax.ragged_dot_general(
                    a, b, jnp.array([6, 10], jnp.int32), CONTRACTING, **kw
                ),
            )
        x, ww = halves(8, (8, 16), np.float32), halves(9, (3, 16, 4), np.float32)
        for label, rdn in (
            ("dimension numbers a tuple", ((((1,), (1,)), ((), ())), (0,), (0,))),
            ("dimension numbers None", None),
            (
                "rhs group dimension out of range",
                lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (0,), (5,)),
            ),
            (
                "lhs ragged dimension out of range",
                lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), (4,), (0,)),
            ),
            (
                "contracting the group dimension",
                lax.RaggedDotDimensionNumbers((((1,), (0,)), ((), ())), (0,), (0,)),
            ),
        ):
            yield Case(
                "ragged_dot_general",
                f"{target}: {label}",
                lambda r=rdn, t=target, x=x, ww=ww: emulate.ragged_dot_general(
                    x, ww, jnp.array([3, 0, 4]), r, target=t
                ),
                lambda r=rdn, x=x, ww=ww: lax.ragged_dot_general(x, ww, jnp.array([3, 0, 4]), r),
            )


def pallas_cases() -> Iterator[Case]:
    """``emulate.pallas.ragged_dot`` called directly (interpret mode on this host)."""
    x = halves(1, (16, 128), np.float32).astype(BF16)
    w8 = halves(2, (3, 128, 128), np.int8)
    x8 = halves(3, (16, 128), np.int8)
    gs = np.array([5, 0, 9], np.int32)
    q = experts("int8", k=128, n=128)

    def c(name, args, want=None, bound=None, target="tpu_v5e", **kw):
        def run():
            return emulate.pallas.ragged_dot(*args, target=target, interpret=True, **kw)

        return Case("pallas.ragged_dot", name, run, want, bound)

    yield c(
        "int8 x int8",
        (x8, w8, gs),
        lambda: (
            _ref_ragged(x8, w8, gs, jnp.int32).astype(np.int32)
            if False
            else lax.ragged_dot(x8, w8, jnp.asarray(gs), preferred_element_type=jnp.int32)
        ),
        out_dtype=jnp.int32,
    )
    want, bnd = _qarray_oracle(x, q, gs)
    yield c("bf16 x QArray", (x, q, gs), **_against_oracle(x, q, gs))
    for label, sizes in (
        ("zero-size groups", np.array([0, 16, 0], np.int32)),
        ("sizes over m", np.array([9, 0, 12], np.int32)),
        ("list sizes", [5, 0, 9]),
    ):
        yield c(f"bf16 x QArray, {label}", (x, q, sizes), **_against_oracle(x, q, sizes))
    for label, sizes in (
        ("float sizes", [1.5, 0, 4.5]),
        ("bool sizes", [True, False, True]),
        ("negative size", [-1, 8, 9]),
        ("too few sizes", [5, 9]),
        ("None sizes", None),
        ("scalar sizes", 5),
    ):
        yield c(label, (x, q, sizes))
    yield c("x None", (None, q, gs))
    yield c("w None", (x, None, gs))
    yield c("x rank 1", (x[0], q, gs))
    yield c("w 2-D", (x, q[0], gs))
    yield c("k differs", (x[:, :64], q, gs))
    yield c("the CPU target", (x, q, gs), target="cpu")
    for bs in ((8,), (0, 128, 128), "a", (7, 128, 128), (16, 128, 100), (16.0, 128, 128)):
        yield c(f"block_shape={bs!r}", (x, q, gs), block_shape=bs)
    yield c("x_format a bad name", (x8.view(np.uint8), w8, gs), x_format="int9")
    yield c("w_format disagreeing with a QArray", (x, q, gs), w_format="float8_e4m3fn")
    yield c("out_dtype a bad name", (x, q, gs), out_dtype="float7")
    yield c("out_dtype float4_e2m1fn", (x, q, gs), out_dtype="float4_e2m1fn")
    xn = _with_nan(x, (0, 0), (6, 3))
    yield c("NaN/Inf in x", (xn, q, gs), **_against_oracle(xn, q, gs))
    qn = _with_nan_scales(q)
    yield c("NaN/Inf scales", (x, qn, gs), **_against_oracle(x, qn, gs))
    yield c(
        "m = 0",
        (x[:0], q, np.zeros(3, np.int32)),
        **_against_oracle(x[:0], q, np.zeros(3, np.int32)),
    )
    yield c(
        "all groups empty",
        (x, q, np.zeros(3, np.int32)),
        **_against_oracle(x, q, np.zeros(3, np.int32)),
    )


def _route_or_none(r: Any) -> str:
    if r is None or isinstance(r, emulate.WeightRoute):
        return "a route or None"
    return f"a {type(r).__name__}"


def query_cases() -> Iterator[Case]:
    """``ragged_dot_route`` and ``weight_route`` answer (a route or None) for what their
    front end takes and raise what it raises (its exception type)."""
    for case in ragged_cases():
        if case.callable != "ragged_dot" or not case.call:
            continue
        args, kw, target = case.call
        if set(kw) - {"preferred_element_type"}:
            continue
        yield Case(
            "ragged_dot_route",
            case.name.split(": ", 1)[1] + f" ({target})",
            lambda a=args, k=kw, t=target: _route_or_none(
                emulate.ragged_dot_route(*a, target=t, **k)
            ),
            lambda a=args, k=kw, t=target: _front("ragged_dot", a, k, t),
        )
    q = emulate.quantize(
        np.random.default_rng(4).standard_normal((64, 32)).astype(np.float32),
        "int8",
        block_shape=32,
        axis=0,
    )
    x = halves(1, (2, 64), np.float32)
    dn = (((1,), (0,)), ((), ()))
    for label, args, kw in (
        ("f32 x QArray", (x, q, dn), {}),
        ("bf16 x QArray", (x.astype(BF16), q, dn), {}),
        ("f32 x f32", (x, np.ones((64, 4), np.float32), dn), {}),
        ("bf16 x float8", (x.astype(BF16), np.ones((64, 4), E4), dn), {}),
        ("lhs None", (None, q, dn), {}),
        ("rhs None", (x, None, dn), {}),
        ("lhs a list", (x.tolist(), q, dn), {}),
        ("k differs", (x[:, :32], q, dn), {}),
        ("dimension numbers None", (x, q, None), {}),
        ("dimension numbers bad", (x, q, (((2,), (0,)), ((), ()))), {}),
        ("preferred_element_type float4", (x, q, dn), {"preferred_element_type": "float4_e2m1fn"}),
        ("preferred_element_type a bad name", (x, q, dn), {"preferred_element_type": "float7"}),
        ("lhs int8, rhs QArray", (x.astype(np.int8), q, dn), {}),
    ):
        for target in ("cpu", "tpu_v5e"):
            yield Case(
                "weight_route",
                f"{label} ({target})",
                lambda a=args, k=kw, t=target: _route_or_none(
                    emulate.weight_route(*a, target=t, **k)
                ),
                lambda a=args, k=kw, t=target: _front("dot_general", a, k, t),
            )


def _front(name: str, args: Any, kw: Any, target: str) -> str:
    """What a route query must say where the front end runs: "a route or None"; where it
    raises, the front end's exception (the query must raise its type)."""
    with emulate.use_route("xla"):
        getattr(emulate, name)(*args, target=target, **kw)
    return "a route or None"


def setting_cases() -> Iterator[Case]:
    """``use_route``, ``use_cpu_kernel`` and ``prepare_weights``' arguments."""

    def enter(cm: Any) -> str:
        with cm:
            return "entered"

    for value in emulate.routing.ROUTES:
        yield Case(
            "use_route", repr(value), lambda v=value: enter(emulate.use_route(v)), lambda: "entered"
        )
    for value in ("XLA", "", "pallas", None, 1, ["xla"]):
        yield Case("use_route", repr(value), lambda v=value: enter(emulate.use_route(v)))
    for value in (True, False):
        yield Case(
            "use_cpu_kernel",
            repr(value),
            lambda v=value: enter(emulate.use_cpu_kernel(v)),
            lambda: "entered",
        )
    for value in (1, 0, "0", None, np.bool_(True)):
        yield Case("use_cpu_kernel", repr(value), lambda v=value: enter(emulate.use_cpu_kernel(v)))
    q = experts("int8")
    tpu = "tpu_v5e"
    for value in ("no", None, 1, 0):
        yield Case(
            "prepare_weights",
            f"experts={value!r}",
            lambda v=value: emulate.prepare_weights(q, target=tpu, experts=v),
        )
    for label, tree in (
        ("None", None),
        ("an empty dict", {}),
        ("a list", [1.0, "s"]),
        ("plain arrays", {"w": np.ones((3, 4, 4), np.float32)}),
    ):
        yield Case(
            "prepare_weights",
            f"a tree of {label}",
            lambda t=tree: _same_tree(emulate.prepare_weights(t, target=tpu), t),
            lambda: "unchanged",
        )
    yield Case(
        "prepare_weights", "target a bad name", lambda: emulate.prepare_weights(q, target="tpu_v99")
    )
    yield Case("prepare_weights", "target a number", lambda: emulate.prepare_weights(q, target=5))
    xq = halves(3, (8, 64), np.float32).astype(BF16)
    gs = jnp.array([3, 0, 4], jnp.int32)
    for label, w in (
        ("int8 experts", q),
        ("MXFP4 experts", experts("MXFP4")),
        ("per-channel experts", experts("int8", block_shape=None)),
    ):
        prepared = functools.cache(lambda w=w: emulate.prepare_weights({"e": w}, target=tpu)["e"])
        yield Case(
            "prepare_weights",
            f"{label}: ragged_dot on the prepared form",
            lambda p=prepared: emulate.ragged_dot(xq, p(), gs, target=tpu),
            lambda w=w: _xla(lambda: emulate.ragged_dot(xq, w, gs, target=tpu)),
            bound=lambda g: np.abs(np.asarray(g, np.float64)) * 2.0**-20 + 1e-6,
            weight=True,
        )
        yield Case(
            "prepare_weights",
            f"{label}: experts=False leaves it",
            lambda w=w: emulate.prepare_weights(w, target=tpu, experts=False) is w,
            lambda: True,
        )


def _xla(thunk: Callable[[], Any]) -> Any:
    with emulate.use_route("xla"):
        return thunk()


def _same_tree(got: Any, tree: Any) -> str:
    same = jax.tree.structure(got) == jax.tree.structure(tree) and all(
        a is b for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(tree))
    )
    return "unchanged" if same else "changed"


def compiler_cases() -> Iterator[Case]:
    """``emulate.compiler.compile``'s ``donate_argnums`` against ``jax.jit``'s."""
    specs = (
        jax.ShapeDtypeStruct((8, 128), jnp.float32),
        jax.ShapeDtypeStruct((8, 128), jnp.float32),
    )

    def fn(a, b):
        return a + 1, b * 2

    def ours(d):
        text = emulate.compiler.compile(fn, *specs, target="tpu_v5e", donate_argnums=d).as_text()
        return "aliased" if "input_output_alias" in text else "not aliased"

    def theirs(d):
        text = jax.jit(fn, donate_argnums=d).lower(*specs).as_text()
        return "aliased" if "tf.aliasing_output" in text else "not aliased"

    for d in ("0", 1.5, 5, (None,), [0, 7]):  # refused before the dumping process starts
        yield Case(
            "compiler.estimate",
            f"donate_argnums={d!r}",
            lambda d=d: emulate.compiler.estimate(fn, *specs, target="tpu_v5e", donate_argnums=d),
            lambda d=d: theirs(d),
        )
    for d in (None, 0, 1, (0, 1), [0], (), -1, 5, "0", 1.5, (0, 0), (None,)):
        yield Case(
            "compiler.compile", f"donate_argnums={d!r}", lambda d=d: ours(d), lambda d=d: theirs(d)
        )


def cpu_kernel_cases() -> Iterator[Case]:
    """The CPU kernel on and off (every route setting) on ``dot_general`` / ``matmul``
    with a QArray weight, few rows; and its environment switch."""
    for fmt in ("int8", "MXFP4"):
        w = np.random.default_rng(4).standard_normal((64, 32)).astype(np.float32)
        if fmt == "MXFP4":
            q = emulate.quantize(w, emulate.mx.MXFP4, axis=0)
        else:
            q = emulate.quantize(w, fmt, block_shape=32, axis=0)
        wv = _dequantized(q)
        for rows in (1, 3):
            x = halves(rows, (rows, 64), np.float32)
            xn = x.copy()
            xn[0, 0] = np.nan
            for label, xx in (("", x), (", NaN in x", xn)):
                want = np.asarray(xx, np.float64) @ wv
                bnd = bounds.dot_general_bound(
                    np.asarray(xx, np.float64), wv, (((1,), (0,)), ((), ())), extra_terms=6
                )
                for name, f in (
                    (
                        "dot_general",
                        lambda a, b: emulate.dot_general(
                            a, b, (((1,), (0,)), ((), ())), target="cpu"
                        ),
                    ),
                    ("matmul", lambda a, b: emulate.matmul(a, b, target="cpu")),
                ):
                    yield Case(
                        f"use_cpu_kernel: {name}",
                        f"{fmt}, {rows} row(s){label}",
                        lambda f=f, xx=xx, q=q: f(xx, q),
                        lambda w=want: w.astype(np.float32),
                        bound=lambda _, b=bnd: b,
                        weight=True,
                    )
    yield Case(
        "EMULATE_CPU_KERNEL", "'yes'", lambda: _env_run("import emulate", EMULATE_CPU_KERNEL="yes")
    )


def _env_run(script: str, **env: str) -> None:
    """Run ``script`` in a fresh process with ``env`` set; raise its last exception line's
    type (ValueError / TypeError; RuntimeError for any other) with its message."""
    full = dict(os.environ, **env)
    p = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True)
    if p.returncode == 0:
        return
    lines = [ln for ln in p.stderr.strip().splitlines() if re.match(r"^\w+(\.\w+)*: ", ln)]
    kind, _, msg = (lines[-1] if lines else p.stderr.strip()[-300:]).partition(": ")
    raise {"ValueError": ValueError, "TypeError": TypeError}.get(kind, RuntimeError)(msg)


#: every family of cases, by name
FAMILIES: dict[str, Callable[[], Iterator[Case]]] = {
    "ragged": ragged_cases,
    "transforms": transform_cases,
    "general": general_cases,
    "pallas": pallas_cases,
    "queries": query_cases,
    "settings": setting_cases,
    "compiler": compiler_cases,
    "cpu_kernel": cpu_kernel_cases,
}


def all_cases() -> list[Case]:
    return [c for family in FAMILIES.values() for c in family()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests._surface_sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("-k", default="", help="only callables whose name contains this")
    parser.add_argument(
        "--family", action="append", choices=sorted(FAMILIES), help="only these case families"
    )
    parser.add_argument("--list", action="store_true", help="print each finding")
    args = parser.parse_args(argv)
    counts: dict[str, list[int]] = {}
    findings: list[tuple[Case, list[str]]] = []
    for fam in args.family or FAMILIES:
        for case in FAMILIES[fam]():
            if args.k not in case.callable:
                continue
            found = judge(case)
            n = counts.setdefault(case.callable, [0, 0])
            n[0] += 1
            n[1] += bool(found)
            if found:
                findings.append((case, found))
                if args.list:
                    print(f"FINDING {case.callable}: {case.name}", flush=True)
                    for f in found:
                        print(f"    {f}", flush=True)
    width = max((len(k) for k in counts), default=8)
    print(f"{'callable':<{width}}  cases  findings")
    for name, (n, f) in counts.items():
        print(f"{name:<{width}}  {n:5d}  {f:8d}")
    total = [sum(v[i] for v in counts.values()) for i in (0, 1)]
    print(f"{'total':<{width}}  {total[0]:5d}  {total[1]:8d}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
