"""numba-compiled functions as XLA:CPU custom calls, through JAX's typed FFI.

A handler is a numba ``cfunc`` of signature ``int64(int64)``: it receives the address of
XLA's ``XLA_FFI_CallFrame`` and returns 0 (XLA's null ``XLA_FFI_Error*``: success). The
frame is read with raw loads at the offsets of the stable C ABI of
``jaxlib/include/xla/ffi/api/c_api.h``, which the :mod:`ctypes` structures below declare
field by field under the header's names (less the ``XLA_FFI_`` prefix; tests/cpu/test_ffi.py
lays the header's own declarations out and checks every offset and size against them).

Before any call XLA may ask the handler for its metadata (an extension of type
``XLA_FFI_Extension_Metadata`` on the frame): :func:`answer_metadata` writes API version 0.3
and no traits, as the C++ binding of the same headers does. Only the execute stage does
work; the others return at once (:func:`is_execute`).

Only 64-bit little-endian hosts are supported (the layout below); :func:`emulate.cpu.available`
says whether numba imports. Nothing here runs unless numba is installed: :mod:`emulate.cpu`
imports this module only then.
"""

from __future__ import annotations

import ctypes
from typing import Any

import jax
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

__all__ = [
    "API_VERSION",
    "STRUCTS",
    "Args",
    "ApiVersion",
    "Attrs",
    "Buffer",
    "CallFrame",
    "ExtensionBase",
    "Metadata",
    "MetadataExtension",
    "Rets",
    "TypeId",
    "answer_metadata",
    "arg_data",
    "arg_dim",
    "is_execute",
    "pointer",
    "register",
    "ret_data",
    "ret_dim",
]

_P = ctypes.c_void_p  # every pointer of the ABI (the kernels read addresses as int64)
_SIZE = ctypes.c_size_t
_ENUM = ctypes.c_int  # C enums: int-sized on the supported hosts


class ExtensionBase(ctypes.Structure):
    """``XLA_FFI_Extension_Base``: the head of every extension in a linked list."""

    c_name = "XLA_FFI_Extension_Base"
    _fields_ = [("struct_size", _SIZE), ("type", _ENUM), ("next", _P)]


