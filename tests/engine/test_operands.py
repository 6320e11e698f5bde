"""emulate/engine/operands.py: where a TPU target decodes by XLA's own convert
(``XLA_CONVERTS``), that route is taken when lowered for a TPU only, and it is exact for
every code: on the CPU (``xla_convert``, the TPU branch's function, against the oracle) and
in the real TPU compiler's own lowering of the convert (its LLO, interpreted code by code).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate import formats, reference
from emulate.engine.operands import XLA_CONVERTS, xla_convert
from emulate.numerics.storage import from_codes

DN = (((1,), (0,)), ((), ()))
FLOATS = sorted(f for fs in XLA_CONVERTS.values() for f in fs if formats.get(f).is_float)
ALL = sorted({f for fs in XLA_CONVERTS.values() for f in fs})


def _codes(fmt: str) -> np.ndarray:
    return np.arange(2 ** formats.get(fmt).bits, dtype=np.uint8)


def _values(fmt: str) -> jax.Array:
    """Every code of ``fmt`` as an array of its dtype."""
    return from_codes(jnp.asarray(_codes(fmt)), fmt)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


@pytest.mark.parametrize("to", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ALL)
def test_xla_convert_gives_the_reference_bits_for_every_code(fmt, to):
    want = reference.decode(
        _codes(fmt), fmt, to=np.float32 if to == "float32" else ml_dtypes.bfloat16
    )
    got = np.asarray(xla_convert(_values(fmt), fmt, to))
    assert got.dtype == np.dtype(to)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_xla_convert_takes_8_bit_codes():
    got = np.asarray(
        xla_convert(jnp.asarray(np.array([0x7D, 0xFD, 0x01], np.uint8)), "float8_e5m2", "float32")
    )
    assert [hex(b) for b in _bits(got)] == ["0x7fc00000", "0xffc00000", "0x37800000"]


def _converts(target: str, fmt: str, platform: str) -> set[tuple[str, str]]:
    """The (from, to) element types of every convert in emulate's fast program for
    ``bf16 x fmt`` planned for ``target`` and lowered for ``platform``."""
    x = jnp.ones((8, 16), jnp.bfloat16)
    w = jnp.zeros((16, 4), formats.get(fmt).dtype)

    def f(x, w):
        return emulate.dot_general(x, w, DN, preferred_element_type=jnp.float32, target=target)

    text = jax.jit(f).trace(x, w).lower(lowering_platforms=(platform,)).as_text()
    found = re.findall(
        r"stablehlo\.convert[^\n]*: \(tensor<[0-9x]*(\w+)>\) -> tensor<[0-9x]*(\w+)>", text
    )
    return set(found)


MLIR = {
    "float8_e4m3fn": "f8E4M3FN",
    "float8_e5m2": "f8E5M2",
    "float4_e2m1fn": "f4E2M1FN",
    "int8": "i8",
    "int4": "i4",
}


@pytest.mark.parametrize("fmt", ALL)
def test_the_convert_route_is_taken_where_listed_and_lowered_for_a_tpu(fmt):
    cvt = (MLIR[fmt], "f32")
    for target in ("tpu_v2", "tpu_v3", "tpu_v4"):
        assert (cvt in _converts(target, fmt, "tpu")) == (fmt in XLA_CONVERTS.get(target, ())), (
            target
        )
    assert cvt not in _converts("tpu_v2", fmt, "cpu")  # the CPU's convert proves nothing


# ---------------------------------------------------------------------------------------
# The TPU compiler's lowering of the convert, read from its LLO

_CHILD = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp
    from emulate import compiler
    for name in sys.argv[2:]:
        spec = jax.ShapeDtypeStruct((512, 512), jnp.dtype(name))
        compiler.compile(lambda w: w.astype(jnp.float32), spec, target=sys.argv[1])
    """
)
REPO = pathlib.Path(__file__).resolve().parents[2]

_OPS = {
    "vshrl.u32": lambda a, b: a >> (b & 31),
    "vshll.u32": lambda a, b: a << (b & 31),
    "vand.u32": lambda a, b: a & b,
    "vor.u32": lambda a, b: a | b,
    "vadd.s32": lambda a, b: a + b,
    "vadd.f32": lambda a, b: _f32(a, b, np.add),
    "vmul.f32": lambda a, b: _f32(a, b, np.multiply),
}
_CMP = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _f32(a: np.ndarray, b: np.ndarray, op) -> np.ndarray:
    x, y = (np.asarray(v, np.uint32).view(np.float32) for v in (a, b))
    r = op(x, y)
    tiny = np.finfo(np.float32).tiny
    for v in (x, y, r):  # a TPU flushes denormals: the lowering must not produce or read any
        assert not np.any((v != 0) & (np.abs(v) < tiny)), (
            "a denormal in the convert's f32 arithmetic"
        )
    return r.view(np.uint32)


