"""Rounding modes: which way a value between two neighbours of a format goes.

:func:`emulate.encode` and :func:`emulate.quantize` take ``rounding=`` (one of
:data:`ROUNDINGS`). The encoder reduces every finite input to an integer magnitude
``full`` (``< 2**24``: an f32 significand) and a right shift, ``|x| = full * 2**-shift``
in units of the target's quantum; this module decides whether the truncated magnitude
``full >> shift`` is incremented, and whether a finite overflow lands on the format's
largest value instead of Inf/NaN (directed modes, as IEEE 754 says).

Stochastic rounding with ``n`` random bits follows gfloat's ``RoundMode.Stochastic``: the
fraction ``delta = (full mod 2**shift) / 2**shift`` is first rounded to ``n`` bits (to
nearest, ties to even) giving ``d / 2**n``, and the magnitude goes up exactly when
``d + r >= 2**n`` for the element's random integer ``r`` in ``[0, 2**n)``. So over the
``2**n`` values of ``r`` it goes up ``d`` times: with probability ``delta`` whenever the
dropped bits fit in ``n`` bits (then the expectation is ``x`` exactly), else within
``2**-(n+1)`` of it. Element ``i`` takes ``r`` from the top ``n`` bits of
``jax.random.bits(key, x.shape, jnp.uint32)[i]``: the result is a function of the key,
the shape and the values, reproducible under jit and vmap; or ``r`` is given
(:func:`emulate.encode`'s ``rbits``, gfloat's ``srbits``).

gfloat's three other stochastic modes, bit for bit (its ``round_float`` and
``round_ndarray`` agree on them):

- "stochastic_odd" (``StochasticOdd``): ``delta`` rounded to ``n`` bits with ties to odd,
  then as "stochastic";
- "stochastic_fast" (``StochasticFast``): up when ``delta + (r + 1/2) / 2**n >= 1``;
- "stochastic_fastest" (``StochasticFastest``): up when ``delta + r / 2**n >= 1``:
  ``delta`` truncated to ``n`` bits.

gfloat evaluates the last two sums in float64, which rounds a sum in
``[1 - 2**-54, 1)`` up to 1: emulate does the same (possible only with ``n >= 29``, for
float32 inputs whose dropped fraction has bits below ``2**-54``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "ROUNDINGS",
    "STOCHASTIC",
    "MAX_RANDOM_BITS",
    "check_rounding",
    "random_integers",
    "increments",
    "increments_below",
    "round_to_integer",
    "overflow_to_max",
]

#: The rounding modes, the default first.
ROUNDINGS = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "stochastic",
    "stochastic_odd",
    "stochastic_fast",
    "stochastic_fastest",
)

#: The modes that take random bits (``key`` or ``rbits``, and ``random_bits``).
STOCHASTIC = ("stochastic", "stochastic_odd", "stochastic_fast", "stochastic_fastest")

#: The most random bits one element may use (one uint32 draw each).
MAX_RANDOM_BITS = 32

# Shifts beyond this drop every bit of a 24-bit significand, and more than half of it.
_CAP = 25


def check_rounding(
    rounding: object,
    key: object,
    random_bits: object,
    rbits: object = None,
    *,
    takes_rbits: bool = False,
) -> int:
    """Validate the rounding arguments of :func:`emulate.encode` / :func:`emulate.quantize`;
    returns the number of random bits (0 unless ``rounding`` is one of :data:`STOCHASTIC`).
    ``takes_rbits``: the caller also takes explicit random integers (``rbits``), which the
    message for a missing ``key`` then offers.

    Raises:
      ValueError: an unknown mode; a stochastic mode without ``key`` (or ``rbits``) or
        ``random_bits``; both ``key`` and ``rbits``; ``random_bits`` outside ``[1, 32]``;
        ``key``, ``rbits`` or ``random_bits`` given to another mode (they would be
        ignored).
      TypeError: ``random_bits`` not an int, or ``key`` not a JAX PRNG key.
    """
    if not isinstance(rounding, str) or rounding not in ROUNDINGS:
        raise ValueError(f"rounding: expected one of {ROUNDINGS}, got {rounding!r}")
    if rounding not in STOCHASTIC:
        for arg, val in (("key", key), ("random_bits", random_bits), ("rbits", rbits)):
            if val is not None:
                raise ValueError(
                    f"{arg}: only the stochastic modes ({', '.join(STOCHASTIC)}) use it, got "
                    f"rounding={rounding!r}"
                )
        return 0
    if key is None and rbits is None:
        alternative = ", or the random integers themselves as rbits=" if takes_rbits else ""
        raise ValueError(
            f"key: rounding={rounding!r} needs a jax.random key (jax.random.key(seed))"
            f"{alternative}; the same key gives the same rounding"
        )
    if key is not None and rbits is not None:
        raise ValueError("key, rbits: give one source of random bits, got both")
    if random_bits is None:
        raise ValueError(
            f"random_bits: rounding={rounding!r} needs the number of random bits per "
            f"element, 1 to {MAX_RANDOM_BITS}"
        )
    if isinstance(random_bits, (bool, np.bool_)) or not isinstance(random_bits, (int, np.integer)):
        raise TypeError(
            f"random_bits: expected an int from 1 to {MAX_RANDOM_BITS}, got "
            f"{type(random_bits).__name__} {random_bits!r}"
        )
    if not 1 <= random_bits <= MAX_RANDOM_BITS:
        raise ValueError(f"random_bits: expected 1 to {MAX_RANDOM_BITS}, got {random_bits}")
    if key is not None:
        _check_key(key)
    return int(random_bits)


def _check_key(key: object) -> None:
    dtype = getattr(key, "dtype", None)
    shape = getattr(key, "shape", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if shape == ():
            return
        raise ValueError(f"key: expected one key (shape ()), got a key array of shape {shape}")
    if dtype is not None and np.dtype(dtype) == np.uint32 and shape == (2,):
        return  # a raw key, jax.random.PRNGKey(seed)
    raise TypeError(
        "key: expected a jax.random key (jax.random.key(seed) or jax.random.PRNGKey(seed)), "
        f"got {type(key).__name__}" + (f" of dtype {dtype} and shape {shape}" if dtype else "")
    )


def random_integers(key: jax.Array, shape: tuple[int, ...], random_bits: int) -> jax.Array:
    """Each element's random integer in ``[0, 2**random_bits)`` (uint32): the top
    ``random_bits`` bits of ``jax.random.bits(key, shape, jnp.uint32)``."""
    return jax.random.bits(key, shape, jnp.uint32) >> jnp.uint32(32 - random_bits)


def increments(
    full: jax.Array,
    shift: jax.Array,
    negative: jax.Array,
    rounding: str,
    r: jax.Array | None = None,
    random_bits: int = 0,
    *,
    code_base: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Round ``full * 2**-shift`` to an integer by ``rounding``.

    Args:
      full: uint32 magnitudes below ``2**24``.
      shift: int32, ``>= 0`` (any size: a shift of 25 or more drops every bit).
      negative: bool, the sign of the value (directed modes round the magnitude by it).
      rounding: one of :data:`ROUNDINGS`.
      r, random_bits: the elements' random integers (:func:`random_integers`) and their
        width, for ``"stochastic"``.
      code_base: uint32, the code bits above the magnitude (a float format's exponent
        field), added to ``q`` for the parity a tie to even looks at: for a format with
        no trailing significand bits (P3109 ``p1``) the exponent decides it. None: 0.

    Returns:
      ``(q, up)``: the truncated magnitude ``full >> shift`` (uint32) and whether to add
      one to it (bool). ``q + up`` may carry into the next binade; the caller's code
      arithmetic absorbs it.
    """
    one = jnp.uint32(1)
    s = jnp.clip(shift, 0, _CAP).astype(jnp.uint32)
    q = full >> s
    rem = full & ((one << s) - one)
    if rounding in ("nearest_even", "nearest_away"):
        half = one << (jnp.maximum(s, one) - one)
        if rounding == "nearest_away":
            return q, rem >= half
        code = q if code_base is None else q + code_base
        return q, (rem > half) | ((rem == half) & ((code & one) == one))
    inexact = rem != 0
    if rounding == "toward_zero":
        return q, jnp.zeros_like(inexact)
    if rounding == "toward_positive":
        return q, inexact & ~negative
    if rounding == "toward_negative":
        return q, inexact & negative
    if rounding not in STOCHASTIC or r is None:
        raise ValueError(f"rounding: {rounding!r} needs its random integers")
    return q, _stochastic_up(rem, shift, r, random_bits, rounding)