class ApiVersion(ctypes.Structure):
    """``XLA_FFI_Api_Version``."""

    c_name = "XLA_FFI_Api_Version"
    _fields_ = [
        ("struct_size", _SIZE),
        ("extension_start", _P),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class Buffer(ctypes.Structure):
    """``XLA_FFI_Buffer``: one array argument or result (``dims``: ``rank`` int64s)."""

    c_name = "XLA_FFI_Buffer"
    _fields_ = [
        ("struct_size", _SIZE),
        ("extension_start", _P),
        ("dtype", _ENUM),
        ("data", _P),
        ("rank", ctypes.c_int64),
        ("dims", _P),
    ]


class Args(ctypes.Structure):
    """``XLA_FFI_Args``: ``args`` points to ``size`` pointers to :class:`Buffer`."""

    c_name = "XLA_FFI_Args"
    _fields_ = [
        ("struct_size", _SIZE),
        ("extension_start", _P),
        ("size", ctypes.c_int64),
        ("types", _P),
        ("args", _P),
    ]


class Rets(ctypes.Structure):
    """``XLA_FFI_Rets``: ``rets`` points to ``size`` pointers to :class:`Buffer`."""

    c_name = "XLA_FFI_Rets"
    _fields_ = [
        ("struct_size", _SIZE),
        ("extension_start", _P),
        ("size", ctypes.c_int64),
        ("types", _P),
        ("rets", _P),
    ]


class Attrs(ctypes.Structure):
    """``XLA_FFI_Attrs`` (the kernels take no attributes; declared for the frame's layout)."""

    c_name = "XLA_FFI_Attrs"
    _fields_ = [
        ("struct_size", _SIZE),
        ("extension_start", _P),
        ("size", ctypes.c_int64),
        ("types", _P),
        ("names", _P),
        ("attrs", _P),
    ]


class CallFrame(ctypes.Structure):
    """``XLA_FFI_CallFrame``: what a handler receives."""

    c_name = "XLA_FFI_CallFrame"
    _fields_ = [
        ("struct_size", _SIZE),
        ("extension_start", _P),
        ("api", _P),
        ("ctx", _P),
        ("stage", _ENUM),
        ("args", Args),
        ("rets", Rets),
        ("attrs", Attrs),
        ("future", _P),
    ]


class TypeId(ctypes.Structure):
    """``XLA_FFI_TypeId``."""

    c_name = "XLA_FFI_TypeId"
    _fields_ = [("type_id", ctypes.c_int64)]


class Metadata(ctypes.Structure):
    """``XLA_FFI_Metadata``: what a handler answers to the metadata query."""

    c_name = "XLA_FFI_Metadata"
    _fields_ = [
        ("struct_size", _SIZE),
        ("api_version", ApiVersion),
        ("traits", ctypes.c_uint32),  # XLA_FFI_Handler_Traits
        ("state_type_id", TypeId),
    ]


class MetadataExtension(ctypes.Structure):
    """``XLA_FFI_Metadata_Extension``: the extension on a metadata query's frame."""

    c_name = "XLA_FFI_Metadata_Extension"
    _fields_ = [("extension_base", ExtensionBase), ("metadata", _P)]


#: The structures declared here (each names its C struct: ``c_name``).
STRUCTS = (
    ExtensionBase,
    ApiVersion,
    Buffer,
    Args,
    Rets,
    Attrs,
    CallFrame,
    TypeId,
    Metadata,
    MetadataExtension,
)

_EXECUTE = 3  # XLA_FFI_ExecutionStage_EXECUTE
_METADATA = 1  # XLA_FFI_Extension_Metadata
#: The API version the handlers answer (``XLA_FFI_API_MAJOR``, ``XLA_FFI_API_MINOR``).
API_VERSION = (0, 3)

# The offsets the handlers read (numba freezes these module globals into the code).
_FRAME_EXTENSION = CallFrame.extension_start.offset
_FRAME_STAGE = CallFrame.stage.offset
_FRAME_ARGS = CallFrame.args.offset + Args.args.offset
_FRAME_RETS = CallFrame.rets.offset + Rets.rets.offset
_BUFFER_DATA = Buffer.data.offset
_BUFFER_DIMS = Buffer.dims.offset
_EXTENSION_TYPE = ExtensionBase.type.offset
_EXTENSION_METADATA = MetadataExtension.metadata.offset
_VERSION = Metadata.api_version.offset
_VERSION_SIZE = _VERSION + ApiVersion.struct_size.offset
_VERSION_EXTENSION = _VERSION + ApiVersion.extension_start.offset
_VERSION_MAJOR = _VERSION + ApiVersion.major_version.offset
_VERSION_MINOR = _VERSION + ApiVersion.minor_version.offset
_TRAITS = Metadata.traits.offset
_STATE_TYPE_ID = Metadata.state_type_id.offset
_METADATA_SIZE = Metadata.struct_size.offset
_WITH_STATE_TYPE_ID = _STATE_TYPE_ID + ctypes.sizeof(TypeId)
_API_VERSION_BYTES = ctypes.sizeof(ApiVersion)


@intrinsic
def _load(typingctx: Any, addr: Any, offset: Any, kind: Any) -> Any:
    """The value of type ``kind`` (a numba type class, e.g. ``types.int64``) at ``addr +
    offset``."""
    result = kind.instance_type

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a, o, _ = args
        ptr = builder.inttoptr(builder.add(a, o), context.get_value_type(result).as_pointer())
        return builder.load(ptr)

    return result(addr, offset, kind), codegen


@intrinsic
def _store(typingctx: Any, addr: Any, offset: Any, value: Any) -> Any:
    """Write ``value`` (its own type) at ``addr + offset``."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        a, o, v = args
        builder.store(v, builder.inttoptr(builder.add(a, o), v.type.as_pointer()))
        return context.get_dummy_value()

    return types.none(addr, offset, value), codegen


@intrinsic
def pointer(typingctx: Any, addr: Any) -> Any:
    """``addr`` (an int64) as a ``void*``, for ``numba.carray``."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(addr), codegen


@numba.njit(cache=True)
def answer_metadata(frame: int) -> bool:
    """Whether ``frame`` is XLA's metadata query; if so, answer it (API version, no
    traits, stateless)."""
    ext: int = _load(frame, _FRAME_EXTENSION, types.int64)
    if ext == 0 or _load(ext, _EXTENSION_TYPE, types.int32) != _METADATA:
        return False
    meta = _load(ext, _EXTENSION_METADATA, types.int64)
    _store(meta, _VERSION_SIZE, np.int64(_API_VERSION_BYTES))
    _store(meta, _VERSION_EXTENSION, np.int64(0))
    _store(meta, _VERSION_MAJOR, np.int32(API_VERSION[0]))
    _store(meta, _VERSION_MINOR, np.int32(API_VERSION[1]))
    _store(meta, _TRAITS, np.uint32(0))
    if _load(meta, _METADATA_SIZE, types.int64) >= _WITH_STATE_TYPE_ID:
        _store(meta, _STATE_TYPE_ID, np.int64(0))  # XLA_FFI_UNKNOWN_TYPE_ID: stateless
    return True


@numba.njit(cache=True)
def is_execute(frame: int) -> bool:
    """Whether XLA calls ``frame`` to execute (not to instantiate, prepare or initialize)."""
    return _load(frame, _FRAME_STAGE, types.int32) == _EXECUTE


@numba.njit(cache=True)
def _buffer(frame: int, offset: int, i: int) -> int:
    return _load(_load(frame, offset, types.int64), 8 * i, types.int64)


@numba.njit(cache=True)
def arg_data(frame: int, i: int) -> int:
    """The address of argument ``i``'s data."""
    return _load(_buffer(frame, _FRAME_ARGS, i), _BUFFER_DATA, types.int64)


@numba.njit(cache=True)
def arg_dim(frame: int, i: int, d: int) -> int:
    """Dimension ``d`` of argument ``i``."""
    return _load(
        _load(_buffer(frame, _FRAME_ARGS, i), _BUFFER_DIMS, types.int64), 8 * d, types.int64
    )


@numba.njit(cache=True)
def ret_data(frame: int, i: int) -> int:
    """The address of result ``i``'s data."""
    return _load(_buffer(frame, _FRAME_RETS, i), _BUFFER_DATA, types.int64)


@numba.njit(cache=True)
def ret_dim(frame: int, i: int, d: int) -> int:
    """Dimension ``d`` of result ``i``."""
    return _load(
        _load(_buffer(frame, _FRAME_RETS, i), _BUFFER_DIMS, types.int64), 8 * d, types.int64
    )


_REGISTERED: dict[str, Any] = {}


def register(name: str, handler: Any) -> None:
    """Register the numba cfunc ``handler`` as XLA:CPU FFI target ``name`` (once; the
    cfunc is kept alive here, as XLA holds only its address)."""
    if name in _REGISTERED:
        return
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    jax.ffi.register_ffi_target(name, new_capsule(handler.address, None, None), platform="cpu")
    _REGISTERED[name] = handler
