"""A differential harness for your own kernel: :func:`check_function`.

It draws problems (operands of the formats you name, plain, packed or quantized, at your
shapes or layouts, plus K at the pair's exactness thresholds), calls your function,
checks each result against :mod:`emulate.reference` under the contract you name, and on
a failure raises an AssertionError whose message ends with a script that calls your
function on the shrunk operands, written as literal values (:func:`function_reproducer`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as _seed
from hypothesis import strategies as st

from emulate import formats as _formats
from emulate import targets as _targets
from emulate.testing import tpu_rounding
from emulate.testing.comparison import BoundLike, Comparison, compare
from emulate.testing.hazards import threshold_layouts
from emulate.testing.operands import OperandSpec, as_spec
from emulate.testing.reproducers import function_reproducer
from emulate.testing.strategies import Layout

__all__ = [
    "CONTRACTS",
    "DEFAULT_SHAPES",
    "CheckResult",
    "check_function",
    "collect_results",
    "default_seed",
    "use_default_seed",
]

#: The named contracts of :func:`check_function` (a number or a function is a bound).
CONTRACTS = ("exact", "fast")

#: ``(M, K, N)`` of the matmuls :func:`check_function` draws by default: K = 1, odd sizes,
#: K = 33 (a ragged block of 32) and K = 160 (a full and a ragged group of 128).
DEFAULT_SHAPES: tuple[tuple[int, int, int], ...] = ((3, 1, 2), (2, 5, 3), (2, 33, 2), (1, 160, 3))

_MATMUL = (((1,), (0,)), ((), ()))
_HAZARD_MAX_K = 4200


@dataclasses.dataclass
class CheckResult:
    """What :func:`check_function` saw.

    Attributes:
      name: the function's ``module:qualname``.
      lhs, rhs: the operand descriptions.
      contract: "exact", "fast" or "bound".
      target: the target the function ran under.
      examples: problems run up to and including the first failure (hypothesis' shrinking
        replays are not counted).
      max_ulps: the largest error in ulps of the result type, over those examples.
      ratios: per example, the largest err/bound (bounded contracts; empty otherwise).
      failure: the failure's report (None when all passed).
      reproducer: the script that reproduces the failure (None when all passed).
      seed: the hypothesis seed the problems were drawn with.
    """

    name: str
    lhs: str
    rhs: str
    contract: str
    target: str
    examples: int = 0
    max_ulps: float = 0.0
    ratios: list[float] = dataclasses.field(default_factory=list)
    failure: str | None = None
    reproducer: str | None = None
    seed: int = 0

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["max_ulps"] = None if math.isinf(self.max_ulps) else self.max_ulps
        d["ratios"] = [None if math.isinf(r) else r for r in self.ratios]
        return d


_COLLECTORS: list[list[CheckResult]] = []

_DEFAULT_SEED: contextvars.ContextVar[int] = contextvars.ContextVar("emulate_seed", default=0)


def default_seed() -> int:
    """The seed :func:`check_function` draws with when given none: 0, or the one set by
    :func:`use_default_seed` (the pytest plugin sets pytest's ``--hypothesis-seed`` there
    for each test, so that ``pytest --hypothesis-seed=7`` draws other problems)."""
    return _DEFAULT_SEED.get()


@contextlib.contextmanager
def use_default_seed(seed: int) -> Iterator[int]:
    """Within this block :func:`check_function` calls without ``seed=`` use ``seed``.

    Raises:
      TypeError: ``seed`` is not an int.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__} {seed!r}")
    token = _DEFAULT_SEED.set(seed)
    try:
        yield seed
    finally:
        _DEFAULT_SEED.reset(token)


@contextlib.contextmanager
def collect_results() -> Iterator[list[CheckResult]]:
    """Within this block every :func:`check_function` call appends its
    :class:`CheckResult` to the yielded list (the pytest plugin's report reads it)."""
    results: list[CheckResult] = []
    _COLLECTORS.append(results)
    try:
        yield results
    finally:
        # By identity: two empty lists are equal, and list.remove compares with ==.
        del _COLLECTORS[next(i for i, c in enumerate(_COLLECTORS) if c is results)]


