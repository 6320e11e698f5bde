"""Regression check for :meth:`emulate.planning.plan.Plan.explain`: the same text for
every plan after explain was split into one helper per section (issue 23).

The expected texts and digests were computed by ``Plan.explain`` itself at commit
76a0351, before the split. That is allowed here only because this check guards a pure
refactor: it pins today's wording, right or wrong; what a plan decides is tested in
test_plan.py. The digests cover every operand pair of ``formats.MATMUL_OPERANDS`` on every
target in mode "fast" (result types: lax's default, float32, bfloat16, int32) and the
same-type and bfloat16 pairs in mode "exact" on three targets (exact plans take about
20 ms each); plans that raise are left out (their messages are another rule's).
At the split, every pair of every target in both modes with four result types (23,505
plans) was compared whole, once, and gave the same text.
"""

from __future__ import annotations

import hashlib

import pytest

from emulate import formats, targets
from emulate.planning.plan import plan

OPERANDS = formats.MATMUL_OPERANDS

#: sha256 (first 16 hex digits) of the joined explain texts, per (target, mode).
DIGESTS = {
    ("tpu_v2", "fast"): "d4e178c033e91f62",
    ("tpu_v3", "fast"): "b9fe32287fcdd788",
    ("tpu_v4", "fast"): "7e792697059d3f45",
    ("tpu_v4i", "fast"): "9d7571358c9370e6",
    ("tpu_v5e", "fast"): "b720f2cf806f8f04",
    ("tpu_v5p", "fast"): "af4fd6905e2c3a5c",
    ("tpu_v6e", "fast"): "199c720b09ec609d",
    ("tpu_v7", "fast"): "854262b09f4e6c77",
    ("tpu_v7x", "fast"): "4c17714858124bcc",
    ("tpu_v8i", "fast"): "b830cd8d4ee9c487",
    ("cpu", "fast"): "9c5148a41a84c6f1",
    ("gpu_sm80", "fast"): "eeb32149bcfa04e9",
    ("gpu_sm89", "fast"): "1b19bcd76eaa5e4a",
    ("gpu_sm90", "fast"): "545c32ca1d82cb9e",
    ("gpu_sm100", "fast"): "fd87debe0b7e2c81",
    ("cpu", "exact"): "520be089ecde1439",
    ("tpu_v4", "exact"): "82735023bf36860b",
    ("tpu_v5e", "exact"): "7b12d5e1d1d55837",
}

#: Whole texts for plans that reach the int8 scaling, per-row slicing and fallback
#: sections.
TEXTS = [
    (
        ("float4_e2m1fn", "float4_e2m1fn", "tpu_v5e", "fast", None),
        """\
float4_e2m1fn x float4_e2m1fn -> float4_e2m1fn on tpu_v5e (mode 'fast')
  method: decode to int8 (exact power-of-two scaling), int32 accumulation
  matrix unit sees: int8 x int8, accumulating in int32
  scaling: lhs x 2^1, rhs x 2^1 makes every value an integer; the sum is scaled back by 2^-2
  K-chunk: 14913080, the longest contraction whose partial sums stay
    exact in int32; chunk sums are combined exactly in int32
    limbs, for K up to 7635497415
  numerics: exact; the result is the exact sum rounded once
  result: rounded once from int32 into float4_e2m1fn
  candidates (rate in ops/s):
     native          -  float4_e2m1fn takes the exact integer route
   * int8     3.94e+14  ok
     bf16     1.97e+14  ok
     f32      3.28e+13  ok""",
    ),
    (
        ("bfloat16", "float8_e4m3fn", "tpu_v4", "exact", "float32"),
        """\
bfloat16 x float8_e4m3fn -> float32 on tpu_v4 (mode 'exact')
  method: exponent slices decoded to bfloat16, f32 accumulation, exact combination
  matrix unit sees: bfloat16 x bfloat16, accumulating in float32
  exponent slicing: lhs 4 slices of 8 exponents, rhs 3 of 7-bit digits: 12 passes, each chunk of
    1028 exact; all sums added exactly in 16-bit limbs
  lhs bfloat16 is sliced per row: 4 slices of 8 bits below each row's largest
    exponent (32 bits); where smaller elements have bits below those, further blocks
    of 4 slices (each 12 more passes) run until none remain
  numerics: exact; the result is the exact sum rounded once
  result: the exact sum (16-bit limbs) rounded once into float32
  candidates (rate in ops/s):
     sliced-int8          -  tpu_v4 has no int8 x int8 unit
   * sliced-bf16   1.38e+14  ok
     sliced-f32   2.29e+13  ok""",
    ),
    (
        ("int4", "int4", "tpu_v5e", "fast", None),
        """\
int4 x int4 -> int4 on tpu_v5e (mode 'fast')
  method: native: the operands go to the matrix unit as they are
  matrix unit sees: int4 x int4, accumulating in int32
  numerics: exact; the int32 sum wraps into int4 as XLA's integer dots do
  off tpu: the host cannot compile int4 x int4, so the program lowered elsewhere takes the int8 route
  candidates (rate in ops/s):
   * native   7.88e+14  ok
     int8     3.94e+14  ok
     bf16     1.97e+14  ok
     f32      3.28e+13  ok""",  # noqa: E501
    ),
]


def _texts(target: str, mode: str):
    if mode == "fast":
        pairs = [(a, b) for a in OPERANDS for b in OPERANDS]
        results: tuple[str | None, ...] = (None, "float32", "bfloat16", "int32")
    else:
        wide = [(f, "bfloat16") for f in OPERANDS if f != "bfloat16"]
        pairs = [(f, f) for f in OPERANDS] + [(b, a) for a, b in wide] + wide
        results = (None,)
    for a, b in pairs:
        for pet in results:
            try:
                p = plan(a, b, target=target, mode=mode, preferred_element_type=pet)
            except (TypeError, ValueError, NotImplementedError):
                continue
            yield f"=== {a} x {b} -> {pet}\n{p.explain()}\n"


def test_the_digests_cover_every_target_in_mode_fast() -> None:
    assert sorted(t for t, m in DIGESTS if m == "fast") == sorted(targets.names())


@pytest.mark.parametrize("target,mode", sorted(DIGESTS))
def test_explain_text_is_unchanged(target: str, mode: str) -> None:
    text = "".join(_texts(target, mode))
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == DIGESTS[target, mode]


@pytest.mark.parametrize("case,text", TEXTS, ids=lambda c: str(c))
def test_explain_text_in_full(case, text: str) -> None:
    lhs, rhs, target, mode, pet = case
    assert plan(lhs, rhs, target=target, mode=mode, preferred_element_type=pet).explain() == text
