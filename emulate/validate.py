"""``emulate validate``: property-based differential checks of every plan against the oracle.

For each (target, lhs format, rhs format, mode) a *row*: hypothesis draws ``dot_general``
problems (:func:`emulate.testing.dot_general_problems`: special values boosted, a fixed
pool of shapes and dimension numbers so compiled programs are reused, and a K = 1100
contraction whose operands are mostly the format's largest values, where a naive float32
sum of int8 products goes wrong), runs :func:`emulate.dot_general` for the target on this
machine and checks each result with :func:`emulate.testing.compare`: bit for bit for the
exact classes, within :func:`emulate.bounds.dot_general_bound` for the other pairs in mode
"fast", bit for bit in mode "exact". A row whose mode :func:`emulate.plan` does not build
for the pair (``NotImplementedError``) is reported as "not built", neither passed nor
failed; no pair of the low-precision formats with itself or with bfloat16 is one.

Targets whose plans for a pair share :func:`emulate.testing.plan_key` run the same
program: the row is checked once, on the first of them, and repeated for the others.

A row that fails is searched again with the same seed and hypothesis shrinks the first
failing example to a minimal one, which :func:`emulate.testing.reproducer` writes as a
ready-to-run script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from hypothesis import HealthCheck, Phase, Verbosity, configuration, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from emulate import formats, targets
from emulate import testing as et
from emulate.planning.exactness import exact_class
from emulate.planning.plan import MODES, Plan
from emulate.planning.plan import plan as make_plan
from emulate.tables import short_format, short_target, table

__all__ = [
    "DEFAULT_EXAMPLES",
    "Outcome",
    "Row",
    "Tally",
    "check",
    "default_formats",
    "heavy",
    "default_targets",
    "pairs",
    "render",
    "row_strategy",
    "run",
]

#: Examples per row when ``--examples`` is not given.
DEFAULT_EXAMPLES = 16

#: The result type the plan column (and ``emulate targets``) plans for.
PLAN_RESULT = "float32"


@dataclasses.dataclass(frozen=True)
class Row:
    """The outcome of one (target, lhs, rhs, mode).

    Attributes:
      target, lhs, rhs, mode: what was checked (canonical names).
      plan: the plan's method for a float32 result (``emulate.plan(...).method``), as
        ``emulate targets`` shows it; None when there is no plan ("not built").
      fallback: the fallback method the program takes off the target's platform, or None.
      runs: the method the program ran on this machine (the plan's, or its fallback's).
      contract: "exact", "bounded", or None ("not built").
      status: "ok", "mismatch", or "not built" (mode "exact" raises NotImplementedError
        for this pair: neither a pass nor a failure).
      examples: examples tried.
      mismatches: examples whose result broke the contract (or raised).
      max_ulps: the largest distance from the reference in ulps of the result type.
      worst_ratio: bounded rows: the largest error divided by the allowance (at most 1
        within the contract); None otherwise.
      seconds: wall time of the row.
      same_as: the target whose identical program was checked for this row, or None.
      reproducer: for a failing row, the shrunk example as a Python script.
      report: for a failing row, what the shrunk example got wrong.
    """

    target: str
    lhs: str
    rhs: str
    mode: str
    plan: str | None
    fallback: str | None
    runs: str | None
    contract: str | None
    status: str
    examples: int = 0
    mismatches: int = 0
    max_ulps: float | None = None
    worst_ratio: float | None = None
    seconds: float = 0.0
    same_as: str | None = None
    reproducer: str | None = None
    report: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as JSON-ready values (an infinite number becomes the string "inf")."""
        out = dataclasses.asdict(self)
        for k, v in out.items():
            if isinstance(v, float) and math.isinf(v):
                out[k] = "inf"
        out["seconds"] = round(self.seconds, 3)
        return out


def default_formats() -> list[str]:
    """Every low-precision format except the scale type float8_e8m0fnu."""
    return list(formats.LOW_PRECISION_OPERANDS)


def default_targets() -> list[str]:
    """The detected (current) target and tpu_v4, the oldest TPU with a bf16 matrix unit."""
    return list(dict.fromkeys([targets.current_target().name, "tpu_v4"]))


def pairs(fmts: Iterable[str]) -> list[tuple[str, str]]:
    """Each format with itself, then bfloat16 x each (bf16 activations, low-precision weights)."""
    fmts = list(dict.fromkeys(fmts))
    same = [(f, f) for f in fmts]
    mixed = [("bfloat16", f) for f in fmts if f != "bfloat16"]
    return same + mixed


