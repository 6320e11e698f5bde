"""Tests for emulate.compiler.isolate: compiling with the compatibility setting other than
this process's, in a subprocess that is kept for later calls and survives a crash."""

from __future__ import annotations

import functools
import os
import sys
import types

import jax
import pytest

from emulate import compiler
from emulate.compiler import isolate
from emulate.mosaic import ProgramFacts, Verdict
from tests.compiler._programs import matmul, spec

MIXED = "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."


def _abort(x: jax.Array) -> jax.Array:
    """Kills the process that traces it: stands for a compiler that aborts."""
    os.abort()


def test_child_env_sets_the_flag_once():
    env = isolate.child_env(False)
    assert env["LIBTPU_INIT_ARGS"].split().count("--xla_mosaic_compat_mode=false") == 1
    assert "--xla_mosaic_compat_mode=true" not in env["LIBTPU_INIT_ARGS"]
    assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    assert env["JAX_PLATFORMS"] == "cpu"


def _pid(x: jax.Array) -> jax.Array:
    """Refused while traced, with the id of the process that traces it as the message."""
    raise ValueError(f"pid {os.getpid()}")


# One crash serves both: the batch around it compiles in the kept subprocess, and its
# replacement answers the rest (each fresh subprocess starts JAX and libtpu, about 4 s).
def test_a_subprocess_compiles_with_the_other_setting_is_kept_and_survives_a_crash():
    pid = compiler.Job(_pid, (spec("float32"),), "tpu_v5e")
    (first,) = isolate.compile_isolated([pid], compat=False)
    (again,) = isolate.compile_isolated([pid], compat=False)
    assert (first.stage, again.message) == ("lower", first.message)
    assert first.message != f"pid {os.getpid()}"
    acc = functools.partial(matmul, acc="float32")
    jobs = [
        compiler.Job(acc, (spec("bfloat16"), spec("int8")), "tpu_v5e"),
        pid,
        compiler.Job(_abort, (spec("float32"),), "tpu_v5e"),
        compiler.Job(acc, (spec("float8_e4m3fn"),) * 2, "v5e"),
        pid,
    ]
    mixed, before, crashed, fp8, after = isolate.compile_isolated(jobs, compat=False)
    assert (mixed.ok, mixed.stage, mixed.message) == (False, "compile", MIXED)
    assert before.message == first.message
    assert not crashed.ok and crashed.stage == "crash"
    assert crashed.message.startswith("the compiler process died (signal 6)")
    assert fp8 == Verdict(True)
    # the program's facts come back through the subprocess's protocol
    assert fp8.program == ProgramFacts(tpu_custom_calls=1, xla_contractions=0, temp_bytes=0)
    assert mixed.program is None and crashed.program is None
    assert after.stage == "lower" and after.message not in (first.message, f"pid {os.getpid()}")
    (later,) = isolate.compile_isolated([pid], compat=False)
    assert later.message == after.message


def test_an_interrupted_call_leaves_no_verdicts_to_the_next(monkeypatch):
    pid = compiler.Job(_pid, (spec("float32"),), "tpu_v5e")
    (first,) = isolate.compile_isolated([pid], compat=False)

    class Interrupted(Exception):
        pass

    def loads(raw):
        raise Interrupted

    mixed = compiler.Job(
        functools.partial(matmul, acc="float32"), (spec("bfloat16"), spec("int8")), "v5e"
    )
    with monkeypatch.context() as m:
        m.setattr(isolate, "json", types.SimpleNamespace(loads=loads))
        with pytest.raises(Interrupted):
            isolate.compile_isolated([mixed, pid], compat=False)
    # a fresh child answers: not the interrupted batch's verdict on the mixed pair
    (after,) = isolate.compile_isolated([pid], compat=False)
    assert after.stage == "lower" and after.message.startswith("pid ")
    assert after.message != first.message


def test_a_subprocess_needs_fn_by_reference():
    with pytest.raises(TypeError, match=r"^fn: compiling with compat=False runs in a subprocess"):
        isolate.compile_isolated([compiler.Job(lambda x: x, (spec("float32"),), "v5e")], False)


def test_a_subprocess_reports_a_fn_it_cannot_import(monkeypatch):
    module = types.ModuleType("emulate_test_only_here")
    exec("def f(x):\n    return x\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(TypeError) as e:
        isolate.compile_isolated([compiler.Job(module.f, (spec("float32"),), "v5e")], False)
    assert str(e.value) == (
        "fn: the compiler subprocess could not unpickle the jobs (ModuleNotFoundError: "
        "No module named 'emulate_test_only_here')"
    )
