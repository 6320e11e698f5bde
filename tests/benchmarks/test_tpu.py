"""benchmarks.tpu measures what it says: the real TPU compiler's figures, put together
as documented (libtpu, a declared test dependency, compiles; nothing runs).

One tiny shape on one generation, four contenders of one packed pair: the rows carry
every field, the figures obey facts that hold for any compiler (a dot reads its operands;
arguments are the operands' bytes as stored), and the ratios and goals are the stated
quotients of those figures (the Pallas traffic count itself: test_pallas_traffic.py).
"""

from __future__ import annotations

import pytest

import emulate.pallas
from benchmarks import tpu, tpu_goals
from benchmarks.cases import PAIRS
from benchmarks.contenders import QARRAY_GROUP, tpu_programs

GEN = "tpu_v5e"
M, K, N = 16, 512, 256
CONTENDERS = ("floor", "xla", "fast", "pallas")
FIELDS = (
    "bytes_accessed",
    "flops",
    "estimate_s",
    "temp_bytes",
    "argument_bytes",
    "output_bytes",
    "stored_bytes",
    "bytes",
    "bytes_over_stored",
    "temp_over_decoded_weight",
    "compile_s",
)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    measured = tpu.measure(GEN, (M, K, N), ["int4"], CONTENDERS, {})
    tpu.add_ratios(measured)
    return {r["contender"]: r for r in measured}


def test_every_contender_compiles_with_every_field(rows):
    assert sorted(rows) == sorted(CONTENDERS)
    for key, r in rows.items():
        assert r["status"] == "ok", (key, r["reason"])
        assert (r["generation"], r["pair"], r["M"], r["K"], r["N"]) == (GEN, "int4", M, K, N)
        for field in FIELDS:
            assert field in r, (key, field)
    for key in ("floor", "xla", "fast"):
        assert rows[key]["estimate_s"] > 0
        assert rows[key]["custom_calls"] == 0
    # The Pallas kernel is a custom call: no estimate, its traffic counted from blocks.
    assert rows["pallas"]["custom_calls"] == 1
    assert rows["pallas"]["estimate_s"] is None
    assert rows["pallas"]["kernel"]["calls"] == 1


def test_figures_obey_what_any_compiled_dot_does(rows):
    floor = rows["floor"]
    # bf16 x bf16 arguments and an f32 result, as stored.
    assert floor["argument_bytes"] == 2 * M * K + 2 * K * N
    assert floor["output_bytes"] == 4 * M * N
    assert floor["bytes_accessed"] >= floor["argument_bytes"]
    # The packed int4 weight travels as K*N/2 bytes beside the bf16 activations.
    for key in ("fast", "pallas"):
        assert rows[key]["argument_bytes"] == 2 * M * K + K * N // 2
        assert rows[key]["stored_bytes"] == rows[key]["argument_bytes"] + 4 * M * N
    kernel = rows["pallas"]["kernel"]
    assert kernel["read"] >= K * N // 2  # every weight byte at least once
    assert kernel["written"] >= 4 * M * N  # every result element at least once
    assert kernel["bytes"] == kernel["read"] + kernel["written"]


def test_ratios_are_the_quotients_of_the_figures(rows):
    floor = rows["floor"]
    for r in rows.values():
        assert r["bytes_over_stored"] == r["bytes"] / r["stored_bytes"]
        assert r["temp_over_decoded_weight"] == r["temp_bytes"] / (2 * K * N)
        assert r["bytes_ratio"] == r["bytes"] / floor["bytes"]
    for key in ("xla", "fast"):
        r = rows[key]
        assert r["estimate_ratio"] == r["estimate_s"] / floor["estimate_s"]
        assert r["estimate_over_xla"] == r["estimate_s"] / rows["xla"]["estimate_s"]
    assert rows["pallas"]["estimate_ratio"] is None
    # the kernel's blocks plus whatever the compiler counts around it (nothing here)
    assert rows["pallas"]["bytes"] == (
        rows["pallas"]["kernel"]["bytes"] + (rows["pallas"]["bytes_accessed"] or 0)
    )