def _row_seed(seed: int, lhs: str, rhs: str, mode: str) -> int:
    """The row's hypothesis seed: the same for every target, so shared programs see the
    same examples."""
    return zlib.crc32(f"{seed}:{lhs}:{rhs}:{mode}".encode())


def _host_platform() -> str:
    import jax

    backend = jax.default_backend()
    return {"gpu": "cuda"}.get(backend, backend)


#: The one layout of a compile-heavy row (see :func:`heavy`): two contracting dims in
#: permuted order (K = 2400, more than one exact chunk of the bf16 and f32 slice routes
#: for every pair the default run checks), a batch dim and a free dim on each side.
HEAVY_LAYOUT: et.Layout = ((2, 3, 16, 150), (150, 2, 16, 2), (((2, 3), (2, 0)), ((0,), (1,))))


def heavy(lhs: str, rhs: str, mode: str) -> bool:
    """Whether a row is compile-heavy: mode "exact" for a pair outside the exact class.

    Its plans slice the operands' exponent range into several exact passes, and each
    program takes seconds to compile (about 15 times a mode "fast" program), so by default
    such a row draws from one program only, :data:`HEAVY_LAYOUT` with the result type of
    ``lax.dot_general``'s rule (where XLA can hold it). ``all_layouts=True``
    (``--all-layouts``) gives it the full pool and K = 1100.
    """
    return mode == "exact" and not exact_class(lhs, rhs)


def row_strategy(lhs: str, rhs: str, *, reduced: bool = False) -> st.SearchStrategy[et.DotProblem]:
    """The problems a row of ``lhs`` x ``rhs`` draws: the layout pool, each layout tied to
    one result type (few programs), and a K = 1100 problem of extreme values; with
    ``reduced`` (a compile-heavy row, :func:`heavy`) only :data:`HEAVY_LAYOUT`."""
    pets = et.result_types(lhs, rhs)
    ints = formats.get(lhs).is_integer and formats.get(rhs).is_integer
    if reduced:
        return et.dot_general_problems(
            lhs, rhs, layouts=[HEAVY_LAYOUT], preferred_element_types=[pets[0]]
        )
    combos = [(layout, pets[i % len(pets)]) for i, layout in enumerate(et.DEFAULT_LAYOUTS)]
    parts = [
        et.dot_general_problems(lhs, rhs, layouts=[layout], preferred_element_types=[pet])
        for layout, pet in combos
    ]
    parts.append(
        et.dot_general_problems(
            lhs,
            rhs,
            layouts=[et.LONG_K_LAYOUT],
            preferred_element_types=["int32" if ints else "float32"],
            fill="extreme",
        )
    )
    return st.one_of(parts)


class Outcome(NamedTuple):
    """One example's result: ``ok`` within the contract; ``ulps`` its distance from the
    reference in ulps of the result type (inf where the call raised); ``ratio`` error over
    allowance for a bounded pair (None otherwise); ``report`` what went wrong, in words."""

    ok: bool
    ulps: float
    ratio: float | None
    report: str


@dataclasses.dataclass
class Tally:
    """What one row's examples showed so far (:meth:`add` one :class:`Outcome` at a time).

    Attributes:
      examples: examples seen.
      mismatches: examples that broke the contract (or raised).
      max_ulps: the largest distance from the reference, in ulps (0.0 before any example).
      worst_ratio: the largest error over allowance among bounded examples; None if none.
      first_failure: the first problem that broke the contract; None if none did.
    """

    examples: int = 0
    mismatches: int = 0
    max_ulps: float = 0.0
    worst_ratio: float | None = None
    first_failure: et.DotProblem | None = None

    def add(self, problem: et.DotProblem, outcome: Outcome) -> None:
        """Count ``outcome``, the result of ``problem``."""
        self.examples += 1
        self.max_ulps = max(self.max_ulps, outcome.ulps)
        if outcome.ratio is not None:
            self.worst_ratio = max(self.worst_ratio or 0.0, outcome.ratio)
        if not outcome.ok:
            self.mismatches += 1
            if self.first_failure is None:
                self.first_failure = problem


