"""numba-compiled functions as XLA:CPU custom calls, through JAX's typed FFI.

A handler is a numba ``cfunc`` of signature ``int64(int64)``: it receives the address of
XLA's ``XLA_FFI_CallFrame`` and returns 0 (XLA's null ``XLA_FFI_Error*``: success). The
frame is read with the raw loads below at the offsets of the stable C ABI in
``jaxlib/include/xla/ffi/api/c_api.h`` (API 0.x; every struct starts with
``struct_size``; pointers and ``int64_t`` are 8 bytes, enums 4):

    XLA_FFI_CallFrame   extension_start +8, stage +32, args +40, rets +80
    XLA_FFI_Args        (at +40) size +16, args +32   (so the argument list at +72)
    XLA_FFI_Rets        (at +80) rets +32              (the result list at +112)
    XLA_FFI_Buffer      dtype +16, data +24, rank +32, dims +40

Before any call XLA may ask the handler for its metadata (an extension of type 1 on the
frame): :func:`answer_metadata` writes API version 0.3 and no traits, as the C++ binding
of the same headers does. Only the execute stage (3) does work; the others return at once.

Only 64-bit little-endian hosts are supported (the layout above); :func:`available` says
whether numba imports. Nothing here runs unless numba is installed: :mod:`emulate.cpu`
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
    "arg_data",
    "arg_dim",
    "answer_metadata",
    "is_execute",
    "pointer",
    "register",
    "ret_data",
    "ret_dim",
]

_ARGS = 72  # XLA_FFI_CallFrame.args.args
_RETS = 112  # XLA_FFI_CallFrame.rets.rets
_STAGE = 32
_EXECUTE = 3
_METADATA = 1  # XLA_FFI_Extension_Metadata
_API_MAJOR, _API_MINOR = 0, 3


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
    traits)."""
    ext: int = _load(frame, 8, types.int64)
    if ext == 0 or _load(ext, 8, types.int32) != _METADATA:
        return False
    meta = _load(ext, 24, types.int64)  # XLA_FFI_Metadata_Extension.metadata
    _store(meta, 8, np.int64(24))  # api_version.struct_size
    _store(meta, 16, np.int64(0))  # api_version.extension_start
    _store(meta, 24, np.int32(_API_MAJOR))
    _store(meta, 28, np.int32(_API_MINOR))
    _store(meta, 32, np.uint32(0))  # traits
    if _load(meta, 0, types.int64) >= 48:  # a struct with state_type_id
        _store(meta, 40, np.int64(0))  # XLA_FFI_UNKNOWN_TYPE_ID: stateless
    return True


@numba.njit(cache=True)
def is_execute(frame: int) -> bool:
    """Whether XLA calls ``frame`` to execute (not to instantiate, prepare or initialize)."""
    return _load(frame, _STAGE, types.int32) == _EXECUTE


@numba.njit(cache=True)
def _buffer(frame: int, offset: int, i: int) -> int:
    return _load(_load(frame, offset, types.int64), 8 * i, types.int64)


@numba.njit(cache=True)
def arg_data(frame: int, i: int) -> int:
    """The address of argument ``i``'s data."""
    return _load(_buffer(frame, _ARGS, i), 24, types.int64)


@numba.njit(cache=True)
def arg_dim(frame: int, i: int, d: int) -> int:
    """Dimension ``d`` of argument ``i``."""
    return _load(_load(_buffer(frame, _ARGS, i), 40, types.int64), 8 * d, types.int64)


@numba.njit(cache=True)
def ret_data(frame: int, i: int) -> int:
    """The address of result ``i``'s data."""
    return _load(_buffer(frame, _RETS, i), 24, types.int64)


@numba.njit(cache=True)
def ret_dim(frame: int, i: int, d: int) -> int:
    """Dimension ``d`` of result ``i``."""
    return _load(_load(_buffer(frame, _RETS, i), 40, types.int64), 8 * d, types.int64)


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
