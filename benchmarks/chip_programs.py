"""The programs timed on a real TPU and estimated by the bundle model, defined once.

Each :class:`ChipCase` is one program that calls a matmul (or a decoder layer's seven
projections) :data:`LOOP` times in a ``fori_loop``, each call's input depending on the
previous result so that no call is hoisted: one call with ``block_until_ready`` costs
400-600 us of dispatch on a v5e, more than the kernels measured. Names say what is timed:

- ``projection/<scheme>/m<M>/<bm>x<bn>x<bk>`` (or ``/default``): ``emulate.pallas.matmul``
  of bf16 activations (M, 4096) by a 4096 x 14336 checkpoint weight of
  :data:`benchmarks.qweights.SCHEMES` prepared once, f32 result;
- ``projection/bf16/m<M>``: the same shape, dense bf16 weights through ``jnp.dot``;
- ``layer/<contender>/m<M>``: :func:`layer`, one Llama-3-8B layer's projections (what
  ``benchmarks.layer_time`` times), with dense bf16 weights (``bf16``), Q4_K QArrays on
  the XLA route (``xla``) or prepared for the kernel route (``kernel``), passed as the
  program's arguments (``benchmarks.layer_time`` closed over them, making them constants
  of the program; compiling 123-436 MB of constants took over 7 GB of host memory and was
  killed on a 24 GB machine, while the kernels and fusions are the same);
- ``attention/<format>/<kernel|xla>``: ``emulate.kvcache.attention`` of one decode token
  of 16 sequences over a Llama-3-8B layer's cache (8 KV heads of 128, 4 query heads each,
  4096 tokens every one visible) stored in :data:`emulate.kvcache.FORMATS` ``format``,
  filled by ``KVCache.write`` of random K and V (on the chip), on the kernel or XLA route.

:mod:`benchmarks.chip_time` times them on a lent TPU; :mod:`benchmarks.bundle_calibration`
compiles them for a TPU target and estimates them from the compiler's schedule. The same
file is also loaded by path inside a checkout of another commit (its ``emulate`` and
``benchmarks`` first on ``PYTHONPATH``; :func:`dump_main`) to dump the schedules of the
programs timed at that commit; it needs only the APIs those commits already had.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: Calls of the measured function in one timed program.
LOOP = 20
#: Calls in a program of ``benchmarks.word_time`` (the ``word/`` cases).
WORD_LOOP = 50
#: K, N of the single projection (Llama-3-8B's gate and up).
SHAPE = (4096, 14336)
#: (name, K, N) of one Llama-3-8B decoder layer's projections.
PROJECTIONS = (
    ("q", 4096, 4096),
    ("k", 4096, 1024),
    ("v", 4096, 1024),
    ("o", 4096, 4096),
    ("gate", 4096, 14336),
    ("up", 4096, 14336),
    ("down", 14336, 4096),
)
_CASE = re.compile(
    r"^(?:projection/(?P<scheme>[\w.]+)/m(?P<m>\d+)(?:/(?P<blocks>default|\d+x\d+x\d+))?"
    r"|layer/(?P<contender>bf16|xla|kernel)/m(?P<lm>\d+)"
    r"|attention/(?P<cache>\w+)/(?P<route>kernel|xla)"
    r"|stream/(?P<stream>bf16|i32)/(?P<sbk>\d+)x(?P<sbn>\d+)"
    r"|word/(?P<word>bf16|q4_k|q6_k|awq|int4|mxfp4|nvfp4|nf4)/m(?P<wm>\d+)/(?P<wk>\d+)x(?P<wn>\d+))$"
)


@dataclasses.dataclass(frozen=True)
class ChipCase:
    """One timed program (see the module docstring for the names)."""

    name: str

    def parts(self) -> dict[str, Any]:
        """The name's parts: kind ("projection" or "layer"), scheme or contender, M,
        block shape (None: the kernel's default)."""
        m = _CASE.match(self.name)
        if m is None:
            raise ValueError(
                f"case: {self.name!r} is not projection/<scheme>/m<M>[/<bm>x<bn>x<bk>|/default], "
                "layer/<bf16|xla|kernel>/m<M>, attention/<cache format>/<kernel|xla> or "
                "stream/<bf16|i32>/<bk>x<bn> or "
                "word/<bf16|q4_k|q6_k|awq|int4|mxfp4|nvfp4|nf4>/m<M>/<K>x<N>"
            )
        if m.group("word"):
            return {"kind": "word", "scheme": m.group("word"), "m": int(m.group("wm")),
                    "k": int(m.group("wk")), "n": int(m.group("wn"))}  # fmt: skip
        if m.group("stream"):
            return {"kind": "stream", "dtype": m.group("stream"),
                    "block_shape": (int(m.group("sbk")), int(m.group("sbn")))}  # fmt: skip
        if m.group("cache"):
            return {"kind": "attention", "cache": m.group("cache"), "route": m.group("route")}
        if m.group("contender"):
            return {"kind": "layer", "contender": m.group("contender"), "m": int(m.group("lm"))}
        blocks = m.group("blocks")
        shape = None if blocks in (None, "default") else tuple(int(v) for v in blocks.split("x"))
        return {"kind": "projection", "scheme": m.group("scheme"), "m": int(m.group("m")),
                "block_shape": shape}  # fmt: skip

    @property
    def loop(self) -> int:
        """Calls in the timed program: :data:`WORD_LOOP` for ``word/`` cases (what
        ``benchmarks.word_time`` times), else :data:`LOOP`."""
        return WORD_LOOP if self.name.startswith("word/") else LOOP

    def build(self, target: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The program (a function that pickles by reference) and its arguments (host
        arrays; weights built from a fixed seed), for ``target``."""
        p = self.parts()
        rng = np.random.default_rng(0)
        if p["kind"] == "layer":
            return _layer_program(p["contender"], p["m"], target, rng)
        if p["kind"] == "attention":
            return _attention_program(p["cache"], p["route"], rng)
        if p["kind"] == "stream":
            return _stream_program(p["dtype"], p["block_shape"])
        if p["kind"] == "word":
            return _word_program(p["scheme"], p["m"], p["k"], p["n"], target, rng)
        return _projection_program(p["scheme"], p["m"], p["block_shape"], target, rng)


def _projection_program(
    scheme: str, m: int, block_shape: tuple[int, ...] | None, target: str, rng: np.random.Generator
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    k, n = SHAPE
    x = np.asarray(rng.standard_normal((m, k)), dtype=jnp.bfloat16)
    if scheme == "bf16":
        w = np.asarray(rng.standard_normal((k, n)) * 0.02, dtype=jnp.bfloat16)
        return functools.partial(looped, call=_dense), (x, w)
    import emulate.pallas
    from benchmarks.qweights import NK, SCHEMES

    s = SCHEMES[scheme]
    q = s.build(k, n, rng)
    w = emulate.pallas.prepare_weight(q.T if s.dn == NK else q)
    call = functools.partial(_kernel, target=target, block_shape=block_shape)
    return functools.partial(looped, call=call), (x, w)


def _dense(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def _kernel(x: jax.Array, w: Any, *, target: str, block_shape: tuple[int, ...] | None) -> Any:
    import emulate.pallas

    return emulate.pallas.matmul(
        x, w, target=target, out_dtype=jnp.float32, block_shape=block_shape
    )


def first_element(y: jax.Array) -> jax.Array:
    """``y``'s first element (``y[0, 0]`` of a matrix) of a result computed whole: behind an
    optimization barrier, so that XLA does not push the slice into the computation and
    read only what that element needs (it did for ``jnp.dot`` with more than one row: 31 us
    a 117 MB bf16 projection at 64 rows on a v5e, against 195 us at one row). A Pallas
    call is computed whole either way."""
    return jax.lax.optimization_barrier(y)[(0,) * y.ndim]


def looped(x: jax.Array, w: Any, *, call: Callable[..., jax.Array], loop: int = LOOP) -> jax.Array:
    """``call(x, w)`` ``loop`` times, each call's x depending on the previous result."""

    def body(i: Any, c: jax.Array) -> jax.Array:
        return c + first_element(call(x + (c * 0).astype(x.dtype), w))

    return jax.lax.fori_loop(0, loop, body, jnp.float32(0))


def _word_program(
    scheme: str, m: int, k: int, n: int, target: str, rng: np.random.Generator
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The program ``benchmarks.word_time`` times for one scheme and shape (its weight
    builder, :data:`WORD_LOOP` calls)."""
    x = np.asarray(rng.standard_normal((m, k)), dtype=jnp.bfloat16)
    if scheme == "bf16":
        w = np.asarray(rng.standard_normal((k, n)), dtype=jnp.bfloat16)
        return functools.partial(looped, call=_dense, loop=WORD_LOOP), (x, w)
    import emulate.pallas

    q = emulate.pallas.prepare_weight(word_weight(scheme, k, n, rng)[0])
    call = functools.partial(_kernel, target=target, block_shape=None)
    return functools.partial(looped, call=call, loop=WORD_LOOP), (x, q)


def _float_weight(
    kind: str, k: int, n: int, rng: np.random.Generator, pow2: bool
) -> tuple[Any, np.ndarray]:
    """:func:`weight` of the float-coded schemes: MXFP4 (e2m1 codes, e8m0 scales per 32
    rows), NVFP4 (e4m3 scales per 16 rows in [0.25, 4], powers of two with ``pow2``, and
    a tensor scale) and bitsandbytes NF4 (uint4 codes into the NF4 table, f32 absmax per
    64 rows)."""
    import ml_dtypes

    import emulate

    codes = rng.integers(0, 16, (k, n)).astype(np.uint8)
    if kind == "nf4":
        table = emulate.codebooks.NF4.array().astype(np.float64)
        s = rng.uniform(0.01, 1.0, (k // 64, n)).astype(np.float32)
        q = emulate.QArray.from_parts(
            emulate.pack(codes.astype(ml_dtypes.uint4), axis=0), s, block_shape=(64, 1),
            codebook=emulate.codebooks.NF4,
        )  # fmt: skip
        return q, table[codes] * np.repeat(s.astype(np.float64), 64, axis=0)
    e2m1 = codes.view(ml_dtypes.float4_e2m1fn)
    v = e2m1.astype(np.float64)
    if kind == "mxfp4":
        e = rng.integers(-2, 3, (k // 32, n))
        s = np.ldexp(1.0, e).astype(ml_dtypes.float8_e8m0fnu)
        q = emulate.QArray.from_parts(emulate.pack(e2m1, axis=0), s, block_shape=(32, 1))
        return q, v * np.repeat(s.astype(np.float64), 32, axis=0)
    if pow2:
        s = np.ldexp(1.0, rng.integers(-2, 3, (k // 16, n))).astype(ml_dtypes.float8_e4m3fn)
    else:
        s = rng.uniform(0.25, 4.0, (k // 16, n)).astype(ml_dtypes.float8_e4m3fn)
    ts = np.float32(0.5 if pow2 else 0.75)
    q = emulate.QArray.from_parts(
        emulate.pack(e2m1, axis=0), s, block_shape=(16, 1), tensor_scale=ts
    )
    return q, v * np.repeat(s.astype(np.float64), 16, axis=0) * np.float64(ts)


def _q6_k_weight(k: int, n: int, rng: np.random.Generator, pow2: bool) -> tuple[Any, np.ndarray]:
    """:func:`word_weight` of GGUF Q6_K: uint6 codes with zero point 32, int8 scale codes
    per 16 rows times a float16 ``d`` per 256 rows (with ``pow2``: codes in -8..7 and
    ``d`` 2**-1 or 1, so that with integer activations in -8..8 every partial sum over
    K = 2304 rows is a multiple of 1/2 under 2**23: exact in f32)."""
    import emulate

    codes = rng.integers(0, 64, (k, n))
    if pow2:
        sc = rng.integers(-8, 8, (k // 16, n))
        d = np.ldexp(1.0, rng.integers(-1, 1, (k // 256, n))).astype(np.float16)
    else:
        sc = rng.integers(-128, 128, (k // 16, n))
        d = (rng.random((k // 256, n)) * 0.01 + 1e-3).astype(np.float16)
    level = emulate.QArray.from_parts(sc.astype(np.int8), d, block_shape=(16, 1))
    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(np.uint8), "uint6", axis=0), level, block_shape=(16, 1),
        zero_points=32,
    )  # fmt: skip
    g = np.repeat(np.arange(k // 16), 16)
    dg = np.repeat(d.astype(np.float64), 16, axis=0)
    return q, (codes - 32.0) * (sc * dg)[g]


def word_weight(
    kind: str, k: int, n: int, rng: np.random.Generator, pow2: bool = False
) -> tuple[Any, np.ndarray]:
    """The weight ``benchmarks.word_time`` times for scheme ``kind`` (``"q4_k"``: GGUF
    Q4_K-like two-level scales and mins; ``"q6_k"``: GGUF Q6_K-like, :func:`_q6_k_weight`;
    ``"awq"``: float16 scales and packed zero points per 128 rows; ``"int4"``: plain
    codes; ``"mxfp4"``, ``"nvfp4"``, ``"nf4"``: :func:`_float_weight`), K x N: (the QArray
    or int4 array, its exact (K, N) values in float64). ``pow2``: power-of-two scales
    (every partial sum of integer activations exact)."""
    import ml_dtypes

    import emulate

    if kind in ("mxfp4", "nvfp4", "nf4"):
        return _float_weight(kind, k, n, rng, pow2)
    if kind == "q6_k":
        return _q6_k_weight(k, n, rng, pow2)
    if kind == "int4":
        codes = rng.integers(-8, 8, (k, n))
        return codes.astype(ml_dtypes.int4), codes.astype(np.float64)
    codes = rng.integers(0, 16, (k, n))
    q4 = emulate.pack(codes.astype(ml_dtypes.uint4), axis=0)
    if kind == "awq":
        groups = k // 128
        if pow2:
            s = np.ldexp(1.0, rng.integers(-2, 3, (groups, n))).astype(np.float16)
        else:
            s = rng.uniform(1e-3, 1e-2, (groups, n)).astype(np.float16)
        z = rng.integers(0, 16, (groups, n))
        q = emulate.QArray.from_parts(
            q4, s, block_shape=(128, 1), zero_points=emulate.pack(z.astype(ml_dtypes.uint4), axis=1)
        )
        rows = np.repeat(np.arange(groups), 128)
        return q, (codes - z[rows]) * s.astype(np.float64)[rows]
    groups, supers = k // 32, k // 256
    sc, mn = rng.integers(0, 64, (groups, n)), rng.integers(0, 64, (groups, n))
    if pow2:
        d = np.ldexp(1.0, rng.integers(-1, 2, (supers, n))).astype(np.float16)
    else:
        d = (rng.random((supers, n)) * 0.01 + 1e-3).astype(np.float16)
    dmin = (-(d.astype(np.float32) / 2)).astype(np.float16)

    def level(c: np.ndarray, s: np.ndarray) -> emulate.QArray:
        six = emulate.pack(c.astype(np.uint8), "uint6", axis=0)
        return emulate.QArray.from_parts(six, s, block_shape=(8, 1))

    q = emulate.QArray.from_parts(q4, level(sc, d), block_shape=(32, 1), offsets=level(mn, dmin))
    g = np.repeat(np.arange(groups), 32)
    dg = np.repeat(d.astype(np.float64), 8, axis=0)
    mg = np.repeat(dmin.astype(np.float64), 8, axis=0)
    return q, codes * (sc * dg)[g] + (mn * mg)[g]


#: Rows of the streamed array by dtype: 4096 x 14336 bf16 or 2048 x 14336 int32 (117 MB).
STREAM_ROWS = {"bf16": 4096, "i32": 2048}


def _stream_program(
    dtype: str, block_shape: tuple[int, int]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    dt = {"bf16": jnp.bfloat16, "i32": jnp.int32}[dtype]
    w = np.ones((STREAM_ROWS[dtype], SHAPE[1]), dtype=dt)
    x = np.zeros((8, SHAPE[1]), dtype=np.float32)
    return functools.partial(looped_stream, block_shape=block_shape), (x, w)


def stream(x: jax.Array, w: jax.Array, block_shape: tuple[int, int]) -> jax.Array:
    """A Pallas kernel that reads ``w`` (K, N) block by block, ``block_shape`` (bk, bn) a
    grid step over a (N / bn, K / bk) grid, and does next to nothing with it (adds its
    first 8 rows to ``x``'s (8, bn) block): the time of its DMAs alone, for the bundle
    model's DMA law (``benchmarks.bundle_calibration``)."""
    from jax.experimental import pallas as pl

    bk, bn = block_shape
    k, n = w.shape

    def kernel(x_ref: Any, w_ref: Any, o_ref: Any) -> None:
        @pl.when(pl.program_id(1) == 0)
        def _() -> None:
            o_ref[...] = x_ref[...]

        o_ref[...] += w_ref[0:8, :].astype(jnp.float32)

    return pl.pallas_call(
        kernel,
        grid=(n // bn, k // bk),
        in_specs=[pl.BlockSpec((8, bn), lambda j, i: (0, j)),
                  pl.BlockSpec((bk, bn), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((8, bn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((8, n), jnp.float32),
    )(x, w)  # fmt: skip


def looped_stream(x: jax.Array, w: jax.Array, *, block_shape: tuple[int, int]) -> jax.Array:
    """:func:`stream` :data:`LOOP` times, each call's x depending on the previous result."""

    def body(i: Any, c: jax.Array) -> jax.Array:
        return c + first_element(stream(x + c * 0, w, block_shape))

    return jax.lax.fori_loop(0, LOOP, body, jnp.float32(0))


def _layer_program(
    contender: str, m: int, target: str, rng: np.random.Generator
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import emulate
    from benchmarks.qweights import q4_k_weight

    x = np.asarray(rng.standard_normal((m, 4096)), dtype=jnp.bfloat16)
    if contender == "bf16":
        ws: dict[str, Any] = {
            name: np.asarray(rng.standard_normal((k, n)) * 0.02, dtype=jnp.bfloat16)
            for name, k, n in PROJECTIONS
        }
    else:
        ws = {name: q4_k_weight(k, n, rng).T for name, k, n in PROJECTIONS}
        if contender == "kernel":  # prepared for the target (on the host: left as they are)
            ws = emulate.prepare_weights(ws, target=target)
    route = "xla" if contender == "xla" else "auto"
    return functools.partial(looped_layer, route=route), (x, ws)


#: (sequences, KV heads, query heads a KV head, head_dim, tokens) of the attention cases.
ATTENTION = (16, 8, 4, 128, 4096)


def _attention_program(
    fmt: str, route: str, rng: np.random.Generator
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import emulate.kvcache

    b, kvh, g, hd, t = ATTENTION
    cache = emulate.kvcache.KVCache.create(1, b, kvh, hd, t, fmt)
    k, v = (jnp.asarray(rng.standard_normal((b, t, kvh, hd)), jnp.bfloat16) for _ in range(2))
    cache = jax.jit(lambda c, k, v: c.write(0, k, v).advance(t))(cache, k, v)
    q = np.asarray(rng.standard_normal((b, 1, kvh * g, hd)), dtype=jnp.bfloat16)
    return functools.partial(looped_attention, route=route), (q, cache)


def looped_attention(q: jax.Array, cache: Any, *, route: str) -> jax.Array:
    """``emulate.kvcache.attention`` of ``q`` over layer 0 of ``cache`` :data:`LOOP` times
    on route ``route``, each call's queries depending on the previous result."""
    import emulate
    import emulate.kvcache

    def body(i: Any, c: jax.Array) -> jax.Array:
        out = emulate.kvcache.attention(q + (c * 0).astype(q.dtype), cache, 0)
        return c + first_element(out).astype(jnp.float32)

    with emulate.use_route(route):
        return jax.lax.fori_loop(0, LOOP, body, jnp.float32(0))


def looped_layer(x: jax.Array, ws: dict[str, Any], *, route: str) -> jax.Array:
    """:func:`layer` :data:`LOOP` times on route ``route``."""
    import emulate

    def body(i: Any, c: jax.Array) -> jax.Array:
        return layer(x + (c * 0).astype(x.dtype), ws)[:, : x.shape[1]] * 0 + c

    with emulate.use_route(route):
        return jax.lax.fori_loop(0, LOOP, body, jnp.zeros(x.shape, jnp.float32))


def layer(x: jax.Array, ws: dict[str, Any]) -> jax.Array:
    """The projections of one layer on ``x`` (M, 4096) bf16 through ``emulate.matmul``,
    chained as a decoder layer chains them (attention itself left out): a (M, 4096) f32
    result."""
    import emulate

    def mm(a: jax.Array, w: Any) -> jax.Array:
        return emulate.matmul(a.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)

    q, k, v = mm(x, ws["q"]), mm(x, ws["k"]), mm(x, ws["v"])
    h = mm(q + jnp.tile(k + v, (1, 4)), ws["o"])
    g, u = mm(h, ws["gate"]), mm(h, ws["up"])
    return mm(jax.nn.silu(g) * u, ws["down"])


def dump(directory: str, names: list[str], target: str) -> dict[str, Any]:
    """Compile each case for ``target`` in this process (its libtpu started with dump
    flags into ``directory``); for each, the files its compile added, or why it failed."""
    import emulate.compiler

    out: dict[str, Any] = {}
    for name in names:
        before = set(os.listdir(directory))
        jax.clear_caches()  # a program JAX compiled before would leave no files
        try:
            fn, args = ChipCase(name).build(target)
            emulate.compiler.compile(fn, *args, target=target)
        except Exception as e:  # noqa: BLE001 - reported per case
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        out[name] = {"files": sorted(set(os.listdir(directory)) - before)}
    return out


def dump_main(argv: list[str]) -> int:
    """``DIR TARGET CASE...``: :func:`dump`, its result as one JSON line on stdout (the
    calibration loads this file by path in a checkout of another commit and calls it)."""
    if len(argv) < 3:
        print("usage: dump_main DIR TARGET CASE...", file=sys.stderr)
        return 2
    directory, target, names = argv[0], argv[1], argv[2:]
    print(json.dumps(dump(directory, names, target)))
    return 0
