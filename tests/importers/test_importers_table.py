"""``emulate.importers`` as documented: the one-call readers reachable from the package, and
docs/quantized.md's table of conventions, whose measured columns this file computes.

For every convention the table lists, a (K, N) = (4096, 256) weight is written in the
project's own layout (GGUF: one file of every type, through gguf's writer; safetensors:
one file per convention, through the builders of ``_st_cases``), read back with emulate's
importer, and measured: the file's bits an element (the bytes of the layer's tensors in
the file, times 8, over the elements), the loaded QArray's (``bits_per_element``, every
part as kept), and the route of ``bf16 activations @ weight`` on each target as
``emulate.inspect`` reports it. The doc's rows must hold these numbers; a failure prints
the rows as they should read.

Default vs long: every row's bits columns are measured by default (reading the files is
quick); the plan and kernel cells (tracing ``bf16 @ weight`` on four targets and the
kernel's route: about a second a row) are measured for :data:`ROUTED_DEFAULT`, one row of
each kind of weight the route reads (two-level scales, a codebook, zero points, an
act-order permutation, double-quantized codebook scales, 2-D blocks, a tensor scale), and
for every row under ``EMULATE_LONG_TESTS=1``; by default the other rows are checked on
their bits columns only.
"""

from __future__ import annotations

import pathlib
import re

import _st_oracles as O
import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _st_cases import AWQ_CONFIG, awq_tensors, bnb_tensors, ct_tensors, gptq_tensors, write
from _sweeps import LONG
from gguf import GGMLQuantizationType

import emulate
import emulate.pallas
from emulate.importers import gguf as G
from emulate.importers import safetensors as S
from emulate.quantized.array import transpose

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "quantized.md"
K, N = 4096, 256
TARGETS = ("cpu", "tpu_v4", "tpu_v5e", "tpu_v7x")
GGUF_TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
)


def test_the_readers_are_reachable_as_documented() -> None:
    """``emulate.importers.<name>`` for every reader docs/api.md lists, imported on first
    use (``import emulate`` alone reaches the package)."""
    assert emulate.importers.load_safetensors is S.load_safetensors
    assert emulate.importers.load_gguf is G.load_gguf
    assert emulate.importers.read_gguf is G.read_gguf
    for name in emulate.importers.__all__:
        owner = G if name in ("GGUFFile", "load_gguf", "read_gguf") else S
        assert getattr(emulate.importers, name) is getattr(owner, name)
    with pytest.raises(AttributeError, match="module 'emulate.importers' has no attribute 'x'"):
        emulate.importers.x  # noqa: B018