def _check_one(problem: et.DotProblem, target: str, mode: str) -> Outcome:
    """Run one problem against the reference."""
    import emulate

    lhs, rhs, dn, pet = problem
    try:
        got = emulate.dot_general(
            lhs, rhs, dn, preferred_element_type=pet, target=target, mode=mode
        )
        c = et.compare(got, lhs, rhs, dn, mode=mode, preferred_element_type=pet)
    except Exception as e:  # noqa: BLE001 - any exception is a failed example
        return Outcome(False, math.inf, None, f"emulate.dot_general raised {type(e).__name__}: {e}")
    return Outcome(c.ok, c.max_ulps, c.worst_ratio, c.report())


def _settings(examples: int, phases: Sequence[Phase]) -> settings:
    return settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=phases,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )


def _tally(
    strategy: st.SearchStrategy[et.DotProblem], target: str, mode: str, examples: int, seed: int
) -> Tally:
    """Draw ``examples`` problems (no shrinking) and tally their outcomes."""
    tally = Tally()

    def never_done(problem: et.DotProblem) -> bool:  # find() draws until this holds
        tally.add(problem, _check_one(problem, target, mode))
        return False

    with contextlib.suppress(NoSuchExample):
        find(
            strategy,
            never_done,
            settings=_settings(examples, [Phase.generate]),
            random=random.Random(seed),
        )
    return tally


def _shrunk_failure(
    strategy: st.SearchStrategy[et.DotProblem],
    target: str,
    mode: str,
    examples: int,
    seed: int,
    first: et.DotProblem,
) -> et.DotProblem:
    """The first failure, shrunk: the same seed finds it again and hypothesis shrinks it;
    ``first`` where the search does not find it again."""
    try:
        return find(
            strategy,
            lambda prob: not _check_one(prob, target, mode).ok,
            settings=_settings(examples, [Phase.generate, Phase.shrink]),
            random=random.Random(seed),
        )
    except NoSuchExample:
        return first


def check(
    target: str,
    lhs: str,
    rhs: str,
    mode: str,
    *,
    examples: int,
    seed: int,
    all_layouts: bool = False,
) -> Row:
    """Check one row (see the module docstring); never raises for a broken result."""
    start = time.perf_counter()
    try:
        p = make_plan(lhs, rhs, target=target, preferred_element_type=PLAN_RESULT, mode=mode)
    except NotImplementedError:
        return Row(target, lhs, rhs, mode, None, None, None, None, "not built")
    contract = "exact" if p.exact or mode == "exact" else "bounded"
    strategy = row_strategy(lhs, rhs, reduced=heavy(lhs, rhs, mode) and not all_layouts)
    row_seed = _row_seed(seed, lhs, rhs, mode)
    tally = _tally(strategy, target, mode, examples, row_seed)
    reproducer = report = None
    if tally.first_failure is not None:
        shrunk = _shrunk_failure(strategy, target, mode, examples, row_seed, tally.first_failure)
        report = _check_one(shrunk, target, mode).report
        reproducer = et.reproducer(shrunk, target=target, mode=mode)
    return Row(
        target=target,
        lhs=lhs,
        rhs=rhs,
        mode=mode,
        plan=p.method,
        fallback=None if p.fallback is None else p.fallback.method,
        runs=_runs(p),
        contract=contract,
        status="mismatch" if tally.mismatches else "ok",
        examples=tally.examples,
        mismatches=tally.mismatches,
        max_ulps=tally.max_ulps,
        worst_ratio=tally.worst_ratio if contract == "bounded" else None,
        seconds=time.perf_counter() - start,
        reproducer=reproducer,
        report=report,
    )


def _runs(p: Plan) -> str:
    """The method the program runs on this machine: the fallback off the plan's platform."""
    if p.fallback is not None and p.platform != _host_platform():
        return p.fallback.method
    return p.method


def _key(target: str, lhs: str, rhs: str, mode: str) -> tuple | None:
    try:
        p = make_plan(lhs, rhs, target=target, preferred_element_type=PLAN_RESULT, mode=mode)
    except NotImplementedError:
        return None
    return (*et.plan_key(p), _runs(p))


