"""The safetensors importer's reading and refusing: bits an element against the file's,
exact messages for metadata it does not understand, sharded directories, raw-byte reads,
the missing-package error, and the conventions' purity (numpy only)."""

from __future__ import annotations

import re
from pathlib import Path

import _st_oracles as O
import ml_dtypes
import numpy as np
import pytest
from _st_cases import (
    AWQ_CONFIG,
    awq_tensors,
    bnb_tensors,
    decoded,
    gptq_tensors,
    mx_scales,
    same_bits,
    write,
)

from emulate.importers import safetensors as S


# ------------------------------------------------------------------------ bits an element
def test_bits_an_element_stay_within_two_percent(tmp_path) -> None:
    rng = np.random.default_rng(9)
    cases = [
        S.read_awq(
            write(
                tmp_path / "a", awq_tensors(rng, 256, 64, 128), {**AWQ_CONFIG, "group_size": 128}
            ),
            "l",
        ),
        S.read_gptq(
            write(tmp_path / "g", gptq_tensors(rng, 256, 64, 128, 4, True, True)),
            "l",
            config={"bits": 4, "group_size": 128},
        ),
        S.read_gptq(
            write(tmp_path / "g3", gptq_tensors(rng, 256, 64, 128, 3, False, False)),
            "l",
            config={"bits": 3, "group_size": 128, "checkpoint_format": "gptq_v2"},
        ),
        S.read_bnb_4bit(write(tmp_path / "b", bnb_tensors(rng, 64, 256, 64, True)[0]), "l"),
        S.read_gpt_oss_mxfp4(
            write(
                tmp_path / "o",
                {
                    "w_blocks": rng.integers(0, 256, (2, 8, 4, 16)).astype(np.uint8),
                    "w_scales": mx_scales(rng, (2, 8, 4)),
                },
            ),
            "w",
        ),
    ]
    expected = [
        4 + (16 + 4) / 128,
        4 + (16 + 5) / 128 + 32 / 64,
        3 + (16 + 3) / 128,
        4 + (8 + 32 / 256) / 64 + (16 + 256 + 1) * 32 / (64 * 256),
        4.25,
    ]
    for parts, bits in zip(cases, expected):
        assert parts.bits_per_element == pytest.approx(bits)
        assert parts.bits_per_element <= 1.02 * parts.stored_bits / parts.size


# -------------------------------------------------------------------------- bad metadata
def test_refuses_unknown_or_missing_metadata(tmp_path) -> None:
    rng = np.random.default_rng(10)
    path = write(tmp_path, awq_tensors(rng, 32, 16, 16), AWQ_CONFIG)
    cases = [
        (
            {**AWQ_CONFIG, "version": "gemv"},
            "quantization_config: version is 'gemv'; expected 'gemm' (AutoAWQ GEMM packing)",
        ),
        ({**AWQ_CONFIG, "bits": 3}, "quantization_config: bits is 3; expected one of 4"),
        (
            {k: v for k, v in AWQ_CONFIG.items() if k != "group_size"},
            "quantization_config: group_size is missing; "
            "expected the setting to be present (it is not guessed)",
        ),
        ({**AWQ_CONFIG, "group_size": 8}, "l.scales: shape is (2, 16); expected (4, 16)"),
    ]
    for cfg, message in cases:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            S.read_awq(path, "l", config=cfg)
    bad_dtype = {**awq_tensors(rng, 32, 16, 16), "l.scales": np.ones((2, 16), np.float32)}
    with pytest.raises(ValueError, match=re.escape("l.scales: dtype is float32; expected float16")):
        S.read_awq(write(tmp_path / "d", bad_dtype), "l", config=AWQ_CONFIG)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "l.nope.qweight: tensor is missing; the checkpoint has no tensor of that name"
        ),
    ):
        S.read_awq(path, "l.nope")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "quantization_config: format is 'marlin'; expected one of 'gptq', 'gptq_v2'"
        ),
    ):
        S.read_gptq(path, "l", config={"bits": 4, "group_size": 16, "checkpoint_format": "marlin"})
    two = {"bits": 4, "group_size": 16, "checkpoint_format": "gptq", "format": "gptq_v2"}
    with pytest.raises(
        ValueError,
        match=re.escape(
            "quantization_config: checkpoint_format/format is ['gptq', 'gptq_v2']; "
            "expected one value (the spellings disagree)"
        ),
    ):
        S.read_gptq(path, "l", config=two)
    with pytest.raises(
        ValueError,
        match=re.escape("quantization_config: pack_dtype is 'int16'; expected one of 'int32'"),
    ):
        S.read_gptq(path, "l", config={"bits": 4, "group_size": 16, "pack_dtype": "int16"})
    t = gptq_tensors(rng, 64, 32, 32, 4, False, False)
    t["l.g_idx"] = np.array([0] * 40 + [1] * 24, np.int32)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "l.g_idx: groups is of sizes [40, 24]; "
            "expected each group to hold 32 rows (the last one may hold fewer)"
        ),
    ):
        S.read_gptq(write(tmp_path / "g", t), "l", config={"bits": 4, "group_size": 32})
    bnb, _ = bnb_tensors(rng, 8, 64, 64, False)
    bnb["l.weight.quant_state.bitsandbytes__nf4"] = O.bnb_quant_state("nf4", 64, "float8", (8, 64))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "l.weight.quant_state.bitsandbytes__nf4: dtype is 'float8'; "
            "expected one of ('bfloat16', 'float16', 'float32'); nested_dtype 'float32'"
        ),
    ):
        S.read_bnb_4bit(write(tmp_path / "b", bnb), "l")
    bnb2, _ = bnb_tensors(rng, 3, 48, 32, False)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "l.weight.quant_state.bitsandbytes__nf4: blocksize is 32 over rows of 48 elements"
        ),
    ):
        S.read_bnb_4bit(write(tmp_path / "b2", bnb2), "l")
    with pytest.raises(ValueError, match=re.escape("config: no quantization settings beside")):
        S.read_fp8_blocks(
            write(tmp_path / "f", {"l.weight": np.zeros((2, 2), ml_dtypes.float8_e4m3fn)}), "l"
        )
    with pytest.raises(
        ValueError, match=re.escape("quantization_config: weight_block_size is missing")
    ):
        S.read_fp8_blocks(tmp_path / "f" / "model.safetensors", "l", config={"quant_method": "fp8"})
    with pytest.raises(
        ValueError, match=re.escape("weights: num_bits is 3; expected one of 2, 4, 8")
    ):
        S.read_compressed_tensors(path, "l", config={"num_bits": 3, "type": "int"})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "e: blocks tensor is ambiguous or missing "
            "(neither of ['e_blocks', 'e.blocks']); expected one"
        ),
    ):
        S.read_gpt_oss_mxfp4(path, "e")