def _stochastic_up(
    rem: jax.Array, shift: jax.Array, r: jax.Array, n: int, mode: str = "stochastic"
) -> jax.Array:
    """Whether the magnitude goes up, ``delta = rem / 2**shift`` written ``(K + F) / 2**n``
    (``K`` the ``n`` bits kept, ``F`` in ``[0, 1)`` the fraction dropped below them):
    ``d + r >= 2**n`` for ``d`` = ``K`` rounded by ``F`` (ties to even, or to odd), or
    gfloat's float64 test ``fl(delta + (r + c) / 2**n) >= 1`` (``c`` = 1/2 or 0), that is
    ``delta + (r + c) / 2**n >= 1 - 2**-54``. Without overflow for ``n`` up to 32."""
    one = jnp.uint32(1)
    t = shift.astype(jnp.int32) - n  # bits of rem below the n kept
    left = jnp.clip(-t, 0, 31).astype(jnp.uint32)
    right = jnp.clip(t, 0, _CAP).astype(jnp.uint32)
    kept = jnp.where(t <= 0, rem << left, rem >> right)
    dropped = rem & ((one << right) - one)
    half = one << (jnp.maximum(right, one) - one)
    room = jnp.uint32((1 << n) - 1) - kept  # 2**n - 1 - kept >= 0: kept < 2**n
    if mode in ("stochastic_fast", "stochastic_fastest"):
        # K == room: up when F >= 1/2 (fast) or F >= 1 (fastest), less gfloat's 2**(n-54)
        # (F is a multiple of 2**-t: the slack counts once it reaches 2**-t). Past _CAP,
        # F < 2**(24-t) is below both.
        low = t + n - 54
        slack = jnp.where(low >= 0, one << jnp.clip(low, 0, 31).astype(jnp.uint32), 0)
        need = (half if mode == "stochastic_fast" else one << right) - slack
        tie = (t > 0) & (t <= _CAP) & (dropped >= need)
        if mode == "stochastic_fastest":
            tie = tie & (low >= 0)
        return (r > room) | (tie & (r == room))
    odd = (kept & one) == one
    at_half = odd if mode == "stochastic" else ~odd  # ties to even, or to odd
    carry = (t > 0) & ((dropped > half) | ((dropped == half) & at_half))
    return (r > room) | (carry & (r == room))


