"""emulate.capabilities: the matrix of native and emulated pairs per target, as rows and
as text; expected cells written out by hand from the recorded probe and the profiles."""

from __future__ import annotations

import numpy as np

from emulate import capabilities, formats, targets


def test_capability_matrix_rows():
    rows = capabilities.capability_matrix()
    assert len(rows) == len(targets.names()) * len(formats.LOW_PRECISION)
    by = {(r.target, r.format): r for r in rows}
    assert by["tpu_v4", "int8"] == ("tpu_v4", "int8", "emulated", "emulated")
    assert by["tpu_v5e", "int8"] == ("tpu_v5e", "int8", "native", "emulated")
    assert by["tpu_v7x", "float8_e4m3fn"][2:] == ("native", "emulated")
    assert by["tpu_v7", "float8_e4m3fn"][2:] == ("native", "native")  # JAX's table
    assert by["gpu_sm90", "float8_e4m3fn"][2:] == ("native", "emulated")
    assert all(
        r.same_type == r.weight_only == "emulated" for r in rows if r.format == "float4_e2m1fn"
    )
    some = capabilities.capability_matrix(["v5e", targets.get("cpu")], [np.int8, "e2m1"])
    assert [(r.target, r.format) for r in some] == [
        ("tpu_v5e", "int8"),
        ("tpu_v5e", "float4_e2m1fn"),
        ("cpu", "int8"),
        ("cpu", "float4_e2m1fn"),
    ]


def test_render_matrix():
    text = capabilities.render_matrix()
    lines = text.splitlines()
    assert lines[0] == (
        "Native operand pairs (N native, e emulated); cell: fmt x fmt / bfloat16 x fmt"
    )
    header = lines[1].split()
    assert header[0] == "format"
    assert header[1:] == [
        "v2",
        "v3",
        "v4",
        "v4i",
        "v5e",
        "v5p",
        "v6e",
        "v7",
        "v7x",
        "v8i",
        "cpu",
        "sm80",
        "sm89",
        "sm90",
        "sm100",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3 : 3 + 14]}
    assert list(rows) == list(formats.LOW_PRECISION)
    col = header.index("v4") - 1
    assert rows["int8"][col] == "e/e"
    assert rows["int8"][header.index("v5e") - 1] == "N/e"
    assert lines[3 + 14 :] == [
        "",
        "real TPU compiler (libtpu 0.0.42.1, compat off): v2, v3, v4, v5e, v5p, v6e, v7x",
        "read from JAX's Pallas TPU table: v4i, v7, v8i",
        "emulate's builtin profiles: cpu, sm80, sm89, sm90, sm100",
    ]
    assert max(map(len, lines)) <= 100 and text.endswith("\n")
    small = capabilities.render_matrix(["v5e", "tpu_v5e"], ["int4", "s4"])
    assert small.splitlines()[1:] == [
        "format  v5e",
        "------  ---",
        "int4    N/e",
        "",
        "real TPU compiler (libtpu 0.0.42.1, compat off): v5e",
    ]