# ------------------------------------------------------------------------------ the reader
def test_sharded_directory_reads_across_files_and_refuses_duplicates(tmp_path) -> None:
    rng = np.random.default_rng(11)
    t = awq_tensors(rng, 32, 16, 16)
    write(tmp_path, {"l.qweight": t["l.qweight"]}, AWQ_CONFIG, name="model-00001-of-00002")
    write(
        tmp_path,
        {"l.qzeros": t["l.qzeros"], "l.scales": t["l.scales"]},
        name="model-00002-of-00002",
    )
    whole = S.read_awq(write(tmp_path / "one", t, AWQ_CONFIG), "l")
    same_bits(decoded(S.read_awq(tmp_path, "l")), decoded(whole))
    assert len(S.SafetensorsCheckpoint(tmp_path)) == 3
    write(tmp_path, {"l.scales": t["l.scales"]}, name="model-extra")
    with pytest.raises(
        ValueError,
        match=re.escape("l.scales: tensor is in both model-00002-of-00002.safetensors and "),
    ):
        S.SafetensorsCheckpoint(tmp_path)


def test_raw_bytes_reader_matches_safetensors_flax_loader(tmp_path) -> None:
    """bfloat16 and float8 tensors read from the header's offsets hold the bytes written;
    the bfloat16 one equals the package's own flax loader's array (that loader cannot read
    float8 tensors with numpy 2 here: it asks numpy for float8_e4m3fn)."""
    from safetensors.flax import load_file

    rng = np.random.default_rng(12)
    t = {
        "a": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
        "b": rng.integers(0, 256, (4, 2)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn),
        "c": np.arange(6, dtype=np.int32).reshape(2, 3),
    }
    path = write(tmp_path, t)
    ours = S.SafetensorsCheckpoint(path)
    for name, want in t.items():
        assert ours[name].dtype == want.dtype and ours[name].shape == want.shape
        np.testing.assert_array_equal(ours[name].view(np.uint8), want.view(np.uint8))
    theirs = load_file(str(write(tmp_path / "bf16", {"a": t["a"], "c": t["c"]})))
    for name in ("a", "c"):
        got = np.asarray(theirs[name]).view(np.uint8)
        np.testing.assert_array_equal(ours[name].view(np.uint8), got)


def test_missing_safetensors_package_names_the_extra(tmp_path, monkeypatch) -> None:
    path = write(tmp_path, {"c": np.zeros(2, np.int32)})
    monkeypatch.setitem(__import__("sys").modules, "safetensors", None)
    with pytest.raises(ImportError, match=re.escape('pip install "emulate[safetensors]"')):
        S.SafetensorsCheckpoint(path)


