"""emulate.pallas.matmul in TPU interpret mode on the CPU: exact classes bit for bit against
emulate.reference on each route (native int8, int8 after scaling, bf16 and f32 with exact
K-chunks), ragged shapes and several block shapes; packed weights stay packed; defaults
from the target; bad input.

Interpret mode compiles each distinct kernel once (about 2 s here): every case below is a
different route or layout, not a repeat.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate import compiler, formats, reference, targets
from emulate.pallas import compute, matmul_config, matmul_kernel

DN = (((1,), (0,)), ((), ()))


def _draw(fmt: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Values of ``fmt``: uniform over the finite codes, a quarter of them the extreme."""
    f = formats.get(fmt)
    if f.is_integer:
        v = rng.integers(int(f.min), int(f.max) + 1, shape)
        v[rng.random(shape) < 0.25] = int(f.min) if f.signed else int(f.max)
        return v.astype(f.dtype)
    codes = rng.integers(0, 1 << f.bits, shape).astype(np.uint8)
    extreme = np.array([f.max], np.float64).astype(f.dtype).view(np.uint8)[0]
    codes[rng.random(shape) < 0.25] = extreme | (1 << (f.bits - 1))  # -max
    return codes.view(f.dtype)


def _weight(w: np.ndarray) -> object:
    f = formats.get(w.dtype)
    return emulate.pack(w, axis=0) if f.packable else w


# (x format, w format, target, out dtype, (M, K, N), block shape): one per route / layout.
EXACT_CASES = [
    # bf16 route, int8 values exact in f32 for K <= 1024 per dot; K = 1100 passes 2**24.
    ("int8", "int8", "tpu_v4", "int32", (37, 1100, 200), (32, 128, 512)),
    # native int8 x int8, default blocks (one K step).
    ("int8", "int8", "tpu_v5e", "int32", (5, 300, 130), None),
    # f32 route (TPU v2 has only f32), exact int32 limbs rounded once into bf16.
    ("int8", "int8", "tpu_v2", "bfloat16", (8, 1100, 130), (8, 128, 256)),
    # packed int4 weight: two nibble planes, bf16 route.
    ("int8", "int4", "tpu_v4", "int32", (16, 513, 129), (16, 128, 256)),
    # packed int4, int8 route, float result from limbs. Long (EMULATE_LONG_TESTS=1): the
    # int8 route runs by default with fp4 on v5e (a float32 result from limbs too), packed
    # int4 on v4.
    pytest.param(
        "int8",
        "int4",
        "tpu_v6e",
        "float32",
        (40, 700, 260),
        (32, 256, 256),
        marks=pytest.mark.long,
    ),
    # fp4 x fp4: int8 route, both sides scaled by 2.
    ("float4_e2m1fn", "float4_e2m1fn", "tpu_v5e", "float32", (9, 260, 140), (32, 128, 256)),
    # fp4 x fp4 on v7x: bf16 route, rounded once into bf16. Long (EMULATE_LONG_TESTS=1):
    # the bf16 route runs by default on v4 (int8, int4), the fp4 decode on v5e and the
    # rounding into bf16 on v2.
    pytest.param(
        "float4_e2m1fn",
        "float4_e2m1fn",
        "tpu_v7x",
        "bfloat16",
        (9, 600, 140),
        (16, 128, 512),
        marks=pytest.mark.long,
    ),
    # uint8 x uint8: Pallas' dot is signed, so bf16 with 256-deep chunks inside a 512 tile.
    ("uint8", "uint8", "tpu_v5e", "int32", (8, 1000, 128), (16, 128, 512)),
    # packed float6 (four codes in three bytes), x as float6 codes, scaled by 8 each.
    ("float6_e2m3fn", "float6_e2m3fn", "tpu_v4", "float32", (8, 1030, 130), (16, 128, 512)),
    # default result type: int8 x uint4 gives int8 (the int32 sum wrapped), as lax does.
    ("int8", "uint4", "tpu_v5e", None, (8, 300, 128), (32, 128, 256)),
]