def increments_below(
    full: jax.Array,
    shift: jax.Array,
    width: int,
    negative: jax.Array,
    rounding: str,
    r: jax.Array | None = None,
    random_bits: int = 0,
) -> jax.Array:
    """Whether ``x = full * 2**-shift`` (``0 <= x < width``) rounds up to ``width`` rather
    than down to 0: a format's values below its smallest positive one, ``width`` in units
    that make it an integer (a format without subnormals: ``2**t + 1``).

    Each mode treats ``{0, width}`` as the two neighbours, with the exact fraction
    ``delta = x / width`` (no power of two when ``width`` is odd): "nearest_even" goes up
    when ``delta > 1/2`` (a tie goes to 0, the even code), "nearest_away" when
    ``delta >= 1/2``, the directed modes by the sign when ``x > 0``; the stochastic modes
    apply their formula (module docstring) to the exact ``delta``: with ``y = delta *
    2**n`` and ``r`` the random integer, up when ``rnd(y) + r >= 2**n``, where ``rnd``
    rounds to nearest even ("stochastic"), to nearest odd ("stochastic_odd"), half up
    ("stochastic_fast") or down ("stochastic_fastest"): exact arithmetic, no float64 sum.

    Args:
      full: uint32 below ``2**24``; shift: int32 (any sign); ``x < width`` is assumed
        (elsewhere the result is meaningless: select it away).
      width: a positive int below ``2**24``.
      negative, rounding, r, random_bits: as :func:`increments`.
    """
    n = random_bits if rounding in STOCHASTIC else 0
    y, above, half = _divide(full, n - shift.astype(jnp.int32), width, n)
    if rounding == "nearest_even":
        return above
    if rounding == "nearest_away":
        return above | half
    nonzero = full != 0
    if rounding == "toward_zero":
        return jnp.zeros_like(nonzero)
    if rounding == "toward_positive":
        return nonzero & ~negative
    if rounding == "toward_negative":
        return nonzero & negative
    if rounding not in STOCHASTIC or r is None:
        raise ValueError(f"rounding: {rounding!r} needs its random integers")
    odd = (y & jnp.uint32(1)) == 1
    carry = {
        "stochastic": above | (half & odd),
        "stochastic_odd": above | (half & ~odd),
        "stochastic_fast": above | half,
        "stochastic_fastest": jnp.zeros_like(above),
    }[rounding]
    room = jnp.uint32((1 << n) - 1) - r  # rnd(y) + r >= 2**n, without overflow
    return (y > room) | (carry & (y == room))