def test_conventions_are_pure_numpy() -> None:
    """The parsers import neither jax nor a module of emulate that is not a convention
    (or the parts record they return)."""
    import ast

    from emulate.importers import conventions

    for path in Path(conventions.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith("jax"), (path.name, name)
                assert not name.startswith("emulate") or name.startswith(
                    ("emulate.importers.conventions", "emulate.importers.stored")
                ), (path.name, name)


def test_settings_from_the_projects_own_files(tmp_path) -> None:
    """AutoAWQ's quant_config.json (w_bit, q_group_size, version "GEMM") and modelopt's
    hf_quant_config.json ({"quantization": {...}}) beside the checkpoint."""
    import json

    rng = np.random.default_rng(13)
    t = awq_tensors(rng, 32, 16, 16)
    path = write(tmp_path / "awq", t)
    own = {"zero_point": True, "q_group_size": 16, "w_bit": 4, "version": "GEMM"}
    (tmp_path / "awq" / "quant_config.json").write_text(json.dumps(own))
    same_bits(decoded(S.read_awq(path, "l")), decoded(S.read_awq(path, "l", config=AWQ_CONFIG)))
    q = rng.integers(0, 16, (4, 32)).astype(np.uint8)
    s = rng.integers(0x30, 0x60, (4, 2)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    nv = {"l.weight": O.modelopt_pack(q), "l.weight_scale": s, "l.weight_scale_2": np.float32(2)}
    path = write(tmp_path / "nv", {k: np.asarray(v) for k, v in nv.items()})
    quant = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    (tmp_path / "nv" / "hf_quant_config.json").write_text(json.dumps({"quantization": quant}))
    parts = S.read_modelopt_nvfp4(path, "l")
    assert parts.source == "modelopt NVFP4: l.weight, l.weight_scale, l.weight_scale_2"
    assert parts.tensor_scale == np.float32(2) and parts.block_shape == (16, 1)


def test_load_safetensors_reads_a_whole_checkpoint_in_one_call(tmp_path) -> None:
    """Every quantized layer as an (out, in) QArray under ``{prefix}.weight``, decoding as
    the project's own decoder does; plain tensors as stored; a method it does not read
    whole is refused by name."""
    import jax.numpy as jnp

    import emulate

    rng = np.random.default_rng(17)
    t = awq_tensors(rng, 32, 16, 16)
    t["l.scales"] = np.abs(t["l.scales"]).clip(2**-10, 1).astype(np.float16)  # finite
    plain = rng.normal(size=(16, 32)).astype(ml_dtypes.bfloat16)
    path = write(tmp_path / "awq", {**t, "head.weight": plain}, {**AWQ_CONFIG, "group_size": 16})
    got = S.load_safetensors(path.parent)
    assert list(got) == ["head.weight", "l.weight"]  # file order (safetensors sorts names)
    same_bits(np.asarray(got["head.weight"]), plain)
    q = got["l.weight"]
    assert isinstance(q, emulate.QArray) and q.shape == (16, 32) and q.dtype == np.float16
    want = O.awq_dequantize_gemm(t["l.qweight"], t["l.qzeros"], t["l.scales"], 4, 16)
    same_bits(np.asarray(emulate.dequantize(q, to=jnp.float16)), want.T)
    layer = S.load_awq(path, "l")  # the per-layer loader: the same (out, in) QArray
    assert layer.shape == q.shape
    same_bits(np.asarray(emulate.dequantize(layer, to=jnp.float16)), want.T)
    # GPTQ act-order: the permutation follows the transpose
    g = gptq_tensors(rng, 64, 32, 16, 4, True, True)
    g["l.scales"] = np.abs(g["l.scales"]).clip(2**-10, 1).astype(np.float16)
    cfg = {"quant_method": "gptq", "bits": 4, "group_size": 16}
    q = S.load_safetensors(write(tmp_path / "gptq", g), config=cfg)["l.weight"]
    args = (g["l.qzeros"], g["l.scales"], g["l.g_idx"], 4, True)
    same_bits(
        np.asarray(emulate.dequantize(q, to=jnp.float16)),
        O.gptq_dequantize(g["l.qweight"], *args).T,
    )
    with pytest.raises(ValueError) as e:
        S.load_safetensors(path, config={"quant_method": "bitsandbytes"})
    assert str(e.value) == (
        "config: quant_method is 'bitsandbytes'; load_safetensors reads 'awq', 'gptq', "
        "'fp8', 'compressed-tensors' checkpoints whole (for the others, load each layer "
        "with load_modelopt_nvfp4, load_bnb_4bit or load_gpt_oss_mxfp4)"
    )