def run(
    target_names: Sequence[str],
    format_names: Sequence[str],
    modes: Sequence[str] = MODES,
    *,
    examples: int = DEFAULT_EXAMPLES,
    seed: int = 0,
    all_layouts: bool = False,
    on_row: Callable[[Row | None, str], None] | None = None,
) -> list[Row]:
    """Check every (target, pair, mode): rows in target, pair, mode order.

    Args:
      target_names: canonical target names.
      format_names: canonical format names; the pairs are :func:`pairs` of them.
      modes: "fast" and/or "exact".
      examples: hypothesis examples per row.
      seed: the seed every row's examples derive from.
      all_layouts: give compile-heavy rows (:func:`heavy`) the full layout pool too.
      on_row: called as ``on_row(None, description)`` before a row is checked and
        ``on_row(row, description)`` after (for a progress bar).
    """
    jobs = [(t, a, b, m) for t in target_names for a, b in pairs(format_names) for m in modes]
    done: dict[tuple, Row] = {}
    rows = []
    with _scratch_hypothesis_storage():
        for t, a, b, m in jobs:
            desc = f"{t} {a} x {b} {m}"
            if on_row is not None:
                on_row(None, desc)
            key = _key(t, a, b, m)
            shared = done.get((a, b, m, key)) if key is not None else None
            if shared is not None:
                row = dataclasses.replace(
                    shared,
                    target=t,
                    seconds=0.0,
                    same_as=shared.target,
                    reproducer=_retarget(shared, t),
                )
            else:
                row = check(t, a, b, m, examples=examples, seed=seed, all_layouts=all_layouts)
                if key is not None:
                    done[(a, b, m, key)] = row
            rows.append(row)
            if on_row is not None:
                on_row(row, desc)
    return rows


@contextlib.contextmanager
def _scratch_hypothesis_storage():
    """Point hypothesis' storage (its constants cache) at a temporary directory, so that
    validate leaves no ``.hypothesis/`` behind in the working directory; restored after.
    ``HYPOTHESIS_STORAGE_DIRECTORY``, where set, is respected."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        yield
        return
    previous = configuration.storage_directory(intent_to_write=False).home_directory
    with tempfile.TemporaryDirectory(prefix="emulate-validate-") as scratch:
        configuration.set_hypothesis_home_dir(scratch)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(previous)


def _retarget(row: Row, target: str) -> str | None:
    if row.reproducer is None:
        return None
    return row.reproducer.replace(f"target={row.target!r}", f"target={target!r}")


def _num(v: float | None, fmt: str) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf"
    return format(v, fmt)


def _cells(r: Row) -> dict[str, str]:
    built = r.status != "not built"
    plan = "-" if r.plan is None else r.plan + ("*" if r.runs != r.plan else "")
    if r.same_as is not None:
        when = f"={short_target(r.same_as)}"
    else:
        when = f"{r.seconds:.1f}s" if built else "-"
    return {
        "target": r.target,
        "pair": f"{short_format(r.lhs)} x {short_format(r.rhs)}",
        "mode": r.mode,
        "plan": plan,
        "contract": r.contract or "not built",
        "tried": str(r.examples) if built else "-",
        "fail": str(r.mismatches) if built else "-",
        "ulps": _num(r.max_ulps, "g") if built else "-",
        "err/bound": _num(r.worst_ratio, ".3g"),
        "time": when,
    }


LEGEND = """\
pair: lhs x rhs (bf16 = bfloat16; float8_/float6_/float4_ dropped). plan: emulate.plan's method
for a float32 result, as `emulate targets` shows it; * = a native plan this machine cannot
compile, checked on its fallback route (Plan.fallback). contract: exact = bit for bit with
emulate.reference; bounded = within emulate.bounds.dot_general_bound (mode "fast"); not built =
the plan raised NotImplementedError for this pair and mode: neither passed nor failed.
tried: examples; fail: examples that broke the contract; ulps: largest distance from the
reference in ulps of the result type; err/bound: the smallest error bound that admits the
results, over the bound of mode "fast" (<= 1: within the contract); time: =T: the same
program was checked on target T."""


def render(rows: Sequence[Row]) -> str:
    """The rows as a plain-text table, then the legend and a summary line."""
    text = table([_cells(r) for r in rows])
    checked = [r for r in rows if r.status != "not built"]
    failed = [r for r in rows if r.status == "mismatch"]
    not_built = len(rows) - len(checked)
    summary = (
        f"{len(checked)} rows checked "
        f"({sum(r.examples for r in checked if r.same_as is None)} examples), "
        f"{len(failed)} with mismatches, {not_built} exact mode not built"
    )
    return f"{text}\n\n{LEGEND}\n\n{summary}"
