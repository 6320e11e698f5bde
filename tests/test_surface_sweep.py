"""The sweep of issue 49's new callables (tests/_surface_sweep.py): every case gives JAX's
answer, the oracle's within the documented bound, or a clear error, on every route setting.

The representative subset (:data:`SUBSET`, run by default) is one case of each kind of
input the sweep covers that compiles little and runs nothing in Pallas' interpret mode:
group sizes of each bad type and of zero-size groups, None and list operands, NaN/Inf in an
operand and in a QArray's scales on every route setting, a float4 result through
``polyfill`` (a finding of the sweep), jit, vmap and grad, a dimension-numbers layout,
each setting's bad value, a route query and a ``donate_argnums`` refusal. Every case runs
under ``EMULATE_LONG_TESTS=1`` (``python -m tests._surface_sweep`` prints the counts).
"""

from __future__ import annotations

import pytest
from _surface_sweep import FAMILIES, Case, judge

#: (family, callable, case name) of the default run
SUBSET = (
    ("ragged", "ragged_dot", "cpu: float sizes"),
    ("ragged", "ragged_dot", "cpu: None sizes"),
    ("ragged", "ragged_dot", "cpu: zero-size groups"),
    ("ragged", "ragged_dot", "cpu: rhs None"),
    ("ragged", "ragged_dot", "cpu: NaN/Inf in rhs"),
    ("ragged", "ragged_dot", "cpu: m = 0"),
    ("ragged", "ragged_dot_general", "cpu: list sizes"),
    ("ragged", "ragged_dot", "cpu: QArray, NaN/Inf scales"),
    ("ragged", "polyfill(lax.ragged_dot)", "cpu: preferred_element_type float4_e2m1fn"),
    ("transforms", "ragged_dot", "cpu: vmap over lhs"),
    ("transforms", "ragged_dot", "cpu: grad wrt argument 1"),
    ("general", "ragged_dot_general", "cpu: rows stored (K, M), bfloat16"),
    ("settings", "use_route", "None"),
    ("settings", "use_cpu_kernel", "1"),
    ("settings", "prepare_weights", "experts='no'"),
    ("queries", "ragged_dot_route", "rhs None (cpu)"),
    ("compiler", "compiler.compile", "donate_argnums=5"),
)


def _cases(families: tuple[str, ...]) -> list[Case]:
    return [c for f in families for c in FAMILIES[f]()]


def _subset() -> list[Case]:
    wanted = {(c, n) for _, c, n in SUBSET}
    found = [
        c
        for c in _cases(tuple(dict.fromkeys(f for f, _, _ in SUBSET)))
        if (c.callable, c.name) in wanted
    ]
    assert len(found) == len(SUBSET), "a SUBSET case is no longer in the sweep"
    return found


def test_the_representative_subset_has_no_finding():
    findings = {f"{c.callable}: {c.name}": judge(c) for c in _subset()}
    assert {k: v for k, v in findings.items() if v} == {}


@pytest.mark.long
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_case_of_the_sweep_has_no_finding(family):
    findings = {f"{c.callable}: {c.name}": judge(c) for c in FAMILIES[family]()}
    assert {k: v for k, v in findings.items() if v} == {}