def test_the_kernel_moves_each_operand_once(rows):
    # Issue 27: x (16 x 512 bf16) once, the K-planar int4 weight (K*N/2 bytes) once, the
    # f32 result once, nothing copied or kept around the kernel.
    r = rows["pallas"]
    assert r["kernel"]["read"] == 2 * M * K + K * N // 2
    assert r["kernel"]["written"] == 4 * M * N
    assert r["bytes_over_stored"] == 1.0
    assert r["temp_outside_kernel"] == 0
    goals = {g["key"]: g for g in tpu_goals.pallas_goals(list(rows.values()))}
    assert goals["bytes_over_stored"]["limit"] == tpu_goals.KERNEL_TRAFFIC_LIMIT == 1.1
    assert (goals["bytes_over_stored"]["measured"], goals["bytes_over_stored"]["met"]) == (
        1.0,
        True,
    )
    assert (goals["temp_outside_kernel"]["measured"], goals["temp_outside_kernel"]["met"]) == (
        0,
        True,
    )


def test_goals_are_read_from_the_fast_rows(rows):
    goals = {g["key"]: g for g in tpu_goals.goals(list(rows.values()))}
    fast = rows["fast"]
    for key, limit in (
        ("temp_over_decoded_weight", tpu_goals.TEMP_LIMIT),
        ("bytes_over_stored", tpu_goals.BYTES_LIMIT),
        ("estimate_over_xla", tpu_goals.ESTIMATE_LIMIT),
    ):
        g = goals[key]
        assert (g["generation"], g["measured"], g["limit"]) == (GEN, fast[key], limit)
        assert g["met"] == (fast[key] <= limit)
        assert g["failing"] == ([] if g["met"] else [f"int4 {M}x{K}x{N}"])


def test_a_refused_case_gets_its_status_and_first_line():
    # emulate's own refusal (a TPU kernel asked for a CPU target) is "n/a" with the first
    # line of its message, and no figures.
    specs = tpu_programs(PAIRS["int8"], (16, 256, 128), GEN)["pallas"][1]

    def wrong(x, w):
        return emulate.pallas.matmul(x, w, target="cpu", interpret=False)

    row = tpu.measure_one(PAIRS["int8"], (16, 256, 128), GEN, "pallas", wrong, specs)
    assert row["status"] == "n/a"
    assert row["reason"].startswith("target: emulate.pallas.matmul is a TPU kernel")
    assert "bytes" not in row


def test_exact_goals_divide_by_fast_and_name_unestimated_programs():
    base = {"generation": GEN, "status": "ok", "M": 4, "K": 8, "N": 8, "temp_bytes": 64}
    rows = [
        {**base, "pair": "int8", "contender": "fast", "estimate_s": 2.0},
        {**base, "pair": "int8", "contender": "exact", "estimate_s": 30.0},
        {**base, "pair": "int4", "contender": "fast", "estimate_s": 1.0},
        {**base, "pair": "int4", "contender": "exact", "estimate_s": None},
    ]
    for r in rows:
        r["temp_over_decoded_weight"] = r["temp_bytes"] / (2 * 8 * 8)
    tpu.add_ratios(rows)
    assert rows[1]["estimate_over_fast"] == 15.0 and rows[3]["estimate_over_fast"] is None
    est, temp = tpu_goals.exact_goals(rows)
    assert (est["key"], est["limit"], est["measured"], est["met"]) == (
        "estimate_over_fast",
        tpu_goals.EXACT_LIMIT,
        15.0,
        False,
    )
    assert est["failing"] == ["int8 4x8x8"] and est["unestimated"] == ["int4 4x8x8"]
    assert (temp["measured"], temp["met"], temp["unestimated"]) == (0.5, True, [])


def test_the_qarray_kernel_moves_each_operand_and_the_scales_once():
    # (g): the K-planar int4 codes (K*N/2 bytes) and the float16 scales held as uint16 bits
    # (one per 128 rows and column: 2 * K/128 * N bytes) once, x once, the f32 result once.
    [r] = tpu.measure(GEN, (M, K, N), ["int4"], ["pallas_q"], {})
    tpu.add_ratios([r])
    assert r["status"] == "ok", r["reason"]
    scales = 2 * (K // QARRAY_GROUP) * N
    assert r["argument_bytes"] == 2 * M * K + K * N // 2 + scales
    assert r["kernel"]["read"] == 2 * M * K + K * N // 2 + scales
    assert r["kernel"]["written"] == 4 * M * N
    assert (r["bytes_over_stored"], r["temp_outside_kernel"]) == (1.0, 0)
    goals = [g for g in tpu_goals.pallas_goals([r]) if g["goal"].startswith("pallas.matmul QArray")]
    assert [(g["key"], g["measured"], g["met"]) for g in goals] == [
        ("bytes_over_stored", 1.0, True),
        ("temp_outside_kernel", 0, True),
    ]
