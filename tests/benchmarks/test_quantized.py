"""benchmarks.quantized: the weights are the schemes they are named after, kept as stored
(their bytes by arithmetic), the compiler's figures are read and divided as documented,
and the offset term and the goals are the stated quotients. Shapes are tiny; no timing
is asserted."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import quantized as bq
from emulate.codebooks import NF4
from emulate.numerics.storage import Packed

K, N = 256, 128  # one Q4_K super-block per row; two AWQ groups; four NF4 blocks


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(1)
    return {name: s.build(K, N, rng) for name, s in bq.SCHEMES.items()}


def test_each_weight_is_its_scheme_as_stored(weights):
    q4k = weights["q4_k"]
    assert q4k.shape == (N, K) and q4k.block_shape == (1, 32)
    assert isinstance(q4k.codes, Packed) and q4k.codes.format_name == "uint4"
    assert q4k.scales.format_name == "uint6" and q4k.offsets.format_name == "uint6"
    # GGUF Q4_K: 144 bytes per 256 elements, 4.5 bits; the QArray holds exactly that
    assert q4k.nbytes == N * K // 256 * 144
    # the other K-quants: codes packed at their width, the bytes of ggml's blocks
    for name, fmt, size in (("q6_k", "uint6", 210), ("q5_k", "uint5", 176),
                            ("q3_k", "uint3", 110), ("q2_k", "uint2", 84)):  # fmt: skip
        q = weights[name]
        assert q.shape == (N, K) and isinstance(q.codes, Packed)
        assert q.codes.format_name == fmt and q.nbytes == N * K // 256 * size
    awq = weights["awq_g128"]
    assert awq.shape == (K, N) and awq.block_shape == (128, 1)
    assert awq.scale_format == "float16" and awq.zero_points.format_name == "uint4"
    # codes 4 bits, f16 scales and 4-bit zero points per 128 elements
    assert awq.nbytes == K * N // 2 + (K // 128) * N * 2 + (K // 128) * N // 2
    nf4 = weights["nf4_b64"]
    # the table as bitsandbytes stores it (quant_map), so named "table" by the importer
    assert nf4.block_shape == (64, 1) and nf4.codebook.values == NF4.values
    assert nf4.nbytes == K * N // 2 + (K // 64) * N * 4 + 16 * 4
    dq = weights["nf4_dq"]  # bitsandbytes' double quantization: 4 groups of 64 rows, so
    # nested blocks (4, 64) of the (4, N) absmax grid: 256 codes each, as bnb flattens them
    assert dq.block_shape == (64, 1) and dq.scales.block_shape == (4, 64)
    assert dq.scales.format_name == "uint8" and len(dq.scales.codebook) == 256
    # codes, one absmax byte per 64, an f32 per 256 absmax, the two tables (256 + 16 f32)
    assert dq.nbytes == K * N // 2 + (K // 64) * N + (K // 64) * N // 256 * 4 + 272 * 4
    nvfp4 = weights["nvfp4"]  # 4-bit codes, one e4m3 byte per 16, the f32 tensor scale
    assert nvfp4.block_shape == (16, 1) and nvfp4.scale_format == "float8_e4m3fn"
    assert nvfp4.nbytes == K * N // 2 + (K // 16) * N + 4
    fp8 = weights["fp8_block128"]  # one e4m3fn byte an element, an f32 per 128 x 128
    assert fp8.block_shape == (128, 128) and fp8.format_name == "float8_e4m3fn"
    assert fp8.scale_format == "float32" and fp8.nbytes == K * N + (K // 128) * (N // 128) * 4


def test_the_variants_lose_only_their_offset_term(weights):
    a, b = weights["q4_k"], weights["q4_k_no_mins"]
    assert b.offsets is None and a.offsets is not None
    assert a.nbytes - b.nbytes == a.offsets.nbytes
    a, b = weights["awq_g128"], weights["awq_g128_no_zeros"]
    assert b.zero_points is None and a.zero_points is not None
    assert a.nbytes - b.nbytes == (K // 128) * N // 2
    assert bq.SCHEMES["q4_k_no_mins"].base_of == "q4_k"
    assert bq.SCHEMES["awq_g128_no_zeros"].base_of == "awq_g128"
    assert bq.weight_shape(bq.SCHEMES["q4_k"], K, N) == (N, K)
    assert bq.weight_shape(bq.SCHEMES["nf4_b64"], K, N) == (K, N)


def test_stored_bytes_are_weight_activations_and_result(weights):
    q = weights["awq_g128"]
    assert bq.stored_bytes(q, 3, K, N) == q.nbytes + 2 * 3 * K + 4 * 3 * N


@pytest.fixture(scope="module")
def tpu_rows():
    rows = bq.tpu_rows(
        "tpu_v5e", (8, K, N), ["awq_g128", "awq_g128_no_zeros"], contenders=("floor", "emulate")
    )
    bq.add_ratios(rows)
    return rows


def test_compiled_rows_hold_the_compilers_figures(tpu_rows, weights):
    assert [(r["pair"], r["contender"]) for r in tpu_rows] == [
        (s, c) for s in ("awq_g128", "awq_g128_no_zeros") for c in ("floor", "emulate")
    ]
    for r in tpu_rows:
        assert r["status"] == "ok", r["reason"]
        q = weights[r["pair"]]
        assert r["stored_bytes"] == q.nbytes + 2 * 8 * K + 4 * 8 * N
        assert r["output_bytes"] == 4 * 8 * N
        # every program takes the activations and its weight as passed (XLA:TPU pads
        # small arrays to its tiles, so at least their bytes)
        weight = 2 * K * N if r["contender"] == "floor" else q.nbytes
        assert r["argument_bytes"] >= 2 * 8 * K + weight
        assert r["bytes_accessed"] >= 2 * 8 * K + weight
        assert r["temp_over_decoded_weight"] == r["temp_bytes"] / (2 * K * N)
        assert r["bytes_over_stored"] == r["bytes_accessed"] / r["stored_bytes"]
    floor = tpu_rows[0]
    for r in tpu_rows:
        if r["estimate_s"] is not None:
            assert r["over_floor"] == r["estimate_s"] / floor["estimate_s"]
            assert r["bytes_over_floor"] == r["bytes_accessed"] / floor["bytes_accessed"]


def test_offset_cost_is_with_over_without(tpu_rows):
    (o,) = bq.offset_costs(tpu_rows)
    by = {(r["pair"], r["contender"]): r for r in tpu_rows}
    w, wo = by[("awq_g128", "emulate")], by[("awq_g128_no_zeros", "emulate")]
    assert (o["platform"], o["pair"], o["without"]) == ("tpu_v5e", "awq_g128", "awq_g128_no_zeros")
    assert o["offset_bytes"] == w["bytes_accessed"] / wo["bytes_accessed"]
    if w["estimate_s"] is not None and wo["estimate_s"] is not None:
        assert o["offset_cost"] == w["estimate_s"] / wo["estimate_s"]


def test_the_pallas_rows_count_the_kernels_traffic(weights):
    rows = bq.tpu_rows("tpu_v5e", (8, K, N), ["awq_g128", "nf4_b64"], contenders=("pallas",))
    awq, nf4 = rows
    assert awq["status"] == "ok", awq["reason"]
    # the kernel is a custom call: its traffic (block copies) is counted, no estimate;
    # it reads the prepared weight (the same bytes as stored) and x once, writes the result
    assert awq["estimate_s"] is None
    assert awq["bytes_accessed"] == awq["kernel_bytes"] + (awq["bytes_outside_kernel"] or 0)
    assert (
        awq["bytes_accessed"]
        >= awq["stored_bytes"]
        == weights["awq_g128"].nbytes + (2 * 8 * K + 4 * 8 * N)
    )
    # NF4 prepared once; the kernel's blocks at (8, 256, 128) are one grid step, so it
    # reads the codes (4 bits), the f32 absmax and x once and writes the result once (the
    # static table is no kernel operand)
    assert nf4["status"] == "ok", nf4["reason"]
    assert nf4["kernel_bytes"] == K * N // 2 + (K // 64) * N * 4 + 2 * 8 * K + 4 * 8 * N
    assert nf4["temp_bytes"] == 0


def _row(platform, pair, contender, **figures):
    row = {"platform": platform, "pair": pair, "contender": contender, "M": 1, "K": 4, "N": 2}
    return {**row, "status": "ok", "stored_bytes": 100, **figures}


def test_ratios_offsets_and_goals_on_given_figures():
    rows = [
        _row("cpu", "awq_g128", "floor", median_s=2.0),
        _row("cpu", "awq_g128", "dequantize", median_s=4.0),
        _row("cpu", "awq_g128", "emulate", median_s=3.0),
        _row("cpu", "awq_g128_no_zeros", "emulate", median_s=2.5),
        _row("tpu_v5e", "awq_g128", "emulate", estimate_s=1.2, bytes_accessed=130.0),
        _row("tpu_v5e", "awq_g128_no_zeros", "emulate", estimate_s=1.0, bytes_accessed=100.0),
    ]
    for r in rows[4:]:
        r.update(temp_bytes=5)
        bq.add_derived(r)
    bq.add_ratios(rows)
    assert rows[2]["over_floor"] == 1.5 and rows[2]["over_dequantize"] == 0.75
    assert rows[3]["over_floor"] is None  # no (a) for that scheme
    offsets = bq.offset_costs(rows)
    assert [(o["platform"], o["offset_cost"]) for o in offsets] == [
        ("cpu", 3.0 / 2.5),
        ("tpu_v5e", 1.2),
    ]
    assert offsets[1]["offset_bytes"] == 1.3
    goals = {g["key"]: g for g in bq.goals(rows, offsets)}
    assert goals["offset_cost"]["generation"] == "tpu_v5e"
    assert goals["offset_cost"]["measured"] == 1.2 and goals["offset_cost"]["met"] is False
    assert goals["offset_cost"]["failing"] == ["awq_g128 1x4x2"]
    assert goals["offset_bytes"]["measured"] == 1.3 and goals["offset_bytes"]["met"] is False
    assert goals["temp_over_decoded_weight"]["measured"] == 5 / (2 * 4 * 2)
    assert goals["temp_over_decoded_weight"]["met"] is False
    assert goals["bytes_over_stored"]["measured"] == 1.3
    text = bq.markdown(
        {
            "command": "python -m benchmarks.quantized",
            "environment": {"time": "t", "jax": "j", "cpu_count": 2, "load_average": None},
            "libtpu": "l",
            "wall_s": 1.0,
            "results": rows,
            "offsets": offsets,
            "goals": bq.goals(rows, offsets),
        }
    )
    assert "| tpu_v5e | AWQ int4 g128 (zero points) | (c) emulate | 1x4x2 | 1.20 | 1.30 |" in text
    assert (
        "| tpu_v5e | offset term: (c) with / without, estimate | 1.1 | 1.2 | awq_g128 1x4x2 | no |"
        in text
    )


def test_cpu_rows_time_every_contender():
    rows = bq.cpu_rows((2, K, N), ["nf4_b64"], repeats=1)
    assert [(r["pair"], r["contender"], r["status"]) for r in rows] == [
        ("nf4_b64", c, "ok") for c in bq.CPU_CONTENDERS
    ]
    for r in rows:
        assert r["min_s"] <= r["median_s"] <= r["max_s"]


def test_bad_flags_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as e:
        bq.main(["--schemes", "q4_k,bogus", "--no-json"])
    assert e.value.code == 2
    assert "--schemes: unknown bogus; choose from q4_k, q4_k_no_mins," in capsys.readouterr().err