def _divide(
    full: jax.Array, p: jax.Array, width: int, n: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``y = full * 2**p / width`` for ``y < 2**n``: ``(floor(y), frac(y) > 1/2,
    frac(y) == 1/2)``, by long division in uint32 (``full < 2**24``, ``width < 2**24``);
    no division for ``n = 0``, where ``y < 1``."""
    one = jnp.uint32(1)
    w = jnp.uint32(width)
    zero = jnp.zeros_like(full)
    q0, r0 = (full // w, full % w) if n else (zero, full)
    # p >= 0: the p zero bits after ``full``, a chunk at a time (the remainder stays below
    # ``width``, so ``remainder << step`` fits 32 bits); the quotient stays below 2**n.
    step = 32 - width.bit_length()
    p_hi = jnp.clip(p, 0, n + width.bit_length())
    q, rem = q0, r0
    for i in range(-(-(n + width.bit_length()) // step)):
        c = jnp.clip(p_hi - i * step, 0, step).astype(jnp.uint32)
        wide = rem << c
        q, rem = ((q << c) + wide // w, wide % w) if n else (zero, wide)
    up_hi, half_hi = 2 * rem > w, 2 * rem == w
    # p < 0: y = full / (width * 2**m); the remainder rho over width * 2**m.
    m = jnp.clip(-p, 0, 31).astype(jnp.uint32)
    q_lo = jnp.where(m >= 24, zero, q0 >> m)
    rho = full - (q_lo << m) * w
    below = jnp.clip(m.astype(jnp.int32) - 1, 0, 31).astype(jnp.uint32)  # rho vs width * 2**(m-1)
    a, b = rho >> below, rho & ((one << below) - one)
    up_lo = (a > w) | ((a == w) & (b != 0))
    half_lo = (a == w) & (b == 0)
    lo = p < 0
    return jnp.where(lo, q_lo, q), jnp.where(lo, up_lo, up_hi), jnp.where(lo, half_lo, half_hi)


def overflow_to_max(negative: jax.Array, rounding: str) -> jax.Array | bool:
    """Where a finite value beyond the format's range rounds to ``+-max`` rather than to
    Inf (or NaN): the directed modes whose direction is toward zero for that sign, as in
    IEEE 754. Infinite inputs are not overflow: they stay Inf (or NaN, or ``+-max``, as
    the format's table says)."""
    if rounding == "toward_zero":
        return True
    if rounding == "toward_positive":
        return negative
    if rounding == "toward_negative":
        return ~negative
    return False


def round_to_integer(
    x: jax.Array, rounding: str, r: jax.Array | None = None, random_bits: int = 0
) -> jax.Array:
    """``x`` (float32) rounded to an integer by ``rounding``, as float32 (exact: every
    result is an integer below ``2**24`` or ``x`` itself). Values of magnitude ``2**23``
    and more are integers already and come back unchanged, as do NaN and Inf; f32
    subnormals take part as their values (bits are read, nothing is flushed)."""
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    negative = (u >> 31) == 1
    e32 = ((u >> 23) & jnp.uint32(0xFF)).astype(jnp.int32)
    frac = u & jnp.uint32(0x7FFFFF)
    full = jnp.where(e32 == 0, frac, frac | jnp.uint32(0x800000))
    shift = 150 - jnp.maximum(e32, 1)  # |x| = full * 2**-shift
    q, up = increments(full, jnp.maximum(shift, 0), negative, rounding, r, random_bits)
    v = (q + up.astype(jnp.uint32)).astype(jnp.float32)
    v = jnp.where(negative, -v, v)
    return jnp.where((shift <= 0) | (e32 == 0xFF), x, v)
