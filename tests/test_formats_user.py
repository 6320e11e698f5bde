"""Formats users build and register: refused clashes, and a user-built 7-bit e3m3 and 5-bit
unsigned float run through dot_general, quantize, validate and polyfill on cpu, tpu_v4 and
tpu_v5e, checked against the oracle (bit for bit where the plan is exact)."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import _record_formats as R
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _pages import section_blocks

import emulate
from emulate import formats, reference, testing, validate

R.register_user_formats()
TARGETS = ("cpu", "tpu_v4", "tpu_v5e")
MATMUL = (((1,), (0,)), ((), ()))


def test_register_refuses_clashes_and_accepts_the_same_record_again() -> None:
    e3m3 = formats.get("e3m3")
    assert formats.register(formats.float_format("e3m3", **R.USER["e3m3"])) == e3m3
    other = formats.float_format("e3m3", bits=7, precision=4, bias=4)
    with pytest.raises(ValueError, match="^fmt: the name 'e3m3' is a different format; choose"):
        formats.register(other)
    with pytest.raises(ValueError, match="^fmt: the name 'e4m3' is an alias; choose another"):
        formats.register(formats.float_format("e4m3", bits=8, precision=4))
    with pytest.raises(ValueError, match="^fmt: the name 'My8' is not lower case"):
        formats.register(formats.float_format("My8", bits=8, precision=4))
    with pytest.raises(TypeError, match="^fmt: expected a Format"):
        formats.register("e3m3")  # type: ignore[arg-type]
    stray = dataclasses.replace(e3m3, name="never_registered")
    with pytest.raises(ValueError, match="^lhs: the format record 'never_registered' is not"):
        formats.get(stray, arg="lhs")
    names = formats.names()
    assert names[-4:] == formats.WIDE
    assert (
        names.index("p3109_k8p8uf") < names.index("e3m3") < names.index("u5e3m2") < len(names) - 4
    )
    assert {"e3m3", "u5e3m2"} <= set(formats.registered())


def _operands() -> tuple[emulate.Packed, emulate.Packed]:
    rng = np.random.default_rng(0)
    a = emulate.encode(rng.normal(size=(4, 40)).astype(np.float32) * 4, "e3m3")
    b = emulate.encode(np.abs(rng.normal(size=(40, 3))).astype(np.float32) * 4, "u5e3m2")
    return emulate.pack(a, "e3m3", axis=-1), emulate.pack(b, "u5e3m2", axis=0)


def _oracle(a, b) -> np.ndarray:
    """The numpy oracle's f32 product of the packed e3m3 and u5e3m2 operands."""
    return reference.dot_general(
        reference.decode(np.asarray(emulate.unpack(a)), "e3m3"),
        reference.decode(np.asarray(emulate.unpack(b)), "u5e3m2"),
        MATMUL,
        "float32",
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_dot_general_of_user_formats_keeps_the_contract(target: str, mode: str) -> None:
    a, b = _operands()
    p = emulate.plan("e3m3", "u5e3m2", target=target, mode=mode)
    # e3m3 has 4 significant bits and values 2**-5 .. 28: bf16 holds them; int8 does not.
    assert p.method in ({"bf16", "f32"} if mode == "fast" else {"sliced-bf16", "sliced-int8"})
    got = emulate.dot_general(
        a, b, MATMUL, preferred_element_type=jnp.float32, target=target, mode=mode
    )
    c = testing.compare(got, a, b, MATMUL, mode=mode, preferred_element_type=jnp.float32)
    assert c.ok, c.report()
    if mode == "exact":
        assert np.array_equal(np.asarray(got), _oracle(a, b))


#: polyfill in mode "exact" compiles the exact QArray path (about 8 s a target, 12 s on a
#: loaded machine): under EMULATE_LONG_TESTS=1 on every target; by default the polyfill
#: of user-format QArrays runs in mode "fast", and the user formats' exact bits are
#: test_dot_general_of_user_formats_keeps_the_contract's (exact on every target).
POLYFILL_CASES = [
    pytest.param(t, m, marks=pytest.mark.long if m == "exact" else ())
    for t in TARGETS
    for m in ("fast", "exact")
]


@pytest.mark.parametrize("target, mode", POLYFILL_CASES)
def test_polyfill_of_user_format_qarrays_keeps_the_contract(target: str, mode: str) -> None:
    """The operands of the test above as QArrays (one float32 scale of 1 each) through
    polyfill: the same contract, bit for bit in mode exact."""
    a, b = _operands()
    qa = emulate.QArray.from_parts(a, np.ones((1, 1), np.float32), block_shape=(4, 40))
    qb = emulate.QArray.from_parts(b, np.ones((1, 1), np.float32), block_shape=(40, 3))
    step = jax.jit(emulate.polyfill(lambda x, y: x @ y, target=target, mode=mode))
    poly = np.asarray(step(qa, qb))
    c = testing.compare(poly, qa, qb, MATMUL, mode=mode, preferred_element_type=jnp.float32)
    assert c.ok, c.report()
    if mode == "exact":
        assert np.array_equal(poly, _oracle(a, b))


def test_quantize_into_a_user_format_and_matmul_and_polyfill_on_every_target() -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(64, 8)).astype(np.float32)
    x = rng.normal(size=(2, 64)).astype(np.float32)
    q = emulate.quantize(w, "e3m3", block_shape=(32, 1), scale_fmt="float8_e8m0fnu")
    codes, scales, _ = reference.quantize(w, "e3m3", (32, 1))
    assert np.array_equal(np.asarray(q.unpacked_codes()), codes)
    assert np.array_equal(np.asarray(q.scales).astype(np.float64), scales.astype(np.float64))
    for target in TARGETS:
        got = emulate.dot_general(x, q, MATMUL, target=target)
        c = testing.compare(got, x, q, MATMUL, mode="fast")
        assert c.ok, c.report()
        step = jax.jit(emulate.polyfill(lambda a, b: a @ b, target=target))
        assert np.array_equal(np.asarray(step(x, q)), np.asarray(got))


#: validate's row: mode "fast" on the CPU by default (validate reads the user formats by
#: name, draws their codes and checks them); every target in both modes under
#: EMULATE_LONG_TESTS=1 (the user formats' exact bits on every target, tpu_v5e's int8
#: slices and tpu_v4's bf16 ones: test_dot_general_of_user_formats_keeps_the_contract).
VALIDATE_CASES = [
    pytest.param(
        t,
        m,
        marks=() if (t, m) == ("cpu", "fast") else pytest.mark.long,
        id=f"{m}-{t}",
    )
    for t in TARGETS
    for m in ("fast", "exact")
]


@pytest.mark.parametrize("target, mode", VALIDATE_CASES)
def test_validate_checks_a_user_format_row(target: str, mode: str) -> None:
    row = validate.check(target, "e3m3", "u5e3m2", mode, examples=3, seed=0)
    assert (row.status, row.examples, row.mismatches) == ("ok", 3, 0), row


def test_the_api_page_example_prints_what_the_page_says() -> None:
    code, printed = section_blocks("api.md", "emulate.formats", ("python", "text"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/api.md", "exec"), {})  # noqa: S102 - the page's own example
    assert out.getvalue() == printed