def _fn_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _layouts(
    shapes: Sequence[tuple[int, int, int]] | None,
    layouts: Sequence[Layout] | st.SearchStrategy[Layout] | None,
) -> st.SearchStrategy[Layout]:
    if layouts is not None and shapes is not None:
        raise ValueError("shapes, layouts: give one of them, not both")
    if layouts is not None:
        return layouts if isinstance(layouts, st.SearchStrategy) else st.sampled_from(layouts)
    pool = []
    for s in shapes if shapes is not None else DEFAULT_SHAPES:
        if len(s) != 3 or not all(isinstance(v, int) and v >= 1 for v in s):
            raise ValueError(f"shapes: expected (M, K, N) triples of positive ints, got {s!r}")
        m, k, n = s
        pool.append(((m, k), (k, n), _MATMUL))
    return st.sampled_from(pool)


def check_function(
    fn: Callable[[Any, Any], Any],
    lhs: Any,
    rhs: Any,
    *,
    contract: str | BoundLike = "exact",
    shapes: Sequence[tuple[int, int, int]] | None = None,
    layouts: Sequence[Layout] | st.SearchStrategy[Layout] | None = None,
    hazards: bool = True,
    out: Any = None,
    extra_roundings: int = 0,
    target: str | None = None,
    examples: int = 20,
    seed: int | None = None,
    elements: str = "all",
    fill: Any = None,
    tpu_numerics: bool = False,
) -> CheckResult:
    """Check ``fn(lhs, rhs)`` against :mod:`emulate.reference` on drawn problems.

    Args:
      fn: your kernel, called as ``fn(lhs, rhs)``. It must compute the ``dot_general`` of
        the layout (by default a matmul ``(M, K) @ (K, N)``).
      lhs, rhs: what each operand is: a format (``"int8"``, ``"bfloat16"``: an array of
        that dtype), an :mod:`emulate.mx` scheme or :class:`QuantSpec` (an
        :class:`emulate.QArray`), or :func:`plain` / :func:`packed` / :func:`quantized`.
      contract: "exact" (bit for bit with the reference: the exact sum rounded once into
        the result type), "fast" (emulate's mode "fast": bit for bit for exact-class
        pairs, within ``gamma_K`` (QArray: ``gamma_(K+S+4)``) otherwise), or a bound:
        a number (largest ``|r - exact|``) or ``bound(lhs_values, rhs_values, dn)``.
      shapes: ``(M, K, N)`` matmul shapes; default :data:`emulate.testing.DEFAULT_SHAPES`.
      layouts: instead of ``shapes``, ``(lhs_shape, rhs_shape, dimension_numbers)`` triples
        or a strategy of them (``fn`` must then contract as they say).
      hazards: also draw K at the pair's exactness thresholds up to 4200
        (:func:`threshold_layouts`, int8: 1024 to 2083) with ``fill="odd_extreme"``
        operands, for plain and packed exact-class pairs.
      out: the result format the reference rounds into; default the dtype ``fn`` returns.
      extra_roundings: as for :func:`compare` (contract "fast").
      target: run ``fn`` inside ``emulate.use_target(target)``; default the current target
        (which the reproducer names).
      examples: problems to draw (hypothesis ``max_examples``).
      seed: their hypothesis seed; default :func:`default_seed` (0, or pytest's
        ``--hypothesis-seed`` under emulate's pytest plugin). A seed draws the same
        problems on every run.
      elements, fill: the operands' values, as for :func:`arrays`.
      tpu_numerics: run ``fn`` as :func:`emulate.testing.tpu_numerics` rewrites it for
        ``target`` (which must then be a TPU target): every matmul rounds as the TPU's
        does (accumulator types, Mosaic's rules in Pallas kernels, the passes at each
        ``precision``), so that accumulator bugs a CPU run hides fail here.

    Returns:
      A :class:`CheckResult` (also appended to any :func:`collect_results` list).

    Raises:
      AssertionError: a result broke the contract, or ``fn`` raised: the shrunk example's
        report and a script that calls ``fn`` on it (:func:`function_reproducer`).
      ValueError, TypeError: a bad argument, before anything runs.
    """
    spec = _resolve(
        fn,
        lhs,
        rhs,
        contract=contract,
        shapes=shapes,
        layouts=layouts,
        hazards=hazards,
        out=out,
        extra_roundings=extra_roundings,
        target=target,
        examples=examples,
        seed=seed,
        elements=elements,
        fill=fill,
        tpu_numerics=tpu_numerics,
    )
    result = CheckResult(
        _fn_name(fn), spec.lhs.describe(), spec.rhs.describe(), spec.label, spec.target,
        seed=spec.seed,
    )  # fmt: skip
    try:
        _drive(spec, result)
    finally:
        for c in _COLLECTORS:
            c.append(result)
    if result.failure is not None:
        raise AssertionError(
            f"{result.name} broke the contract on {result.lhs} x {result.rhs} under "
            f"{spec.target} (seed {spec.seed}, hypothesis-shrunk example):\n{result.failure}\n\n"
            f"# --- reproducer: save as repro.py and run python repro.py ---\n"
            f"{result.reproducer}"
        )
    return result