def _literal(tok: str) -> np.uint32:
    if re.fullmatch(r"-?\d+", tok):
        return np.uint32(int(tok) & 0xFFFFFFFF)
    return np.float32(float(tok)).view(np.uint32)


def _interpret(block: list[str], word: np.ndarray) -> np.ndarray:
    """Run the vector ops of the decomposed convert on ``word`` (the code in the low bits of
    the loaded 32-bit word; lane 0, so the per-lane byte shift is 0)."""
    env: dict[str, np.ndarray] = {}
    last = None
    for line in block:
        line = re.sub(r"/\*.*?\*/", "", line)
        m = re.fullmatch(r"\s*(%\w+) = ([\w.]+)\s*(.*)", line)
        assert m, f"unparsed LLO line: {line!r}"
        name, op, rest = m.groups()
        args = [
            env.get(a, word) if a.startswith("%") else _literal(a)
            for a in (t.strip() for t in rest.split(","))
            if a
        ]
        if op == "vlaneseq":
            val = np.zeros_like(word)
        elif op == "vsel":
            val = np.where(args[0], args[1], args[2]).astype(np.uint32)
        elif op.startswith("vcmp."):
            _, how, kind, _ = op.split(".")
            a, b = (np.asarray(v, np.uint32) for v in args)
            a, b = (
                (a.view(np.float32), b.view(np.float32))
                if kind == "f32"
                else (a.view(np.int32), b.view(np.int32))
            )
            val = _CMP[how](a, b)
        else:
            key = ".".join(op.split(".")[:2])
            assert key in _OPS, f"an LLO op this test does not model: {op} (re-read the lowering)"
            val = np.asarray(_OPS[key](*(np.asarray(a, np.uint32) for a in args)), np.uint32)
        env[name] = val
        last = val
    assert last is not None
    return last


def _decomposed_convert(text: str) -> list[str]:
    """The first run of the decomposer's expansion (indented deeper than the code around
    it) of the pseudo op the convert lowers to."""
    lines = text.splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith(" " * 10 + "%"))
    block = []
    for s in lines[start:]:
        if not s.startswith(" " * 10 + "%"):
            break
        block.append(s)
    return block


LLO_TARGETS = ("tpu_v2",)


@pytest.fixture(scope="module")
def llo(tmp_path_factory) -> dict[tuple[str, str], str]:
    """(target, format) -> the LLO of the f32 convert after libtpu's decomposer pass."""
    out = {}
    for target in LLO_TARGETS:
        d = tmp_path_factory.mktemp(f"llo_{target}")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env["LIBTPU_INIT_ARGS"] = (
            f"--xla_jf_dump_to={d} --xla_jf_dump_llo_text=true "
            "--xla_jf_dump_llo_pass_label_regex=post-decomposer"
        )
        names = sorted(f for f in XLA_CONVERTS[target] if formats.get(f).is_float)
        subprocess.run(
            [sys.executable, "-c", _CHILD, target, *names],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        for p in pathlib.Path(d).glob("*convert_element_type*post-decomposer*"):
            text = p.read_text()
            shape = re.search(r"inlined_call_operand\.hbm \[shape: (\w+)\[", text)
            assert shape
            out[target, shape.group(1)] = text
    return out


HLO = {"float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2", "float4_e2m1fn": "f4e2m1fn"}


@pytest.mark.parametrize(
    "target, fmt", [(t, f) for t in LLO_TARGETS for f in sorted(XLA_CONVERTS[t]) if f in HLO]
)
def test_the_tpu_lowering_of_the_convert_is_exact_for_every_code(llo, target, fmt):
    f = formats.get(fmt)
    block = _decomposed_convert(llo[target, HLO[fmt]])
    got = _interpret(block, _codes(fmt).astype(np.uint32))
    if f.high_nans > 1:  # what xla_convert does after the convert
        nan = got.view(np.float32) != got.view(np.float32)
        got = np.where(nan, (got & np.uint32(0x80000000)) | np.uint32(0x7FC00000), got)
    want = reference.decode(_codes(fmt), fmt, to=np.float32).view(np.uint32)
    np.testing.assert_array_equal(got, want)
    assert not np.any(got & 0xFFFF), "a value bf16 cannot hold: packing to bf16 would round"
