"""Compile-only checks of a test module's kernel programs: one shared compile of every
selected (case, target) with Mosaic's compatibility mode on and off (``compiler.check_both``:
the compat-off programs in one subprocess), read by each parametrized test.

A module defines ``RUNS = runs(cases, targets, default)``, ``verdicts = fixture(param,
program, specs)`` (a module-scoped fixture) and a test parametrized over ``(param,
"target")`` that calls ``assert_compiles``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from emulate import compiler

#: The test every module names its compile-only check (its parameters select the runs).
TEST_NAME = "test_the_tpu_compiler_compiles_it"


def runs(cases: Iterable[str], targets: Iterable[str], default: set[tuple[str, str]]) -> list:
    """``pytest.param(case, target)`` for each pair, ``long`` unless in ``default``."""
    return [
        pytest.param(c, t, marks=[] if (c, t) in default else [pytest.mark.long], id=f"{c}-{t}")
        for c in cases
        for t in targets
    ]


@functools.cache
def _check(jobs: Callable[[str, str], compiler.Job], selected: tuple) -> dict:
    made = [jobs(c, t) for c, t in selected]
    got = compiler.check_both({True: made, False: made})
    return {(r, c): v for c in (True, False) for r, v in zip(selected, got[c], strict=True)}


def verdicts(
    request: pytest.FixtureRequest, param: str, jobs: Callable[[str, str], compiler.Job]
) -> dict:
    """The verdicts of the module's selected runs (this session's items of
    :data:`TEST_NAME` in ``request``'s module), keyed ``((case, target), compat)``;
    ``jobs(case, target)`` makes each one's :class:`compiler.Job`."""
    selected = tuple(
        (item.callspec.params[param], item.callspec.params["target"])
        for item in request.session.items
        if getattr(item, "originalname", "") == TEST_NAME and item.module is request.module
    )
    return _check(jobs, selected)


def fixture(
    param: str, program: Callable[..., Any], specs: Callable[[str], tuple[Any, ...]]
) -> Any:
    """A module-scoped pytest fixture of :func:`verdicts`: the run of case ``c`` on target
    ``t`` compiles ``functools.partial(program, **{param: c, "target": t})`` (``program``
    a module-level function, so that the compat-off subprocess imports it) on the
    argument specs ``specs(c)``."""

    def job(case: str, target: str) -> compiler.Job:
        fn = functools.partial(program, **{param: case, "target": target})
        return compiler.Job(fn, specs(case), target)

    @pytest.fixture(scope="module")
    def module_verdicts(request: pytest.FixtureRequest) -> dict:
        return verdicts(request, param, job)

    return module_verdicts


def assert_compiles(got: dict, case: str, target: str) -> None:
    """Both settings compiled ``case`` on ``target``; else the compiler's message."""
    for compat in (True, False):
        v: Any = got[((case, target), compat)]
        assert v.ok, f"{case} on {target}, compat {compat}: {v.stage}: {v.message}\n{v.detail}"
