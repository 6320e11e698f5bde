"""benchmarks.qcpu: one group of cases per shape (both floors, each scheme's
dequantize-then-dot and emulate, the read of the stored bytes), the goals read from the
stated quotients, and benchmarks.qweights' extra schemes built as the importers build
them. Shapes are tiny; no timing is asserted."""

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
        "awq_g128 dequantize",
        "awq_g128 emulate",
        "awq_g128 xla",
        "q4_0 dequantize",
        "q4_0 emulate",
        "q4_0 xla",
        "read sum",
    ]
    # the XLA route beside the CPU kernel only where the kernel takes the call (M <= 8)
    wide, _ = qcpu.group_cases((64, K, N), ["q4_0"])
    assert [c.label for c in wide][2:] == ["q4_0 dequantize", "q4_0 emulate", "read sum"]
    assert stored["q4_0"] == N * K // 32 * 18
    (words,) = cases[-1].args
    assert words.size == -(-max(stored.values()) // 8)
    assert qcpu.read_bytes(words[:1000]) == 1000  # np.ones: every word read once
    y = np.asarray(cases[3].fn(*cases[3].args))
    assert y.shape == (2, N) and y.dtype == np.float32


def test_goals_are_the_worst_quotients() -> None:
    def row(pair, m, emu, floor, read):
        return {
            "pair": pair,
            "M": m,
            "K": K,
            "N": N,
            "emulate_over_floor": emu / floor,
            "emulate_over_read": None if read is None else emu / read,
        }

    rows = [
        row("a", 64, 2.5, 2.0, None),
        row("b", 512, 3.0, 2.0, None),
        row("a", 1, 3.0, 9.0, 2.0),
        row("b", 1, 1.0, 9.0, 2.0),
    ]
    wide, one = qcpu.goals(rows)
    assert (wide["measured"], wide["met"], wide["worst"]) == (1.5, False, f"b 512x{K}x{N}")
    assert wide["failing"] == [f"b 512x{K}x{N}"]  # 1.25 itself meets the limit
    assert (one["measured"], one["met"], one["failing"]) == (1.5, True, [])
