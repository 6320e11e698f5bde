"""The XLA:CPU FFI handler of a weight form (:mod:`emulate.cpu.ffi`): a numba ``cfunc``
that reads the call frame into the kernel's records once (:class:`~emulate.cpu.operands.Weight`
by the positions of :class:`~emulate.cpu.operands.Arg`) and runs the form's few-rows kernel
(:mod:`emulate.cpu.gemv`) or many-rows kernel (:mod:`emulate.cpu.gemm`); and
:func:`listing`, the code compiled for a form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import types

from emulate.cpu import ffi, gemm, gemv, kernel_cache
from emulate.cpu.form import Form
from emulate.cpu.operands import Arg, Factor, StoredBytes, Weight, byte_widths

__all__ = ["handler", "listing"]


@numba.njit(cache=True)
def _floats(frame, i):
    shape = (ffi.arg_dim(frame, i, 0), ffi.arg_dim(frame, i, 1))
    return numba.carray(ffi.pointer(ffi.arg_data(frame, i)), shape, np.float32)


@numba.njit(cache=True)
def _bytes(frame, i, width):
    """Argument ``i`` (a 2-D array of any type, ``width`` bytes an element) as bytes."""
    shape = (ffi.arg_dim(frame, i, 0), ffi.arg_dim(frame, i, 1) * width)
    return numba.carray(ffi.pointer(ffi.arg_data(frame, i)), shape, np.uint8)


@numba.njit(cache=True)
def _vector(frame, i):
    return numba.carray(
        ffi.pointer(ffi.arg_data(frame, i)), (ffi.arg_dim(frame, i, 0),), np.float32
    )


@numba.njit(inline="always")
def _stored(frame, i, width):
    """The stored part at argument ``i`` (its table at ``i + 1``)."""
    return StoredBytes(_bytes(frame, i, width), _vector(frame, i + 1))


def _weight_of(form: Form) -> Callable:
    """An njit ``frame -> Weight``: the weight's parts from XLA's call frame, by the
    positions of :class:`~emulate.cpu.operands.Arg` (the order
    :func:`emulate.cpu.operands.wire` flattens them in)."""
    w_codes, w_zp, w_zps, w_s, w_ss, w_o, w_os = byte_widths(form)

    @numba.njit(inline="always")
    def weight_of(frame):
        c = _vector(frame, Arg.CONSTANTS)
        return Weight(
            _stored(frame, Arg.CODES, w_codes),
            Factor(
                _stored(frame, Arg.ZERO_POINT, w_zp),
                _stored(frame, Arg.ZERO_POINT_SCALES, w_zps),
                c[0],
                c[1],
            ),
            Factor(
                _stored(frame, Arg.SCALE, w_s), _stored(frame, Arg.SCALE_SCALES, w_ss), c[2], c[3]
            ),
            Factor(
                _stored(frame, Arg.OFFSET, w_o), _stored(frame, Arg.OFFSET_SCALES, w_os), c[4], c[5]
            ),
            c[6],
        )

    return weight_of


def _kernel(form: Form, parallel: bool, many: bool) -> Callable:
    return (gemm.kernel if many else gemv.kernel)(form, parallel)


#: The handler's C signature: the address of XLA's call frame in, an error code out.
_SIGNATURE = types.int64(types.int64)


@functools.cache
def handler(form: Form, parallel: bool, many: bool = False) -> object:
    """The numba cfunc that XLA calls for ``form`` (:mod:`emulate.cpu.ffi`): its operands
    are :func:`emulate.cpu.operands.wire`'s, its one result ``out``; the many-rows kernel
    (:func:`emulate.cpu.gemm.kernel`) where ``many``, else the few-rows one. Compiled once
    a process, or loaded from the folder of :mod:`emulate.cpu.kernel_cache` where
    ``EMULATE_CPU_KERNEL_CACHE`` names one."""
    return kernel_cache.cfunc(_call(form, parallel, many), _SIGNATURE, (form, parallel, many))


def _call(form: Form, parallel: bool, many: bool) -> Callable:
    """The Python function of :func:`handler`'s cfunc."""
    run = _kernel(form, parallel, many)
    weight_of = _weight_of(form)

    def call(frame):
        if ffi.answer_metadata(frame) or not ffi.is_execute(frame):
            return 0
        out_shape = (ffi.ret_dim(frame, 0, 0), ffi.ret_dim(frame, 0, 1))
        out = numba.carray(ffi.pointer(ffi.ret_data(frame, 0)), out_shape, np.float32)
        x, xe, xsum = _floats(frame, Arg.X), _floats(frame, Arg.XE), _floats(frame, Arg.XSUM)
        run(x, xe, xsum, weight_of(frame), out)
        return 0

    return call


def listing(form: Form, what: str = "asm", parallel: bool = False, many: bool = False) -> str:
    """The code compiled for ``form``'s kernel (the few-rows one, or the many-rows one where
    ``many``; the steps LLVM did not inline are functions in the same listing):
    its optimized LLVM IR (``what="llvm"``) or this host's assembly (``"asm"``), for the
    types the handler calls it with (docs/cpu_kernel.md). Compiles the kernel first if
    needed (seconds).

    Raises:
      ValueError: ``what`` is neither "llvm" nor "asm".
    """
    if what not in ("llvm", "asm"):
        raise ValueError(f"what: expected 'llvm' or 'asm', got {what!r}")
    run: Any = _kernel(form, parallel, many)  # a numba dispatcher
    if not run.signatures:
        # compiled for the frame's types by a handler, unless that handler was loaded from
        # the folder of emulate.cpu.kernel_cache (or not built yet)
        numba.cfunc(_SIGNATURE)(_call(form, parallel, many))
    code = run.inspect_llvm() if what == "llvm" else run.inspect_asm()
    return "\n".join(code.values())
