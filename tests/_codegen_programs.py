"""Programs run under the suite's XLA:CPU code generation settings (tests/_xla_flags.py)
and under XLA's defaults by tests/test_suite_codegen.py.

:data:`EXACT`: results the contract calls exact, which must be the same bits under both
(operands are random bit patterns, NaN, Inf, subnormals and zeros included, of small
shapes; mode "exact" with per-row and digit-sliced operands, mode "fast" with a
block-scaled QArray whose products are exact, an exact convolution, the Pallas kernel's
int8 x int8). :data:`BOUNDED`: ``emulate.pallas.matmul`` (interpret mode) on QArrays with
f32 scales, offsets and 128 x 128 blocks, whose f32 multiply-adds LLVM contracts into FMA
instructions at XLA's default -O2 and not at -O0: the last bits may differ, and each must
be within the contract's bound of the float64 sum over the weight's values.

By default one exact and one bounded program run: mode "exact" of float8_e4m3fn x
float8_e5m2 (emulate's exact sums are integer limb arithmetic, which no code generation
setting changes: the wider programs are more of the same, at 2-3 times the compile time)
and NF4 in the kernel (the Pallas kernel in interpret mode, and the f32 multiply-adds the
settings treat differently). The others are a long sweep (``EMULATE_LONG_TESTS=1``):
under XLA's defaults each program compiles anew, about 4 s of CPU a program.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from _sweeps import LONG

import emulate
from emulate import codebooks

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


EXACT: dict[str, Callable[[], np.ndarray]] = {
    "exact float8_e4m3fn x float8_e5m2": _exact_float8,
}
if LONG:
    EXACT |= {
        "exact bfloat16 x float32": _exact_wide,
        "pallas.matmul int8 x int8": _kernel,
        "fast bfloat16 x MXFP4 QArray": _fast_qarray,
        "exact conv bfloat16 x float8_e4m3fn": _conv,
    }


#: A bounded program's result, activations, the weight's values in float64, an array of
#: magnitudes for the bound (``|q s| + |o|``) and the bound's extra f32 roundings.
Bounded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]


def _activations(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((8, 512)).astype(ml_dtypes.bfloat16)


def _kernel_f32(x: np.ndarray, q: emulate.QArray) -> np.ndarray:
    return np.asarray(emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype=jnp.float32))


def _nf4() -> Bounded:
    rng = np.random.default_rng(11)
    x = _activations(rng)
    codes = rng.integers(0, 16, (512, 256))
    absmax = rng.uniform(0.01, 1, (8, 256)).astype(np.float32)
    packed = emulate.pack(codes.astype(ml_dtypes.uint4), axis=0)
    q = emulate.QArray.from_parts(
        packed, jnp.asarray(absmax), block_shape=(64, 1), codebook=codebooks.NF4
    )
    w = codebooks.NF4.array().astype(np.float64)[codes] * np.repeat(absmax, 64, axis=0)
    return _kernel_f32(x, q), x, w, np.abs(w), 8 + 4


def _offsets() -> Bounded:
    rng = np.random.default_rng(12)
    x = _activations(rng)
    codes = rng.integers(0, 16, (512, 256))
    s = rng.uniform(0.001, 0.1, (4, 256)).astype(np.float32)
    o = rng.uniform(-0.1, 0.1, (4, 256)).astype(np.float32)
    packed = emulate.pack(codes.astype(ml_dtypes.uint4), axis=0)
    q = emulate.QArray.from_parts(
        packed, jnp.asarray(s), block_shape=(128, 1), offsets=jnp.asarray(o)
    )
    qs = codes * np.repeat(s, 128, axis=0).astype(np.float64)
    ov = np.repeat(o, 128, axis=0).astype(np.float64)
    return _kernel_f32(x, q), x, qs + ov, np.abs(qs) + np.abs(ov), 4 + 5


def _fp8_blocks() -> Bounded:
    rng = np.random.default_rng(13)
    x = _activations(rng)
    codes = rng.integers(0, 256, (512, 256)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN
    e4m3 = codes.view(ml_dtypes.float8_e4m3fn)
    s = rng.uniform(0.5, 2, (4, 2)).astype(np.float32)
    q = emulate.QArray.from_parts(jnp.asarray(e4m3), jnp.asarray(s), block_shape=(128, 128))
    w = e4m3.astype(np.float64) * np.kron(s.astype(np.float64), np.ones((128, 128)))
    return _kernel_f32(x, q), x, w, np.abs(w), 4 + 4


BOUNDED: dict[str, Callable[[], Bounded]] = {
    "pallas.matmul bfloat16 x NF4 (f32 absmax)": _nf4,
}
if LONG:
    BOUNDED |= {
        "pallas.matmul bfloat16 x uint4 with offsets": _offsets,
        "pallas.matmul bfloat16 x e4m3fn in 128 x 128 blocks": _fp8_blocks,
    }


def results() -> dict[str, np.ndarray]:
    """Each program's result (a bounded program's first item)."""
    out = {name: f() for name, f in EXACT.items()}
    return out | {name: f()[0] for name, f in BOUNDED.items()}
