"""Reading GGUF files (emulate.importers.gguf.read_gguf): tiny files written here with
``gguf.GGUFWriter``, every quantized type decoded bit-identically to
``gguf.quants.dequantize``, shapes in numpy order, and exact errors for what the reader
refuses."""

from __future__ import annotations

import pathlib
import struct
import sys

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from emulate.importers.ggml import BLOCKS, TYPES
from emulate.importers.gguf import read_gguf
from emulate.importers.stored import StoredParts

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _ggml_oracle import assert_bit_identical, oracle, recombine  # noqa: E402


def write_gguf(path: pathlib.Path, tensors: dict, **metadata) -> pathlib.Path:
    """A GGUF file holding ``tensors``: name -> array (plain) or (bytes, type name)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in metadata.items():
        writer.add_uint32(key, value)
    for name, t in tensors.items():
        if isinstance(t, tuple):
            raw, type_name = t
            writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[type_name])
        else:
            writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_blocks(ggml_type: str, rows: tuple[int, ...], blocks_per_row: int, seed: int):
    _, type_size = BLOCKS[ggml_type]
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (*rows, blocks_per_row * type_size), dtype=np.uint8)


def test_every_type_reads_as_stored(tmp_path) -> None:
    written = {}
    for i, t in enumerate(TYPES):
        rows = (2, 3) if i % 2 else (3,)  # 3-D and 2-D tensors
        written[f"blk.{i}.{t.lower()}.weight"] = (random_blocks(t, rows, 2, seed=i), t)
    f32 = np.random.default_rng(99).normal(size=(2, 3, 5)).astype(np.float32)
    bf16 = f32[0].astype(ml_dtypes.bfloat16)
    plain = {"f32": f32, "f16": f32[1].astype(np.float16)}
    path = write_gguf(
        tmp_path / "all.gguf", {**written, **plain, "bf16": (bf16.view(np.uint8), "BF16")}
    )
    read = read_gguf(path)
    assert list(read.tensors) == [*written, "f32", "f16", "bf16"]
    for name, (raw, t) in written.items():
        parts = read.tensors[name]
        assert isinstance(parts, StoredParts)
        assert (parts.name, parts.source, read.types[name]) == (name, f"GGUF {t}: {name}", t)
        block_size, _ = BLOCKS[t]
        assert parts.shape == (*raw.shape[:-1], 2 * block_size)
        assert_bit_identical(recombine(parts), oracle(raw, t), t)
    for name, want in plain.items():
        got = read.tensors[name]
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    got = read.tensors["bf16"]
    assert isinstance(got, np.ndarray) and got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), bf16.view(np.uint16))
    assert (read.types["f32"], read.types["f16"], read.types["bf16"]) == ("F32", "F16", "BF16")


@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q5_1", "Q8_0", "MXFP4"])
def test_quantized_weights_keep_their_orientation(tmp_path, ggml_type: str) -> None:
    # A (4, 96) weight: GGUF stores dims (96, 4); the reader's shape is numpy's again, and
    # the decoded values stay close to the weight, row by row.
    w = np.random.default_rng(5).normal(size=(4, 96)).astype(np.float32)
    raw = gguf.quants.quantize(w, GGMLQuantizationType[ggml_type])
    path = write_gguf(tmp_path / "w.gguf", {"w": (raw, ggml_type)})
    assert gguf.GGUFReader(path).tensors[0].shape.tolist() == [96, 4]
    parts = read_gguf(path).tensors["w"]
    assert isinstance(parts, StoredParts) and parts.shape == (4, 96)
    decoded = recombine(parts)
    assert_bit_identical(decoded, oracle(raw, ggml_type), ggml_type)
    assert np.abs(decoded - w).max() < 0.5 * np.abs(w).max()


def test_metadata_summary_and_repr(tmp_path) -> None:
    raw = random_blocks("Q4_K", (2,), 1, seed=1)
    path = write_gguf(
        tmp_path / "m.gguf",
        {"blk.0.attn_q.weight": (raw, "Q4_K"), "norm": np.ones(3, np.float32)},
        **{"llama.block_count": 1},
    )
    read = read_gguf(path)
    assert read.metadata == {"general.architecture": "llama", "llama.block_count": 1}
    assert read.summary() == (
        "blk.0.attn_q.weight: Q4_K (2, 256) 4.5 bits/element\nnorm: F32 (3,) 32 bits/element"
    )
    assert repr(read) == f"GGUFFile({str(path)!r}, 2 tensors: 1 Q4_K, 1 F32)"


def _patch_tensor_info(path: pathlib.Path, name: bytes, *, ne0=None, raw_type=None) -> None:
    """Rewrite the first dim or the type of tensor ``name`` in a written file."""
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    if ne0 is not None:
        struct.pack_into("<Q", data, at + 4, ne0)
    if raw_type is not None:
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, raw_type)
    path.write_bytes(bytes(data))


def test_an_unknown_type_number_is_refused(tmp_path) -> None:
    path = write_gguf(
        tmp_path / "u.gguf", {"blk.0.odd": (random_blocks("Q4_0", (2,), 1, 0), "Q4_0")}
    )
    _patch_tensor_info(path, b"blk.0.odd", raw_type=99)
    with pytest.raises(ValueError) as e:
        read_gguf(path)
    assert str(e.value) == (
        f"{path}: tensor 'blk.0.odd': type 99 is not a GGML type; expected one of "
        + ", ".join([*TYPES, "F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"])
    )


def test_a_type_emulate_does_not_read_is_refused(tmp_path) -> None:
    raw = np.zeros((1, 66), np.uint8)  # one IQ2_XXS block of 256 elements
    path = write_gguf(tmp_path / "iq2.gguf", {"blk.0.ffn_down.weight": (raw, "IQ2_XXS")})
    with pytest.raises(ValueError) as e:
        read_gguf(path)
    assert str(e.value) == (
        f"{path}: tensor 'blk.0.ffn_down.weight': type 'IQ2_XXS' is not a GGML type emulate "
        f"reads; expected one of {', '.join(TYPES)}"
    )


def test_rows_that_are_not_whole_blocks_are_refused(tmp_path) -> None:
    path = write_gguf(tmp_path / "s.gguf", {"blk.0.w": (random_blocks("Q4_0", (2,), 2, 0), "Q4_0")})
    _patch_tensor_info(path, b"blk.0.w", ne0=48)
    with pytest.raises(ValueError) as e:
        read_gguf(path)
    assert str(e.value) == (
        f"{path}: tensor 'blk.0.w': shape (2, 48) has rows of 48 elements; Q4_0 rows must be "
        "a multiple of its block of 32 elements"
    )


def test_a_file_that_is_not_gguf_is_refused(tmp_path) -> None:
    path = tmp_path / "not.gguf"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError) as e:
        read_gguf(path)
    assert str(e.value) == f"{path}: GGUF magic invalid"


def test_without_the_gguf_package_the_error_names_the_extra(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError) as e:
        read_gguf(tmp_path / "x.gguf")
    assert str(e.value) == 'reading GGUF files needs the gguf package: pip install "emulate[gguf]"'