@pytest.mark.parametrize("lhs, rhs, target, out, shape, block", EXACT_CASES)
def test_exact_classes_are_bit_identical_to_the_reference(lhs, rhs, target, out, shape, block):
    m, k, n = shape
    rng = np.random.default_rng(zlib.crc32(f"{lhs} {rhs} {target}".encode()))
    x, w = _draw(lhs, (m, k), rng), _draw(rhs, (k, n), rng)
    got = emulate.pallas.matmul(x, _weight(w), target=target, block_shape=block, out_dtype=out)
    want = reference.dot_general(x, w, DN, preferred_element_type=out)
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == (m, n)
    assert got.tobytes() == want.tobytes()


def test_int8_sums_past_two_to_the_24_stay_exact():
    # (-128)**2 = 2**14, 1099 times, plus 1: 18006017 is odd and past 2**24, so one f32
    # dot over K = 1100 cannot return it; 1024-deep dots, each exact, summed in int32 do.
    x = np.full((8, 1100), -128, np.int8)
    w = np.full((1100, 128), -128, np.int8)
    x[0, -1] = w[-1, 0] = 1
    got = emulate.pallas.matmul(
        x, w, target="tpu_v4", block_shape=(32, 128, 1100 // 128 * 128 + 128), out_dtype=jnp.int32
    )
    assert np.asarray(got[:2, :2]).tolist() == [
        [1099 * 2**14 + 1, 1099 * 2**14 - 128],
        [1099 * 2**14 - 128, 1100 * 2**14],
    ]
    r = compute.in_kernel("int8", "int8", target="tpu_v4", preferred_element_type="int32")
    assert (r.method, r.lhs_compute, r.k_chunk) == ("bf16", "bfloat16", 1024)


def _pallas_scope(jaxpr):
    """The (sub-)jaxpr that holds the pallas_call: inside the jit, custom_vjp and
    custom_vmap wrappers of emulate.pallas.matmul."""
    if any(e.primitive.name == "pallas_call" for e in jaxpr.eqns):
        return jaxpr
    for e in jaxpr.eqns:
        for v in e.params.values():
            sub = getattr(v, "jaxpr", v)
            if isinstance(sub, jax.extend.core.Jaxpr):
                found = _pallas_scope(sub)
                if found is not None:
                    return found
    return None


# Call wrappers, the kernel, and the HBM placement of its operands (lowered to nothing).
_WRAPPERS = {
    "with_memory_space_constraint",
    "pjit",
    "jit",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "custom_vmap_call",
    "closed_call",
    "pallas_call",
}


def _ops_on(jaxpr, aval):
    """The primitives (other than call wrappers and the kernel) that take an operand of
    ``aval``, anywhere in ``jaxpr`` and its sub-jaxprs outside the kernel's own (where a
    loaded block can have the weight's shape)."""
    found = []
    for e in jaxpr.eqns:
        if e.primitive.name not in _WRAPPERS and any(
            getattr(v, "aval", None) == aval for v in e.invars
        ):
            found.append(e.primitive.name)
        if e.primitive.name == "pallas_call":
            continue
        for v in e.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    found += _ops_on(inner, aval)
    return found


X = ((4, 1024), "bfloat16")  # x as it is (4 rows, all of K)


def _pallas_operands(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    (call,) = [e for e in _pallas_scope(jaxpr.jaxpr).eqns if e.primitive.name == "pallas_call"]
    return jaxpr, [(v.aval.shape, v.aval.dtype.name) for v in call.invars]


@pytest.mark.parametrize(
    "w, operands",
    [
        # 8-bit weights: the array itself (float8 is bitcast to int8 in the kernel).
        (jnp.zeros((1024, 512), jnp.int8), [X, ((1024, 512), "int8")]),
        (jnp.zeros((1024, 512), jnp.float8_e4m3fn), [X, ((1024, 512), "float8_e4m3fn")]),
        # K-planar int4 and float6: K/2 and 3K/4 bytes, x as it is.
        (emulate.pallas.prepare_weight(np.zeros((1024, 512), ml_dtypes.int4)),
         [X, ((512, 512), "uint8")]),
        (emulate.pallas.prepare_weight(np.zeros((1024, 512), np.uint8), "e2m3"),
         [X, ((768, 512), "uint8")]),
        # emulate.pack's layout: the bytes as packed, x in two column planes.
        (emulate.pack(np.zeros((1024, 512), ml_dtypes.int4), axis=0),
         [((4, 512), "bfloat16")] * 2 + [((512, 512), "uint8")]),
    ],
)  # fmt: skip
def test_the_kernel_reads_the_weight_as_stored(w, operands):
    x = jnp.zeros((4, 1024), jnp.bfloat16)

    def fn(x, w):
        return emulate.pallas.matmul(x, w, target="tpu_v5e", interpret=False)

    jaxpr, avals = _pallas_operands(fn, x, w)
    assert avals == operands
    # nothing converts, pads, reshapes or copies the weight outside the kernel
    data = w.data if hasattr(w, "data") else w
    aval = jax.core.ShapedArray(data.shape, data.dtype)
    assert _ops_on(jaxpr.jaxpr, aval) == []


def test_a_six_bit_packed_weight_is_put_in_the_k_planar_layout():
    # emulate.pack's float6 layout has three bytes per group: the kernel reads the layout
    # prepare_weight keeps. A traced weight in a TPU program would be rearranged on every
    # call: refused, naming the fix; a constant is rearranged once, as the program is traced.
    w6 = emulate.pack(np.zeros((1024, 512), ml_dtypes.float6_e2m3fn), axis=0)
    x = jnp.zeros((4, 1024), jnp.bfloat16)

    def tpu(x, w):
        return emulate.pallas.matmul(x, w, target="tpu_v5e", interpret=False)

    with pytest.raises(emulate.pallas.RelayoutError, match=r"^w: a Packed float6_e2m3fn\[1024"):
        jax.make_jaxpr(tpu)(x, w6)
    _, avals = _pallas_operands(lambda x: tpu(x, w6), x)
    assert avals == [((4, 1024), "bfloat16"), ((768, 512), "uint8")]


def _config(x_fmt, w_fmt, target, m, n, k, group=1, out=None):
    t = targets.get(target)
    r = compute.in_kernel(x_fmt, w_fmt, target=t, preferred_element_type=out)
    stored = matmul_config.Stored("planar" if group > 1 else "dense", "uint8", k, group)
    return matmul_config.config(r, t, m, n, k, stored, False, None, True)


def test_default_blocks_come_from_the_target():
    # bn is twice the MXU width; bk fills 2**18 elements of weight tile; bm follows M.
    # At decode a 4-bit weight takes the word step's (2048, 512) blocks.
    c = _config("bfloat16", "int4", "tpu_v5e", 1, 4096, 4096, group=2)
    assert (c.bm, c.bn, c.bk) == (1, 512, 2048) and c.word_step  # bm: a block of M
    assert c.x_resident  # x's (1, 4096) block is fetched once
    assert c.grid == (1, 8, 2)
    c = _config("bfloat16", "uint8", "tpu_v5e", 1, 4096, 4096)
    assert (c.bm, c.bn, c.bk) == (1, 256, 1024) and not c.word_step
    c = _config("bfloat16", "int4", "tpu_v6e", 512, 8192, 8192, group=2)
    assert (c.bm, c.bn, c.bk) == (512, 512, 2048)  # long x: one row block, read once
    assert c.word_step  # one group a dot: no partial sums to keep apart
    # a prefill of 2048 rows: x resident in 1024-row blocks, so the weight is read twice,
    # not 8 times in the default 256-row blocks (2048 rows: x double-buffered at 2 bytes,
    # 32 MiB, its step slice as f32 and bf16, 24 MiB, and the partial sums, 12 MiB, pass
    # half of v5e's 128 MiB)
    c = _config("bfloat16", "int4", "tpu_v5e", 2048, 14336, 4096, group=2)
    assert (c.bm, c.grid[0], c.x_resident, c.word_step) == (1024, 2, True, True)
    assert c.vmem_bytes <= 64 << 20
    c = _config("bfloat16", "uint8", "tpu_v5e", 2048, 14336, 4096)  # x at 4 bytes counted
    assert (c.bm, c.grid[0], c.x_resident) == (1024, 2, True)
    c = _config("int8", "int8", "tpu_v5e", 3, 200, 300)
    assert (c.bm, c.bn, c.bk) == (3, 256, 384)  # clamped to the padded problem
    c = _config("float32", "int8", "tpu_v4", 30, 200, 300)
    assert c.bm == 32  # f32 blocks tile by 8 rows
    for t in ("tpu_v4", "tpu_v5e", "tpu_v6e", "tpu_v7x"):
        c = _config("bfloat16", "float8_e4m3fn", t, 512, 8192, 8192)
        assert c.vmem_bytes <= targets.get(t).vmem_capacity_bytes // 2
        assert c.bn == 2 * targets.get(t).mxu_column_size


def test_interpret_mode_is_the_default_off_tpu():
    assert jax.default_backend() == "cpu"
    assert matmul_kernel.interpret_mode(None) is True
    assert matmul_kernel.interpret_mode(None, jnp.ones(3)) is True
    assert matmul_kernel.interpret_mode(False) is False
    assert matmul_kernel.interpret_mode(True, jnp.ones(3)) is True
    with pytest.raises(TypeError, match=r"^interpret: expected None, True or False, got 1$"):
        matmul_kernel.interpret_mode(1)


def test_the_default_compiles_the_kernel_for_a_tpu_target():
    """interpret=None under emulate.compiler.compile (a TPU compile-only default device)
    builds the Mosaic kernel: one tpu_custom_call and no temporaries, where the interpret
    program would have neither the call nor zero temporaries."""
    x = jax.ShapeDtypeStruct((8, 256), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((256, 256), jnp.int8)
    device = compiler.device("tpu_v5e")
    with jax.default_device(device):
        assert matmul_kernel.interpret_mode(None) is False
    got = compiler.compile(
        lambda x, w: emulate.pallas.matmul(x, w, target="tpu_v5e"), x, w, target="tpu_v5e"
    )
    assert got.as_text().count('custom_call_target="tpu_custom_call"') == 1
    assert got.memory_analysis().temp_size_in_bytes == 0


def test_a_quantized_kernel_lowered_with_no_tpu_in_sight_says_what_to_do():
    """Pallas lowers the integer index arithmetic of a quantized weight's kernel for a
    known chip only ("Unsupported TPU device kind: cpu" otherwise): interpret=False with
    no TPU in sight is refused with what to do; with the target's compile-only device as
    JAX's default device, the same call lowers for TPU."""
    q = emulate.quantize(np.ones((256, 128), np.float32), emulate.mx.MXFP4, axis=0)
    q = emulate.pallas.prepare_weight(q)  # else laid out again on every call (refused)
    x = jax.ShapeDtypeStruct((8, 256), jnp.bfloat16)

    def f(x, q):
        return emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32", interpret=False)

    with pytest.raises(ValueError) as e:
        jax.jit(f).trace(x, q)
    assert str(e.value) == (
        "interpret: False builds the Mosaic kernel of a quantized weight, which Pallas lowers "
        'for a known TPU only (else "Unsupported TPU device kind: cpu"), and no TPU is in '
        "sight (JAX's default backend is cpu): compile with emulate.compiler.compile(fn, "
        "*specs, target=...), or trace and lower inside `with "
        "jax.default_device(emulate.compiler.device(target)):`; interpret=None runs the "
        "kernel in interpret mode here"
    )
    with jax.default_device(compiler.device("tpu_v5e")):
        lowered = jax.jit(f).trace(x, q).lower(lowering_platforms=("tpu",))
    assert "tpu_custom_call" in lowered.as_text()


def _i8(*shape):
    return np.ones(shape, np.int8)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: emulate.pallas.matmul(_i8(4, 8), _i8(8, 4), target="cpu"), ValueError,
         r"^target: emulate.pallas.matmul is a TPU kernel and the target is cpu; "),
        (lambda: emulate.pallas.matmul(_i8(4, 8), _i8(9, 4), target="v5e"), ValueError,
         r"^x, w: x's K \(8\) differs from w's K \(9\); x int8\[4, 8\], w int8\[9, 4\]$"),
        (lambda: emulate.pallas.matmul(
            _i8(4, 8), emulate.pack(np.zeros((8, 4), ml_dtypes.int4), axis=1), target="v5e"),
         ValueError, r"^w: a Packed weight must be 2-D \(K, N\) and packed along K \(axis 0\); "
         r"got shape \(8, 4\) packed along axis 1"),
        (lambda: emulate.pallas.matmul(_i8(4, 8), jnp.ones((8, 4), jnp.bfloat16), target="v5e"),
         ValueError, r"^w: a bfloat16 weight needs no decoding"),
        (lambda: emulate.pallas.matmul(_i8(4, 8), _i8(2, 8, 4), target="v5e"), ValueError,
         r"^w: expected a 2-D \(K, N\) weight, got shape \(2, 8, 4\)$"),
        (lambda: emulate.pallas.matmul([[1]], _i8(8, 4), target="v5e"), TypeError,
         r"^x: expected an array, uint8 codes with x_format=, or a Packed array; got list$"),
        (lambda: emulate.pallas.matmul(_i8(4, 8), "w", target="v5e"), TypeError,
         r"^w: expected an array, uint8 codes with w_format=, a Packed array or a "
         r"KernelWeight; got str$"),
        (lambda: emulate.pallas.matmul(
            jnp.ones((4, 8), jnp.bfloat16), _i8(8, 4), target="v5e", block_shape=(10, 128, 128)),
         ValueError, r"^block_shape: bm = 10 must be a multiple of 16 \(the sublane tiling of "
         r"bfloat16 blocks\)$"),
        (lambda: emulate.pallas.matmul(
            _i8(4, 8), _i8(8, 4), target="v5e", block_shape=(32, 100, 128)),
         ValueError, r"^block_shape: bn = 100 must be a multiple of 128 \(the lane width\)$"),
        (lambda: emulate.pallas.matmul(
            _i8(4, 8), emulate.pack(np.zeros((8, 4), ml_dtypes.int4), axis=0), target="v5e",
            block_shape=(32, 128, 128)),
         ValueError, r"^block_shape: bk = 128 must be a multiple of 256 \(the lane width times "
         r"the 2 codes packed along K per byte group\)$"),
        (lambda: emulate.pallas.matmul(_i8(4, 8), _i8(8, 4), target="v5e", block_shape=128),
         TypeError, r"^block_shape: expected \(bm, bn, bk\), got 128$"),
        (lambda: emulate.pallas.matmul(
            _i8(4, 8), _i8(8, 4), target="v5e", block_shape=(32, 128, 0)),
         TypeError, r"^block_shape: bk must be a positive int, got 0$"),
        (lambda: emulate.pallas.matmul(
            _i8(4, 8), _i8(8, 4), target="v4", block_shape=(1024, 4096, 4096)),
         ValueError, r"^block_shape: \(1024, 4096, 4096\) needs about \d+ bytes of VMEM, more "
         r"than tpu_v4's 16777216; use smaller blocks$"),
        (lambda: emulate.pallas.matmul(_i8(4, 8), _i8(8, 4), target="v5e", interpret="yes"),
         TypeError, r"^interpret: expected None, True or False, got 'yes'$"),
        (lambda: emulate.pallas.matmul(
            np.zeros((4, 8), np.uint8), np.zeros((8, 4), np.uint8), target="v5e",
            x_format="e2m3", w_format="e2m3"),
         ValueError, r"^out_dtype: the result type would be float6_e2m3fn, which XLA cannot "
         r"hold; pass out_dtype \(e.g. jnp.float32\)$"),
    ],
)  # fmt: skip
def test_bad_input_names_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_too_long_exact_contraction_is_refused():
    k = 2**26
    x = jax.ShapeDtypeStruct((8, k), jnp.int8)
    w = jax.ShapeDtypeStruct((k, 128), jnp.int8)

    def fn(x, w):
        return emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype=jnp.float32)

    with pytest.raises(ValueError, match=r"^x, w: a contraction of K = 67108864 in blocks of "):
        jax.eval_shape(fn, x, w)


def test_empty_dimensions_give_zeros_without_a_kernel():
    got = emulate.pallas.matmul(np.ones((3, 0), np.int8), np.ones((0, 5), np.int8), target="v4")
    assert got.dtype == jnp.int8 and np.asarray(got).tolist() == [[0] * 5] * 3
    got = emulate.pallas.matmul(
        jnp.ones((0, 4), jnp.bfloat16), np.ones((4, 2), np.int8), target="v4", out_dtype="f32"
    )
    assert got.shape == (0, 2) and got.dtype == jnp.float32
