"""Programs whose results must not depend on XLA:CPU's code generation settings
(tests/_xla_flags.py): tests/test_suite_codegen.py runs them under the suite's settings
and under XLA's defaults and asserts the same bits.

Operands are random bit patterns (NaN, Inf, subnormals and zeros included) of small
shapes; each program is one emulate front end in one mode: mode "exact" with per-row and
digit-sliced operands, mode "fast" with a block-scaled QArray, a convolution, and the
Pallas kernel in interpret mode.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import ml_dtypes
import numpy as np

import emulate

DN = (((1,), (0,)), ((), ()))


def _bits(dtype: object, shape: tuple[int, ...], seed: int, axis: int = 0) -> np.ndarray:
    """Random values of ``dtype`` with NaN and Inf only at index 0 of ``axis`` (a free axis
    of the contraction), so that most results are finite: every finite code equally
    likely for 8-bit types; for wider ones random significands over 2**-20 to 2**20 with
    zeros of both signs and subnormals planted."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.itemsize == 1:
        out = rng.integers(0, 256, shape, dtype=np.uint8).view(dt)
        if np.issubdtype(dt, np.integer):
            return out
    else:
        wide = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 21, shape)
        flat = wide.reshape(-1)
        tiny = float(ml_dtypes.finfo(dt).smallest_subnormal)
        flat[1::7] = tiny * rng.integers(-5, 6, flat[1::7].shape)
        flat[2::11] = -0.0
        out = wide.astype(dt)
        first = np.moveaxis(out, axis, 0)[0]
        first[np.unravel_index(np.arange(3), first.shape)] = np.array(
            [np.nan, np.inf, -np.inf]
        ).astype(dt)
    bad = ~np.isfinite(out.astype(np.float64))
    np.moveaxis(bad, axis, 0)[0] = False
    out[bad] = dt.type(1.5)
    return out


def _normal(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _exact_wide() -> np.ndarray:
    a, b = _bits(ml_dtypes.bfloat16, (4, 37), 1), _bits(np.float32, (37, 5), 2, axis=1)
    return np.asarray(
        emulate.dot_general(
            a, b, DN, preferred_element_type=jnp.float32, target="tpu_v4", mode="exact"
        )
    )


def _exact_float8() -> np.ndarray:
    a = _bits(ml_dtypes.float8_e4m3fn, (3, 64), 3)
    b = _bits(ml_dtypes.float8_e5m2, (64, 4), 4, axis=1)
    return np.asarray(
        emulate.dot_general(
            a, b, DN, preferred_element_type=jnp.bfloat16, target="tpu_v5e", mode="exact"
        )
    )


def _fast_qarray() -> np.ndarray:
    x = jnp.asarray(_normal((5, 96), 5), jnp.bfloat16)
    q = emulate.quantize(_normal((96, 7), 6), emulate.mx.MXFP4, axis=0)
    return np.asarray(emulate.matmul(x, q, preferred_element_type=jnp.float32, target="tpu_v4"))


def _conv() -> np.ndarray:
    lhs = _bits(ml_dtypes.bfloat16, (1, 3, 9, 9), 7, axis=2)
    rhs = _bits(ml_dtypes.float8_e4m3fn, (4, 3, 3, 3), 8)
    return np.asarray(
        emulate.conv_general_dilated(
            lhs,
            rhs,
            (1, 1),
            "SAME",
            preferred_element_type=jnp.float32,
            target="tpu_v4",
            mode="exact",
        )
    )


def _kernel() -> np.ndarray:
    x = _bits(np.int8, (8, 300), 9)
    w = _bits(np.int8, (300, 128), 10)
    return np.asarray(emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype=jnp.int32))


PROGRAMS: dict[str, Callable[[], np.ndarray]] = {
    "exact bfloat16 x float32": _exact_wide,
    "exact float8_e4m3fn x float8_e5m2": _exact_float8,
    "fast bfloat16 x MXFP4 QArray": _fast_qarray,
    "exact conv bfloat16 x float8_e4m3fn": _conv,
    "pallas.matmul int8 x int8": _kernel,
}


def results() -> dict[str, np.ndarray]:
    """Each program's result."""
    return {name: f() for name, f in PROGRAMS.items()}
