"""emulate.cpu.ffi: the XLA FFI structures against the C header jaxlib ships (each struct
laid out here by the C rules from the header's own declarations), and the frame readers
on a call frame built with ctypes."""

from __future__ import annotations

import ctypes
import pathlib
import re

import jaxlib
import numpy as np

from emulate.cpu import ffi

HEADER = pathlib.Path(jaxlib.__file__).parent / "include/xla/ffi/api/c_api.h"

#: C scalar types of the header: (size, alignment) on a 64-bit little-endian host.
_SCALARS = {"size_t": 8, "int64_t": 8, "int": 4, "int32_t": 4, "uint32_t": 4}


def _header() -> str:
    text = HEADER.read_text()
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _structs(text: str) -> dict[str, str]:
    """The body of each ``struct NAME { ... }`` of the header."""
    return dict(re.findall(r"struct\s+(XLA_FFI_\w+)\s*\{(.*?)\}", text, flags=re.S))


def _fields(body: str) -> list[tuple[str, str]]:
    """A struct body's fields as (type, name), in order (a pointer's type ends in ``*``)."""
    fields = []
    for decl in body.split(";"):
        decl = " ".join(decl.replace("const ", "").split())
        if decl:
            typ, s1, s2, field = re.fullmatch(
                r"(?:struct )?(\w+) ?(\**) ?(\**)(\w+)", decl
            ).groups()
            fields.append((typ + s1 + s2, field))
    return fields


def _aliases(text: str) -> dict[str, int]:
    """Enums (int) and scalar typedefs of the header: their sizes."""
    sizes = {name: 4 for name in re.findall(r"typedef enum\s*\{[^}]*\}\s*(\w+);", text)}
    for typ, name in re.findall(r"typedef (\w+) (\w+);", text):
        if typ in _SCALARS:
            sizes[name] = _SCALARS[typ]
    return sizes


def _layout(name: str, structs: dict, aliases: dict) -> tuple[list[tuple], int, int]:
    """``(fields as (name, offset, size), size, alignment)`` of struct ``name`` by the C
    rules."""
    fields, at, align = [], 0, 1
    for typ, field in _fields(structs[name]):
        if typ.endswith("*"):
            size = a = 8
        elif typ in structs:
            _, size, a = _layout(typ, structs, aliases)
        else:
            size = a = _SCALARS.get(typ) or aliases[typ]
        at = -(-at // a) * a
        fields.append((field, at, size))
        at += size
        align = max(align, a)
    return fields, -(-at // align) * align, align


def test_every_structure_has_the_headers_layout() -> None:
    text = _header()
    structs, aliases = _structs(text), _aliases(text)
    assert len(ffi.STRUCTS) == 10
    for s in ffi.STRUCTS:
        fields, size, _ = _layout(s.c_name, structs, aliases)
        declared = [(f, getattr(s, f).offset, getattr(s, f).size) for f, _ in s._fields_]
        assert (s.c_name, declared, ctypes.sizeof(s)) == (s.c_name, fields, size)


def test_the_header_is_the_api_version_answered() -> None:
    text = _header()
    major = int(re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", text).group(1))
    assert (major, minor) == ffi.API_VERSION
    assert "XLA_FFI_ExecutionStage_EXECUTE = 3," in text
    assert "XLA_FFI_Extension_Metadata = 1," in text


def _frame(stage: int) -> tuple[ffi.CallFrame, list]:
    """A call frame with two arguments (3 x 4 float32, 5 uint8) and one result (2 x 2)."""
    keep: list = []

    def buffer(a: np.ndarray) -> ffi.Buffer:
        dims = (ctypes.c_int64 * a.ndim)(*a.shape)
        keep.extend([a, dims])
        return ffi.Buffer(
            ctypes.sizeof(ffi.Buffer), None, 0, a.ctypes.data, a.ndim, ctypes.addressof(dims)
        )

    args = [buffer(np.arange(12, dtype=np.float32).reshape(3, 4)), buffer(np.zeros(5, np.uint8))]
    rets = [buffer(np.zeros((2, 2), np.float32))]
    arg_list = (ctypes.c_void_p * 2)(*map(ctypes.addressof, args))
    ret_list = (ctypes.c_void_p * 1)(ctypes.addressof(rets[0]))
    keep += [args, rets, arg_list, ret_list]
    frame = ffi.CallFrame(struct_size=ctypes.sizeof(ffi.CallFrame), stage=stage)
    frame.args = ffi.Args(ctypes.sizeof(ffi.Args), None, 2, None, ctypes.addressof(arg_list))
    frame.rets = ffi.Rets(ctypes.sizeof(ffi.Rets), None, 1, None, ctypes.addressof(ret_list))
    return frame, keep


def test_the_readers_find_arguments_results_and_the_stage() -> None:
    frame, keep = _frame(3)
    at = ctypes.addressof(frame)
    assert ffi.is_execute(at)
    assert ffi.arg_data(at, 0) == keep[0].ctypes.data
    assert [ffi.arg_dim(at, 0, d) for d in (0, 1)] == [3, 4]
    assert ffi.arg_dim(at, 1, 0) == 5
    assert ffi.ret_data(at, 0) == keep[4].ctypes.data
    assert [ffi.ret_dim(at, 0, d) for d in (0, 1)] == [2, 2]
    assert not ffi.answer_metadata(at)  # no extension: a call, not the query
    assert not ffi.is_execute(ctypes.addressof(_frame(0)[0]))  # instantiate


def test_the_metadata_query_is_answered() -> None:
    frame, _ = _frame(0)
    meta = ffi.Metadata(struct_size=ctypes.sizeof(ffi.Metadata))
    meta.api_version.major_version = meta.api_version.minor_version = -1
    meta.traits = meta.state_type_id.type_id = 7
    ext = ffi.MetadataExtension(metadata=ctypes.addressof(meta))
    ext.extension_base = ffi.ExtensionBase(ctypes.sizeof(ffi.MetadataExtension), 1, None)
    frame.extension_start = ctypes.addressof(ext)
    assert ffi.answer_metadata(ctypes.addressof(frame))
    version = meta.api_version
    assert (version.struct_size, version.major_version, version.minor_version) == (24, 0, 3)
    assert (meta.traits, meta.state_type_id.type_id) == (0, 0)
    ext.extension_base.type = 2  # another extension: not the query
    assert not ffi.answer_metadata(ctypes.addressof(frame))