# ------------------------------------------------------------------------- the table
def _gguf_cases(tmp: pathlib.Path) -> dict[str, tuple[float, emulate.QArray]]:
    """Every GGUF type: (file bits an element, QArray (N, K)), from one file of random
    blocks (finite f16 scales; MXFP4 scale bytes below 255)."""
    rng = np.random.default_rng(0)
    path = str(tmp / "all.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    for t in GGUF_TYPES:
        block, size = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[t]]
        raw = rng.integers(0, 256, (N, K // block, size)).astype(np.uint8)
        if t == "MXFP4":
            raw[:, :, 0] = np.minimum(raw[:, :, 0], 254)
        else:  # every f16 field of every type is finite when its high byte is < 0x7c
            raw[:, :, 1::2] &= 0x3F
        writer.add_tensor(t, raw.reshape(N, -1), raw_dtype=GGMLQuantizationType[t])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file_bits = {
        t.name: 8 * int(t.n_bytes) / int(t.n_elements) for t in gguf.GGUFReader(path).tensors
    }
    loaded = G.load_gguf(path)
    return {f"GGUF {t}": (file_bits[t], loaded[t].T) for t in GGUF_TYPES}


def _file_bits(path: pathlib.Path) -> float:
    tensors = S.SafetensorsCheckpoint(path)
    return sum(8 * tensors[name].nbytes for name in tensors) / (K * N)


def _safetensors_cases(tmp: pathlib.Path) -> dict[str, tuple[float, emulate.QArray]]:
    """Every safetensors convention: (file bits an element, QArray (K, N))."""
    rng = np.random.default_rng(1)
    cases: dict[str, tuple[float, emulate.QArray]] = {}

    def add(name, tensors, load):
        path = write(tmp / re.sub(r"\W+", "_", name), tensors)
        q = load(path)  # (..., N, K), as every importer returns it
        cases[name] = (_file_bits(path), transpose(q, (*range(q.ndim - 2), q.ndim - 1, q.ndim - 2)))

    cfg = {**AWQ_CONFIG, "group_size": 128}
    add(
        "AutoAWQ GEMM int4 g128",
        awq_tensors(rng, K, N, 128),
        lambda p: S.load_awq(p, "l", config=cfg),
    )
    for label, v1, act in (("v1", True, False), ("v2", False, False), ("v1 act-order", True, True)):
        t = gptq_tensors(rng, K, N, 128, 4, v1, act)
        if not act:
            del t["l.g_idx"]
        fmt = "gptq" if v1 else "gptq_v2"
        gcfg = {"bits": 4, "group_size": 128, "checkpoint_format": fmt}
        add(f"GPTQ {label} int4 g128", t, lambda p, c=gcfg: S.load_gptq(p, "l", config=c))
    for label, sym in (("symmetric", True), ("asymmetric", False)):
        t = ct_tensors(rng, N, K, 4, "group", 128, sym, False)[0]
        args = {
            "num_bits": 4,
            "type": "int",
            "symmetric": sym,
            "strategy": "group",
            "group_size": 128,
        }
        add(
            f"compressed-tensors int4 g128 {label}",
            t,
            lambda p, a=args: S.load_compressed_tensors(p, "l", config=a),
        )
    blocks = rng.integers(0, 256, (N, K // 32, 16)).astype(np.uint8)
    scales = rng.integers(100, 150, (N, K // 32)).astype(np.uint8)
    add(
        "gpt-oss MXFP4",
        {"w_blocks": blocks, "w_scales": scales},
        lambda p: S.load_gpt_oss_mxfp4(p, "w"),
    )
    w8 = rng.integers(0, 0x7F, (N, K)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    s = rng.uniform(0.5, 2, (N // 128, K // 128)).astype(np.float32)
    fcfg = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    add(
        "FP8 e4m3 128x128 blocks",
        {"l.weight": w8, "l.weight_scale_inv": s},
        lambda p: S.load_fp8_blocks(p, "l", config=fcfg),
    )
    codes = rng.integers(0, 16, (N, K)).astype(np.uint8)
    s16 = rng.integers(0x30, 0x60, (N, K // 16)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    nv = {
        "l.weight": O.modelopt_pack(codes),
        "l.weight_scale": s16,
        "l.weight_scale_2": np.float32(2),
    }
    add(
        "modelopt NVFP4",
        nv,
        lambda p: S.load_modelopt_nvfp4(p, "l", config={"quant_algo": "NVFP4"}),
    )
    for label, qt, nested in (
        ("NF4", "nf4", False),
        ("FP4", "fp4", False),
        ("NF4 double quant", "nf4", True),
    ):
        t = bnb_tensors(rng, N, K, 64, nested, quant_type=qt, dtype="float32")[0]
        add(f"bitsandbytes {label} b64", t, lambda p: S.load_bnb_4bit(p, "l"))
    return cases


def _route(q: emulate.QArray, target: str) -> str:
    x = jnp.zeros((1, q.shape[0]), jnp.bfloat16)
    (row,) = emulate.inspect(emulate.matmul, x, q, target=target).rows
    return row.plan.method if row.plan else row.status


def _plans(q: emulate.QArray) -> str:
    """The plan of each target, as the table cell: one name when all four agree."""
    methods = [_route(q, t) for t in TARGETS]
    if len(set(methods)) == 1:
        return f"{methods[0]} on all four"
    return ", ".join(f"{t} {m}" for t, m in zip(TARGETS, methods))


#: What emulate.pallas.prepare_weight refuses, by the part its message names.
KERNEL_REFUSALS = {}


def _kernel(q: emulate.QArray) -> str:
    """Whether a model's matmul on ``q`` takes pallas.matmul on a TPU target (the weight as
    emulate.flax.load_weights keeps it: (K, N), prepared once in the same bytes), or the
    kernel's refusal."""
    kn = q if q.shape == (4096, 256) else q.T  # the importers' (N, K) rows: flax's (in, out)
    try:
        w = emulate.pallas.prepare_weight(kn)
    except NotImplementedError as e:
        (cell,) = [c for part, c in KERNEL_REFUSALS.items() if part in str(e)]
        return cell
    assert w.nbytes == q.nbytes
    x = jax.ShapeDtypeStruct((1, 4096), jnp.bfloat16)
    dn = (((1,), (0,)), ((), ()))
    route = emulate.weight_route(x, w, dn, target="tpu_v5e")  # as load_weights keeps it
    assert route is not None and route.kernel, route
    return "kernel route"


#: The rows whose plan and kernel cells the default profile measures (module docstring).
ROUTED_DEFAULT = (
    "GGUF Q4_K",
    "GGUF IQ4_NL",
    "AutoAWQ GEMM int4 g128",
    "GPTQ v1 act-order int4 g128",
    "bitsandbytes NF4 double quant b64",
    "FP8 e4m3 128x128 blocks",
    "modelopt NVFP4",
)


def _measured(tmp: pathlib.Path) -> list[list[str]]:
    """The table's measured columns; the plan and kernel cells of a row outside
    :data:`ROUTED_DEFAULT` are None unless in the long sweep."""
    cases = _gguf_cases(tmp) | _safetensors_cases(tmp)
    assert set(ROUTED_DEFAULT) <= set(cases)
    rows = []
    for name, (file_bits, q) in cases.items():
        routed = LONG or name in ROUTED_DEFAULT
        cells = [_plans(q), _kernel(q)] if routed else [None, None]
        rows.append([name, f"{file_bits:.3f}", f"{q.bits_per_element:.3f}", *cells])
    return rows


def _doc_rows() -> list[list[str]]:
    """The conventions table of docs/quantized.md: name, file bits, kept bits, plans and
    the kernel's cell."""
    text = DOC.read_text().split("<!-- conventions table -->")[1]
    rows = []
    for line in text.strip().splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        rows.append([cells[0], *cells[3:]])
    return rows[2:]  # the header and the rule


def test_the_conventions_table_holds_the_measured_bits_and_routes(tmp_path) -> None:
    measured = _measured(tmp_path)
    doc = _doc_rows()
    # a row whose route cells were not measured (the default profile) is checked on its
    # bits: its cells are the doc's
    cells = {r[0]: r[3:] for r in doc}
    measured = [r if r[3] is not None else [*r[:3], *cells.get(r[0], ["?", "?"])] for r in measured]
    expected = "\n".join(" | ".join(r) for r in measured)
    assert doc == measured, f"docs/quantized.md's conventions table should read:\n{expected}"
    for _, file_bits, kept, *_ in measured:  # kept as stored: within 2% of the file
        assert float(kept) <= 1.02 * float(file_bits)
