"""benchmarks.qcpu: one group of cases per shape (the bf16 and f32 floors, each scheme's
dequantize-then-dot, emulate, its M = 1 call and XLA's route, the read of the stored
bytes), the goals read from the stated quotients, and benchmarks.qweights' extra schemes
built as the importers build them. Shapes are tiny; no timing is asserted."""

from __future__ import annotations

import numpy as np

from benchmarks import qcpu
from benchmarks.qweights import CPU_SCHEMES, SCHEMES

K, N = 256, 128


def test_every_base_scheme_and_the_extra_conventions_are_timed() -> None:
    base = {n for n, s in SCHEMES.items() if s.base_of is None}
    extra = {"q4_0", "q8_0", "iq4_xs", "mxfp4", "gptq_act", "ct_int4"}
    assert base | extra == set(CPU_SCHEMES)
    g = CPU_SCHEMES["gptq_act"].build(K, N, np.random.default_rng(0))
    assert g.perm is not None and g.perm_axis == -2 and sorted(np.asarray(g.perm)) == list(range(K))
    q = CPU_SCHEMES["q4_0"].build(K, N, np.random.default_rng(0))
    assert q.shape == (N, K) and q.block_shape == (1, 32) and q.nbytes == N * K // 32 * 18
    c = CPU_SCHEMES["ct_int4"].build(K, N, np.random.default_rng(0))
    # compressed-tensors W4A16: uint4 codes meaning u - 8, a bf16 scale per 128 along K
    assert (c.shape, c.block_shape, c.format_name, c.zero_points) == ((K, N), (128, 1), "uint4", 8)
    assert c.scale_format == "bfloat16" and c.nbytes == K * N // 2 + K // 128 * N * 2


def test_one_group_per_shape_with_both_floors_and_the_read() -> None:
    cases, stored = qcpu.group_cases((2, K, N), ["awq_g128", "q4_0"])
    labels = [c.label for c in cases]
    assert labels == [
        "floor kn",
        "floor nk",
        "f32 kn",
        "f32 nk",
        "awq_g128 dequantize",
        "awq_g128 emulate",
        "awq_g128 emulate_m1",
        "awq_g128 xla",
        "q4_0 dequantize",
        "q4_0 emulate",
        "q4_0 emulate_m1",
        "q4_0 xla",
        "read sum",
    ]
    # the M = 1 call beside the kernel's only where M is 2 to MAX_ROWS
    wide, _ = qcpu.group_cases((64, K, N), ["q4_0"])
    assert [c.label for c in wide][4:] == [
        "q4_0 dequantize",
        "q4_0 emulate",
        "q4_0 xla",
        "read sum",
    ]
    assert stored["q4_0"] == N * K // 32 * 18
    (words,) = cases[-1].args
    assert words.size == -(-max(stored.values()) // 8)
    assert qcpu.read_bytes(words[:1000]) == 1000  # np.ones: every word read once
    y = np.asarray(cases[5].fn(*cases[5].args))
    assert y.shape == (2, N) and y.dtype == np.float32
    m1 = cases[6]
    assert m1.args[0].shape == (1, K)


def test_goals_are_the_worst_quotients() -> None:
    def row(pair, m, n, emu, f32=None, read=None, m1=None):
        return {
            "pair": pair,
            "M": m,
            "K": K,
            "N": n,
            "emulate_over_f32": None if f32 is None else emu / f32,
            "emulate_over_read": None if read is None else emu / read,
            "emulate_over_m1": None if m1 is None else emu / m1,
        }

    rows = [
        row("a", 64, 4096, 2.5, f32=2.0),
        row("b", 512, 4096, 2.2, f32=2.0),
        row("a", 1, 4096, 3.0, read=1.0),
        row("b", 1, 14336, 3.0, read=2.0),
        row("a", 16, 4096, 2.6, m1=2.0),
    ]
    small, large, few, wide = qcpu.goals(rows)
    assert (small["measured"], small["met"], small["worst"]) == (3.0, True, f"a 1x{K}x4096")
    assert (large["measured"], large["met"]) == (1.5, True)
    assert (few["measured"], few["met"], few["failing"]) == (1.3, True, [])  # at the limit
    assert (wide["measured"], wide["met"], wide["worst"]) == (1.25, False, f"a 64x{K}x4096")
    assert wide["failing"] == [f"a 64x{K}x4096"]  # 1.1 itself would meet the limit
