"""emulate.cpu.kernel_cache: a cfunc compiled once into a folder, loaded by the next compile
of the same key, compiled again for another key (a small cfunc: the same numba path,
milliseconds to compile); the kernels' entry ignores EMULATE_CPU_KERNEL_CACHE with a
warning and writes nothing (a loaded Q4_K handler crashed its process)."""

from __future__ import annotations

import ctypes

import pytest
from numba import types

from emulate.cpu import kernel_cache

SIG = types.int64(types.int64)


def _plus(k: int):
    def plus(v):
        return v + k

    return plus


def test_the_second_compile_of_a_key_loads_the_first(tmp_path) -> None:
    where = tmp_path / "kernels"
    first = kernel_cache.cfunc_in(where, _plus(1), SIG, ("plus", 1))
    (written,) = where.iterdir()
    assert written.suffix == ".nbk" and first.cache_hits == 0
    again = kernel_cache.cfunc_in(where, _plus(1), SIG, ("plus", 1))
    assert again.cache_hits == 1
    # a loaded cfunc is callable: its machine code, not a stub
    call = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(again.address)
    assert call(41) == 42
    other = kernel_cache.cfunc_in(where, _plus(2), SIG, ("plus", 2))
    assert other.cache_hits == 0 and len(list(where.iterdir())) == 2
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


def test_the_kernels_entry_ignores_the_variable_with_a_warning(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "kernels"))
    with pytest.warns(RuntimeWarning) as seen:
        c = kernel_cache.cfunc(_plus(4), SIG, ("plus", 4))
        kernel_cache.cfunc(_plus(5), SIG, ("plus", 5))
    assert {str(w.message) for w in seen} == {
        "EMULATE_CPU_KERNEL_CACHE is ignored: CPU kernels loaded from the folder crashed a "
        "process (a Q4_K form, SIGSEGV; cause not found), so every process compiles its own "
        "(docs/cpu_kernel.md)"
    }
    assert ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(c.address)(1) == 5
    assert not (tmp_path / "kernels").exists()
