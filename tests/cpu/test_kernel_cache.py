"""emulate.cpu.kernel_cache: a cfunc compiled once into the folder, loaded by the next
compile of the same key, compiled again for another key; off without the variable. A
small cfunc stands for a kernel (the same numba path, milliseconds to compile); the
session's kernels share the folder conftest.py sets (tests/cpu/ compile them)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from numba import types

import emulate
from emulate.cpu import kernel_cache

SIG = types.int64(types.int64)


def _plus(k: int):
    def plus(v):
        return v + k

    return plus


def test_the_second_compile_of_a_key_loads_the_first(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "kernels"))
    first = kernel_cache.cfunc(_plus(1), SIG, ("plus", 1))
    (written,) = (tmp_path / "kernels").iterdir()
    assert written.suffix == ".nbk" and first.cache_hits == 0
    again = kernel_cache.cfunc(_plus(1), SIG, ("plus", 1))
    assert again.cache_hits == 1
    # a loaded cfunc is callable: its machine code, not a stub
    call = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(again.address)
    assert call(41) == 42
    other = kernel_cache.cfunc(_plus(2), SIG, ("plus", 2))
    assert other.cache_hits == 0 and len(list((tmp_path / "kernels").iterdir())) == 2
    assert ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(other.address)(41) == 43


@pytest.mark.parametrize("value", [None, ""])
def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv(kernel_cache.ENV, raising=False)
    else:
        monkeypatch.setenv(kernel_cache.ENV, value)
    monkeypatch.chdir(tmp_path)
    assert kernel_cache.folder() is None
    c = kernel_cache.cfunc(_plus(3), SIG, ("plus", 3))
    assert ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(c.address)(1) == 4
    assert list(tmp_path.iterdir()) == []


def test_a_variable_naming_a_file_is_refused_by_name(tmp_path, monkeypatch) -> None:
    # issue 49's sweep: NotADirectoryError from inside the kernel's compile, under jit
    (tmp_path / "f").write_text("")
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "f"))
    with pytest.raises(ValueError) as e:
        kernel_cache.cfunc(_plus(1), SIG, ("plus", 1))
    assert str(e.value) == (
        f"EMULATE_CPU_KERNEL_CACHE: expected a folder for the compiled CPU kernels (made if "
        f"missing), got {str(tmp_path / 'f')!r}, which is not a folder; unset it to compile "
        "in every process"
    )


def test_a_call_the_kernel_takes_raises_it_before_anything_compiles(tmp_path, monkeypatch):
    # issue 49's sweep: the error came from the kernel's trace, read as the kernel's
    # refusal, and the routed call then failed an assertion (was a NotADirectoryError)
    (tmp_path / "f").write_text("")
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "f"))
    q = emulate.quantize(np.ones((64, 32), np.float32), "int8", block_shape=32, axis=0)
    x, dn = np.ones((1, 64), np.float32), (((1,), (0,)), ((), ()))
    msg = r"^EMULATE_CPU_KERNEL_CACHE: expected a folder for the compiled CPU kernels"
    with emulate.use_cpu_kernel(True):
        with pytest.raises(ValueError, match=msg):
            emulate.weight_route(x, q, dn, target="cpu")
        with pytest.raises(ValueError, match=msg):
            emulate.dot_general(x, q, dn, target="cpu")
    with emulate.use_cpu_kernel(False):  # the kernel is not taken: the variable is not read
        assert emulate.dot_general(x, q, dn, target="cpu").shape == (1, 32)
