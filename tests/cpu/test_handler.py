"""emulate.cpu.handler: the code compiled for a weight form, as the handler calls it."""

from __future__ import annotations

import numpy as np
import pytest

import emulate
from emulate.cpu import handler, route

KN = (((1,), (0,)), ((), ()))


def _q() -> emulate.QArray:
    w = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    return emulate.quantize(w, "int4", block_shape=32, axis=0)


@pytest.mark.parametrize("many", [False, True])
def test_the_listing_is_the_compiled_kernel(many: bool) -> None:
    form = route.kernel_form(_q(), 1, (1, 64), KN)
    assert not isinstance(form, str)
    ir = handler.listing(form, "llvm", many=many)
    # the vector steps, inlined: 16 lanes of the few-rows steps, 8 of the micro-kernels
    assert "define " in ir and ("<8 x float>" if many else "<16 x float>") in ir
    assert "llvm.fmuladd" in ir
    assert len(handler.listing(form, "asm", many=many).splitlines()) > 100
    with pytest.raises(ValueError, match="^what: expected 'llvm' or 'asm', got 'ir'$"):
        handler.listing(form, "ir")
