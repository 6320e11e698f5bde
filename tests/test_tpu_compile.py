"""Everything emulate emits for a TPU compiles there: the real XLA:TPU and Mosaic compilers
(libtpu, a declared test dependency; :mod:`emulate.compiler`) compile, for every generation
the installed libtpu offers, with Mosaic's compatibility mode on and off:

- ``emulate.pallas.matmul`` for bf16 and f32 activations with every weight format it
  takes (int8, packed int4, float8_e4m3fn, float8_e5m2, packed float4_e2m1fn, packed
  float6, uint8, packed uint4) and for the same-type pairs, and on prepared QArray weights
  (``QARRAY_SCHEMES``: group scales of 128 and 32 rows, per-channel scales with exact
  limbs, scales for all columns with a tensor scale);
- ``emulate.pallas.dot`` in a one-block kernel, for the same pairs where XLA holds the
  format (not float6);
- ``emulate.dot_general`` (those pairs), ``emulate.conv_general_dilated`` (a few) and a
  scaled QArray contraction (``emulate.mx.MXFP4``, ``NVFP4``) in mode "fast", and a few
  of each in mode "exact" (see EXACT_PAIRS), planned for the generation: one generation
  (the oldest) stands for each distinct plan of a pair and mode, since the XLA-level
  program emitted depends on the plan only (the Pallas kernels are compiled on every
  generation: Mosaic's rules differ);
- examples/decoder_block.py's block, polyfilled for the generation;
- the kernel route (issue 39), route "auto": ``emulate.matmul`` of x (1, 1, 1024) bf16 (M
  = 1 behind a batch axis) and a prepared int4 weight (groups of 32 rows, float16 scales),
  and ``emulate.ragged_dot`` of 8 rows and 8 prepared MXFP4 experts (1024 x 512 each),
  compat on and off; each program is asserted to be the kernel's one ``tpu_custom_call``,
  no ``dot(`` / ``convolution(`` left (no XLA route for the weight), no temporaries for
  the matmul and fewer than a quarter of the experts' bytes for the grouped kernel (its
  fixed scratch on v2, v3 and v5p). The facts come with each verdict
  (:class:`emulate.mosaic.ProgramFacts`), from the compat-off subprocess too.

One subprocess compiles every compat-off program (``check_many``); the compat-on ones
compile in this process, at the same time. The programs are in tests/_tpu_programs.py.
Compatibility mode is a flag of Mosaic, the Pallas kernel compiler: the XLA-level programs
(dot_general, conv, scaled, the polyfilled block) hold no Pallas kernel, so they are
compiled once, with the process's setting.

One known refusal is asserted as such: on v2 and v3 Mosaic cannot take 4-bit arrays
(int4, uint4, float4_e2m1fn) as kernel operands at all ("Failed to verify layout for
Mosaic kernel operand"), before any dot; ``pallas.matmul`` keeps such weights packed in
uint8 and is not affected (docs/kernels.md).

Every test here shares one compilation of every selected case: under pytest-xdist the
first worker to need it compiles, under a file lock in the session's shared temporary
folder, and the others read its verdicts.

Default profile and long sweep (tests/conftest.py, docs/testing.md): a kernel case
(``pallas.matmul``, ``pallas.dot``) on a generation is marked ``long``, so deselected
unless ``EMULATE_LONG_TESTS=1``, when an earlier generation has the same Mosaic rules and
the same kernel for the pair: equal verdicts on every case of the recorded Mosaic probe
(:func:`emulate.mosaic.recorded`; ok or refused) and an equal ``pallas.compute`` of the pair
(target name aside). In jax 0.10.2's probe that leaves out tpu_v3 (as tpu_v2), tpu_v5p (as
tpu_v5e) and tpu_v6e except for its native float8 pairs; and beyond that rule, every
kernel case of tpu_v4 (KERNEL_LONG_GENERATIONS; its ragged pallas.matmul case runs) and
the kernel cases of tpu_v5e whose pair has the route it has on tpu_v2 or tpu_v7x
(SHARED_ROUTE_LONG_GENERATIONS) are long, so that each kernel runs by default on one old
generation (tpu_v2) and one new one (tpu_v7x), and on tpu_v5e where its route differs
from both (the int8 MXU's). The XLA-level programs are kept
one per distinct plan already (above), except the scaled contraction (7-20 s of XLA:TPU
each) and the convolutions in mode "exact" (8-23 s for float8): the first plan of each
scheme (of each exact conv pair) runs by default, the others are long (the element pair's
other plans are compiled by dot_general's float4 and float8 cases on their generations,
the block-scale and window handling around them by the first plan). The polyfilled
block, an XLA-level program too, is long on a generation where an earlier one has the
same plans for its weight formats (DECODER_PAIRS). The kernel route's programs follow the
kernel cases' rule for their pair (bf16 x int4, bf16 x float4_e2m1fn): v2, v5e and v7x
by default, v3, v4, v5p and v6e long.

Compatibility mode: each default kernel case compiles with one setting, alternating
(:func:`_alternate_compat`): a pair's default generations take compat on and off in turn,
and the pairs of one generation alternate too, so each pair and each generation compiles
with both; every kernel case with both settings is long. That halves the Mosaic compiles
of the default run (the fixture took 100 s of CI's 1460 s).
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import pytest

import emulate
from emulate import compiler, mosaic
from emulate.pallas import compute

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _tpu_programs as P  # noqa: E402

GENERATIONS = ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x")
ACTIVATIONS = ("bfloat16", "float32")
LOW = (
    "int8",
    "int4",
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "uint8",
    "uint4",
)
PAIRS = tuple((a, w) for a in ACTIVATIONS for w in LOW) + tuple((f, f) for f in LOW)
XLA_HELD = tuple(p for p in PAIRS if "float6" not in p[0] + p[1])
CONV_PAIRS = (
    ("bfloat16", "int8"),
    ("bfloat16", "int4"),
    ("bfloat16", "float8_e4m3fn"),
    ("float32", "float8_e5m2"),
    ("int8", "int8"),
    ("float8_e4m3fn", "float8_e4m3fn"),
)
SCHEMES = ("MXFP4", "NVFP4")
# Mode "exact" of a non-exact-class pair is a sliced program that takes XLA:TPU seconds to
# compile (2-7 s each on 2 cores, 20 s for a float8 convolution): a few pairs stand for
# the rest (a sliced wide x int8 pair, the exact-class integer and float4 pairs, a sliced
# float8 pair), one scheme for the scaled contraction.
EXACT_PAIRS = (
    ("bfloat16", "int8"),
    ("int8", "int8"),
    ("float4_e2m1fn", "float4_e2m1fn"),
    ("float8_e4m3fn", "float8_e4m3fn"),
)
EXACT_CONV_PAIRS = (("int8", "int8"), ("float8_e4m3fn", "float8_e4m3fn"))
EXACT_SCHEMES = ("MXFP4",)


@dataclasses.dataclass(frozen=True)
class Case:
    program: str
    what: str
    target: str
    fn: Callable[..., Any]
    #: the argument shapes, built when the case is compiled (the decoder block's build runs
    #: JAX; collection, on every xdist worker, only names the cases)
    specs: Callable[[], tuple[Any, ...]]
    long: bool = False
    #: a kernel case's one compatibility setting in the default run (both under
    #: EMULATE_LONG_TESTS=1); None: every setting of :func:`_compat_settings` by default
    default_compat: bool | None = None

    @property
    def id(self) -> str:
        return f"{self.program}-{self.what}-{self.target}"


def _plan_key(lhs: str, rhs: str, target: str, mode: str) -> tuple[Any, ...]:
    """What the XLA-level program emulate emits depends on: the plan without its target
    name, rate and ranked candidates."""
    p = emulate.plan(
        lhs, rhs, target=target, mode=mode, preferred_element_type=P.out_format(lhs, rhs)
    )
    return tuple(getattr(p, f) for f in _PROGRAM_FIELDS)


_PROGRAM_FIELDS = (
    "method",
    "lhs_compute",
    "rhs_compute",
    "accumulator",
    "lhs_scale",
    "rhs_scale",
    "k_chunk",
    "k_limit",
    "slicing",
    "fallback",
)


def _mosaic_rules(target: str) -> tuple[Any, ...]:
    """What Mosaic accepts on ``target`` as far as the recorded probe tells: the ok/refused
    verdict of every probed case, in case order."""
    rows = (r for r in mosaic.recorded().rows if r.case.target == target)
    return tuple(
        sorted((r.case.lhs, r.case.rhs, r.case.acc, r.case.compat, r.verdict.ok) for r in rows)
    )


def _kernel_key(lhs: str, rhs: str, target: str) -> tuple[Any, ...]:
    """What a kernel case's outcome depends on: the generation's Mosaic rules and the
    route of the pair there (without the target's name)."""
    r = compute.in_kernel(lhs, rhs, target=target, preferred_element_type=P.out_format(lhs, rhs))
    return (_mosaic_rules(target), dataclasses.replace(r, target=""))


#: Generations whose kernel cases (pallas.matmul, pallas.dot, the kernel route) are all
#: long: tpu_v4 lies between the old generation run by default (tpu_v2) and the new ones
#: (tpu_v5e, tpu_v7x); its Mosaic rules stay in the default run through its ragged
#: pallas.matmul case, and its keys are not recorded, so no later generation is dropped as
#: a repeat of a case that is itself long.
KERNEL_LONG_GENERATIONS = ("tpu_v4",)
#: Generations whose kernel cases (pallas.matmul, pallas.dot) are long where the pair's
#: route there, target aside, is its route on one of ROUTE_PEERS (run by default: the
#: same kernel program): tpu_v5e keeps the pairs of its own routes (its int8 MXU). Its
#: keys are recorded, so tpu_v6e's cases that repeat them stay long too.
SHARED_ROUTE_LONG_GENERATIONS = ("tpu_v5e",)
ROUTE_PEERS = ("tpu_v2", "tpu_v7x")


def _route_of_a_peer(lhs: str, rhs: str, target: str) -> bool:
    """Whether the pair's kernel route on ``target`` (target aside) is its route on one of
    ROUTE_PEERS."""

    def plain(t: str) -> compute.Compute:
        r = compute.in_kernel(lhs, rhs, target=t, preferred_element_type=P.out_format(lhs, rhs))
        return dataclasses.replace(r, target="")

    return any(plain(target) == plain(t) for t in ROUTE_PEERS)


def _shared_route(lhs: str, rhs: str, target: str) -> bool:
    return target in SHARED_ROUTE_LONG_GENERATIONS and _route_of_a_peer(lhs, rhs, target)


#: The pairs whose plans the polyfilled decoder block's program depends on: its int4 and
#: float8_e4m3fn weights against either activation type.
DECODER_PAIRS = tuple((a, w) for a in ACTIVATIONS for w in ("int4", "float8_e4m3fn"))


def _cases() -> list[Case]:
    out = []
    seen: set[tuple[Any, ...]] = set()
    kernels_seen: set[tuple[Any, ...]] = set()

    def repeats(key: tuple[Any, ...]) -> bool:
        """Whether an earlier generation had this kernel key (the case is a long one)."""
        if key in kernels_seen:
            return True
        kernels_seen.add(key)
        return False

    def first(program: str, mode: str, lhs: str, rhs: str, target: str) -> bool:
        """Whether no earlier generation compiles the same plan of this program."""
        key = (program, mode, lhs, rhs, _plan_key(lhs, rhs, target, mode))
        if key in seen:
            return False
        seen.add(key)
        return True

    for t in GENERATIONS:
        for a, w in PAIRS:
            fn = functools.partial(P.pallas_matmul, lhs=a, rhs=w, target=t)
            key = ("pallas.matmul", a, w, *_kernel_key(a, w, t))
            long = t in KERNEL_LONG_GENERATIONS or repeats(key) or _shared_route(a, w, t)
            out.append(
                Case(
                    "pallas.matmul",
                    f"{a}x{w}",
                    t,
                    fn,
                    functools.partial(P.matmul_specs, a, w),
                    long,
                )
            )
        for a, w in XLA_HELD:
            fn = functools.partial(P.pallas_dot, lhs=a, rhs=w, target=t)
            key = ("pallas.dot", a, w, *_kernel_key(a, w, t))
            long = t in KERNEL_LONG_GENERATIONS or repeats(key) or _shared_route(a, w, t)
            out.append(
                Case("pallas.dot", f"{a}x{w}", t, fn, functools.partial(P.dot_specs, a, w), long)
            )
        for mode, pairs, conv_pairs, schemes in (
            ("fast", PAIRS, CONV_PAIRS, SCHEMES),
            ("exact", EXACT_PAIRS, EXACT_CONV_PAIRS, EXACT_SCHEMES),
        ):
            for a, w in pairs:
                if not first("dot_general", mode, a, w, t):
                    continue
                fn = functools.partial(P.dot_general, lhs=a, rhs=w, target=t, mode=mode)
                out.append(
                    Case(
                        "dot_general",
                        f"{mode}-{a}x{w}",
                        t,
                        fn,
                        functools.partial(P.xla_specs, a, w),
                    )
                )
            for a, w in conv_pairs:
                if not first("conv", mode, a, w, t):
                    continue
                fn = functools.partial(P.conv, lhs=a, rhs=w, target=t, mode=mode)
                long = mode == "exact" and repeats(("conv", mode, a, w))
                out.append(
                    Case(
                        "conv",
                        f"{mode}-{a}x{w}",
                        t,
                        fn,
                        functools.partial(P.conv_specs, a, w),
                        long,
                    )
                )
            for s in schemes:
                el = getattr(emulate.mx, s).format
                if not first(f"scaled-{s}", mode, el, el, t):
                    continue
                fn = functools.partial(P.scaled, scheme=s, target=t, mode=mode)
                long = repeats(("scaled", mode, s))
                out.append(Case("scaled", f"{mode}-{s}", t, fn, P.scaled_specs, long))
        fn = functools.partial(P.decoder, target=t)
        key = ("decoder_block", *(_plan_key(a, w, t, "fast") for a, w in DECODER_PAIRS))
        out.append(Case("decoder_block", "polyfill", t, fn, P.decoder_specs, repeats(key)))
    # QArray weights (issue 27): every scheme on every generation, compat on and off; v5e,
    # v2 and v7x in the default run, the others long; NVFP4 on v5e (its word step's decode
    # and scales those of MXFP4's, which runs on v2 too, but for the e4m3 scales).
    for t in GENERATIONS:
        for s in P.QARRAY_SCHEMES:
            fn = functools.partial(P.pallas_matmul_qarray, scheme=s, target=t)
            long = t not in ("tpu_v2", "tpu_v5e", "tpu_v7x")
            long = long or (s == "fp4-nv16-e4m3-tensor" and t != "tpu_v5e")
            out.append(
                Case(
                    "pallas.matmul",
                    f"qarray-{s}",
                    t,
                    fn,
                    functools.partial(P.qarray_specs, s),
                    long,
                )
            )
    # The kernel route (issue 39): a prepared weight through emulate.matmul at M = 1 behind a
    # batch axis, and prepared MXFP4 experts through emulate.ragged_dot; route "auto".
    for t in GENERATIONS:
        for program, what, fn, specs, pair in (
            ("emulate.matmul", "prepared-int4-g32-f16", P.model_matmul, P.model_specs,
             ("bfloat16", "int4")),
            ("emulate.ragged_dot", "prepared-mxfp4-experts", P.moe_ragged_dot, P.moe_specs,
             ("bfloat16", "float4_e2m1fn")),
        ):  # fmt: skip
            long = t in KERNEL_LONG_GENERATIONS or repeats((program, *pair, *_kernel_key(*pair, t)))
            fn = functools.partial(fn, target=t)
            out.append(Case(program, what, t, fn, specs, long))
    # Ragged M, K and N: partial edge blocks, the weight's rows and x's columns past K
    # masked in the kernel (TPU v4 has no select on bf16 vectors), x's block all of K.
    for t in ("tpu_v4", "tpu_v5e"):
        fn = functools.partial(P.pallas_matmul_ragged, target=t)
        out.append(Case("pallas.matmul", "ragged-bfloat16xint4", t, fn, P.ragged_specs))
    return _alternate_compat(out)


def _alternate_compat(cases: list[Case]) -> list[Case]:
    """Each default kernel case with one compatibility setting: the i-th case of a
    (program, pair) in generation order takes compat on where i + j is even, j the pair's
    index in the program's default cases, so each pair compiles with compat on and off on
    its generations, and each generation compiles pairs of both settings. Both settings
    of every kernel case under EMULATE_LONG_TESTS=1."""
    pair_index: dict[tuple[str, str], int] = {}
    seen: dict[tuple[str, str], int] = {}
    out = []
    for c in cases:
        if c.program not in KERNEL_PROGRAMS or c.long:
            out.append(c)
            continue
        key = (c.program, c.what)
        j = pair_index.setdefault(key, sum(k[0] == c.program for k in pair_index))
        i = seen.get(key, 0)
        seen[key] = i + 1
        out.append(dataclasses.replace(c, default_compat=(i + j) % 2 == 0))
    return out


#: the front ends whose program on a TPU target is one Pallas kernel (the kernel route)
ROUTED_PROGRAMS = ("emulate.matmul", "emulate.ragged_dot")
KERNEL_PROGRAMS = ("pallas.matmul", "pallas.dot", *ROUTED_PROGRAMS)
CASES = _cases()
FOUR_BIT_INPUTS = ("int4", "uint4", "float4_e2m1fn")


def _compat_settings(case: Case) -> tuple[bool, ...]:
    return (True, False) if case.program in KERNEL_PROGRAMS else (compiler.compat_mode(),)


def _refused_layout(case: Case) -> bool:
    """pallas.dot with a 4-bit kernel operand on v2/v3: Mosaic refuses the operand."""
    return (
        case.program == "pallas.dot"
        and case.target in ("tpu_v2", "tpu_v3")
        and any(f in FOUR_BIT_INPUTS for f in case.what.split("x"))
    )


_verdicts: dict[bool, dict[str, mosaic.Verdict]] = {}


def _compile_all(selected: set[tuple[str, bool]]) -> None:
    """Every selected (case id, compat) run: one subprocess for one setting (at least),
    the other in this process when it matches this process's setting; both at once."""
    runs = {compat: [c for c in CASES if (c.id, compat) in selected] for compat in (True, False)}
    got = compiler.check_both(
        {
            compat: [compiler.Job(c.fn, c.specs(), c.target) for c in cs]
            for compat, cs in runs.items()
        }
    )
    for compat, cases in runs.items():
        _verdicts[compat] = {c.id: v for c, v in zip(cases, got[compat], strict=True)}


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A folder of this test session that every xdist worker sees."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _selected(session: pytest.Session) -> set[tuple[str, bool]]:
    """The (case id, compat) runs of test_compiles that this session collected and kept
    (the same on every xdist worker)."""
    return {
        (item.callspec.params["case"].id, item.callspec.params["compat"])
        for item in session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_compiles"
    }


def _facts(v: mosaic.Verdict) -> dict[str, int] | None:
    return dataclasses.asdict(v.program) if v.program is not None else None


def _verdict(row: list[Any]) -> mosaic.Verdict:
    """A verdict as :func:`verdicts` writes it for the other xdist workers."""
    *head, facts = row
    return mosaic.Verdict(*head, program=mosaic.ProgramFacts(**facts) if facts else None)


@pytest.fixture(scope="module")
def verdicts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[bool, dict[str, mosaic.Verdict]]:
    assert compiler.generations() == GENERATIONS
    if _verdicts:
        return _verdicts
    shared = _shared_dir(tmp_path_factory)
    done = shared / "tpu_compile_verdicts.json"
    with open(shared / "tpu_compile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker compiles, the others wait and read
        if done.exists():
            data = json.loads(done.read_text())
            for key, rows in data.items():
                _verdicts[key == "on"] = {i: _verdict(v) for i, v in rows.items()}
        else:
            _compile_all(_selected(request.session))
            data = {
                "on" if compat else "off": {
                    i: [v.ok, v.stage, v.message, v.detail, _facts(v)] for i, v in rows.items()
                }
                for compat, rows in _verdicts.items()
            }
            done.write_text(json.dumps(data))
    return _verdicts


def _long_run(case: Case, compat: bool) -> bool:
    """Whether the run of ``case`` with ``compat`` is in the long sweep only."""
    return case.long or (case.default_compat is not None and compat != case.default_compat)


RUNS = [
    pytest.param(
        c,
        compat,
        id=f"{c.id}-compat_{'on' if compat else 'off'}",
        marks=[pytest.mark.long] if _long_run(c, compat) else [],
    )
    for c in CASES
    for compat in _compat_settings(c)
]


@pytest.mark.parametrize(("case", "compat"), RUNS)
def test_compiles(verdicts, case, compat):
    v = verdicts[compat][case.id]
    if _refused_layout(case):
        assert (v.ok, v.stage) == (False, "compile")
        assert "Failed to verify layout for Mosaic kernel operand" in v.message, v.message
        return
    assert v.ok, (
        f"{case.program} {case.what} on {case.target}, compat {'on' if compat else 'off'}: "
        f"{v.stage}: {v.message}\n{v.detail[-3000:]}"
    )
    if case.program in ROUTED_PROGRAMS:
        _assert_one_kernel(case, v.program)


def _assert_one_kernel(case: Case, facts: mosaic.ProgramFacts | None) -> None:
    """The kernel route's program: the kernel's one custom call, no XLA contraction left
    (no XLA route for the weight), and no weight-sized temporary."""
    assert facts is not None
    assert (facts.tpu_custom_calls, facts.xla_contractions) == (1, 0), facts
    if case.program == "emulate.matmul" and case.target in ("tpu_v2", "tpu_v3"):
        # the word step's f32 route takes x's columns in piece order, a copy of x made by
        # XLA before the kernel (measured, libtpu 0.0.42.1: 147,456 bytes on v2, x (1,
        # 1024) bf16 tiled (8, 128)), never of the weight (256 KiB of codes)
        assert facts.temp_bytes <= 147456, facts
    elif case.program == "emulate.matmul":
        assert facts.temp_bytes == 0, facts
    else:
        # measured, libtpu 0.0.42.1, compat on and off: 0 bytes on v4, v5e, v6e and v7x;
        # 412,672 on v2 and v3 at every expert size tried (278 KB .. 2.2 MB), 227,232 on
        # v5p: the grouped kernel's fixed scratch, not a copy of the experts (2.2 MB)
        assert facts.temp_bytes < P.moe_expert_bytes() // 4, facts


@pytest.mark.parametrize("target", GENERATIONS)
def test_kernel_routes_never_lean_on_compat_mode(target):
    """What pallas.matmul / pallas.dot hand to ``tpu.matmul`` undecoded (a native pair or
    the int8 route) is a same-type pair that the recorded probe says compiles with compat
    mode off: no mixed pair, no int8 x int8 on a v7x (compat mode would sum it in f32)."""
    for a, w in PAIRS + (("bfloat16", "bfloat16"), ("float32", "float32")):
        r = compute.in_kernel(a, w, target=target, preferred_element_type=P.out_format(a, w))
        if r.method in ("native", "int8"):
            assert r.lhs_compute == r.rhs_compute, (a, w, r)
            v = mosaic.verdict(target, r.lhs_compute, r.rhs_compute, compat=False)
            assert v is not None and v.ok, (a, w, r.method, v)
        if r.method in ("bf16", "int8"):
            v = mosaic.verdict(target, r.lhs_compute, r.rhs_compute, compat=False)
            assert v is not None and v.ok, (a, w, r.method, v)