@dataclasses.dataclass(frozen=True)
class _CheckSpec:
    """:func:`check_function`'s arguments, checked and resolved once: what a run needs.

    Attributes:
      fn: the user's function; ``call`` is what runs: ``fn``, or ``fn`` as
        :func:`emulate.testing.tpu_numerics` rewrites it for ``target``.
      lhs, rhs: the operands' :class:`OperandSpec`.
      contract: "exact", "fast" or a bound; ``label`` names it ("bound" for a bound).
      out: the result format's name, or None (the dtype ``fn`` returns).
      extra_roundings: as for :func:`compare`.
      target: the target's name.
      examples, seed: hypothesis' ``max_examples`` and seed.
      problem: the strategy of ``(lhs, rhs, dimension_numbers)`` problems.
      tpu_numerics: whether ``call`` is the TPU-numerics rewrite (for the reproducer).
    """

    fn: Callable[[Any, Any], Any]
    call: Callable[[Any, Any], Any]
    lhs: OperandSpec
    rhs: OperandSpec
    contract: str | BoundLike
    label: str
    out: str | None
    extra_roundings: int
    target: str
    examples: int
    seed: int
    problem: st.SearchStrategy[tuple[Any, Any, Any]]
    tpu_numerics: bool


def _resolve(fn: Callable[[Any, Any], Any], lhs: Any, rhs: Any, **kw: Any) -> _CheckSpec:
    """The :class:`_CheckSpec` of a :func:`check_function` call (``kw``: its keyword
    arguments, all of them), checking each argument in the order the docstring lists
    them. Raises TypeError / ValueError naming a bad one."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    ls, rs = as_spec(lhs, "lhs"), as_spec(rhs, "rhs")
    contract, examples, seed = kw["contract"], kw["examples"], kw["seed"]
    if isinstance(contract, str) and contract not in CONTRACTS:
        raise ValueError(
            f"contract: expected 'exact', 'fast', a number or a bound function, got {contract!r}"
        )
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples: expected a positive int, got {examples!r}")
    if seed is None:
        seed = default_seed()
    elif not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an int or None, got {type(seed).__name__} {seed!r}")
    out = None if kw["out"] is None else _formats.get(kw["out"]).name
    target = kw["target"]
    target_name = (_targets.current_target() if target is None else _targets.get(target)).name
    tpu = kw["tpu_numerics"]
    call = tpu_rounding.tpu_numerics(fn, target=target_name) if tpu else fn
    layouts = kw["layouts"]
    pool = _layouts(kw["shapes"], layouts)
    hazards = kw["hazards"] and layouts is None
    return _CheckSpec(
        fn=fn,
        call=call,
        lhs=ls,
        rhs=rs,
        contract=contract,
        label="bound" if not isinstance(contract, str) else contract,
        out=out,
        extra_roundings=kw["extra_roundings"],
        target=target_name,
        examples=examples,
        seed=seed,
        problem=_problems(ls, rs, pool, hazards, kw["elements"], kw["fill"]),
        tpu_numerics=tpu,
    )


#: hypothesis's phases without "explain": after a failure, explain traces every Python
#: line of each shrinking run (sys.settrace before Python 3.12, through JAX's tracing of
#: the function) to print lines the report does not use: the reproducer is the report.
_PHASES = tuple(p for p in Phase if p is not Phase.explain)


def _drive(spec: _CheckSpec, result: CheckResult) -> None:
    """Run ``spec``'s problems through hypothesis, counting into ``result``; on a failure
    set ``result.failure`` and ``result.reproducer`` (of the shrunk example). An error
    hypothesis raises before any example failed propagates."""
    failing: list[tuple[Any, Any, Any, str]] = []

    def run_one(a: Any, b: Any, dn: Any) -> None:
        # After the first failure hypothesis replays and shrinks it: those calls are not
        # new examples, and their errors are not counted.
        shrinking = bool(failing)
        try:
            with _targets.use_target(spec.target):
                got = np.asarray(spec.call(a, b))
            c = _compare(got, a, b, dn, spec.contract, spec.out, spec.extra_roundings)
        except Exception as e:
            if not shrinking:
                result.examples += 1  # an example that raised counts as run
            failing.append((a, b, dn, f"{type(e).__name__}: {e}"))
            raise
        if not shrinking:
            result.examples += 1
            result.max_ulps = max(result.max_ulps, c.max_ulps)
            if c.worst_ratio is not None:
                result.ratios.append(c.worst_ratio)
        if not c.ok:
            failing.append((a, b, dn, c.report()))
            raise AssertionError(c.report())

    @settings(
        max_examples=spec.examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=_PHASES,
    )
    @_seed(spec.seed)
    @given(p=spec.problem)
    def drive(p: tuple[Any, Any, Any]) -> None:
        run_one(*p)

    try:
        drive()
    except Exception:
        if not failing:
            raise
        a, b, dn, report = failing[-1]
        result.failure = report
        result.reproducer = function_reproducer(
            spec.fn,
            a,
            b,
            dn,
            contract=spec.label,
            out=spec.out,
            target=spec.target,
            extra_roundings=spec.extra_roundings,
            tpu_numerics=spec.tpu_numerics,
        )


def _compare(
    got: np.ndarray, a: Any, b: Any, dn: Any, contract: Any, out: str | None, extra: int
) -> Comparison:
    pet = out if out is not None else _formats.get(got.dtype).name
    if isinstance(contract, str):
        return compare(
            got, a, b, dn, mode=contract, preferred_element_type=pet, extra_roundings=extra
        )
    return compare(got, a, b, dn, mode="fast", preferred_element_type=pet, bound=contract)


def _problems(
    ls: OperandSpec,
    rs: OperandSpec,
    pool: st.SearchStrategy[Layout],
    hazards: bool,
    elements: str,
    fill: Any,
) -> st.SearchStrategy[tuple[Any, Any, Any]]:
    @st.composite
    def drawn(d: st.DrawFn, layouts: st.SearchStrategy[Layout], fill: Any) -> tuple:
        lshape, rshape, dn = d(layouts, label="layout")
        a = d(ls.draw(tuple(lshape), elements=elements, fill=fill), label="lhs")
        b = d(rs.draw(tuple(rshape), elements=elements, fill=fill), label="rhs")
        return a, b, dn

    plain_pool = drawn(pool, fill)
    if not hazards or "quantized" in (ls.kind, rs.kind):
        return plain_pool
    try:
        long_k = threshold_layouts(ls.format, rs.format, max_k=_HAZARD_MAX_K, below=False)
    except ValueError:
        return plain_pool
    hazard = drawn(long_k, "odd_extreme" if fill is None else fill)
    # Two draws in three at a threshold: within 20 examples a summing bug shows.
    return st.integers(0, 2).flatmap(lambda i: plain_pool if i == 0 else hazard)
