"""The operands of one :func:`emulate.pallas.matmul` call, checked once: :class:`MatmulArgs`.

:func:`matmul_args` is the one place that reads ``x`` and ``w`` as the caller passed them
and every argument error of the kernel is raised there (TypeError, ValueError or
NotImplementedError naming the argument), before any array is traced. What it works out:

* the target (a TPU) and how the pair computes on it (:func:`emulate.pallas.compute.in_kernel`:
  ``x``'s format times the format the weight's values take in the kernel: a codebook's
  value format, int8 for the 2- to 6-bit integer code formats, else the codes' own);
* the activations: values or codes as stored (float16 widened to the route's type,
  which Mosaic does not load), gathered into the weight's row order for an act-order
  QArray (:func:`emulate.pallas.qcodebook.permute_x`);
* a QArray or :class:`emulate.pallas.KernelQWeight` weight's parts as the kernel reads
  them, from the QArray's :class:`~emulate.quantized.layout.Layout`, read once
  (:func:`emulate.pallas.qweight.split`: scales, :class:`~emulate.pallas.qweight.
  Scaling`, zero points and offsets), its tensor scale, codebook
  (:func:`emulate.pallas.qcodebook.kernel_codebook`), permutation, and result type
  (:func:`emulate.pallas.qweight.result_type`);
* then, once the route is known, the weight's stored array and
  :class:`emulate.pallas.matmul_config.Stored` layout, decided in one place
  (:func:`emulate.pallas.weights.kernel_layout`): dense as stored (an int4 / uint4 /
  float4 array too, whose elements ml_dtypes holds one a byte); Packed of one byte per
  group as stored; K-planar for a :class:`emulate.pallas.KernelWeight`, and on each call
  for a Packed of 3 or 5 bytes a group, a QArray's codes packed along K whose scale
  groups cut the activations' column planes short of half a lane width, and a
  group-scaled Packed QArray under float32 activations, whose column planes cut into
  groups overrun v2/v3's VMEM.

The record holds arrays (not a pytree): it lives between the call's arguments and the
kernel's jit, which takes :attr:`MatmulArgs.kernel_operands` and a static
:class:`emulate.pallas.matmul_config.Config`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from emulate import formats, targets
from emulate.formats import Format, FormatLike
from emulate.numerics.storage import Packed, group_shape, is_array, to_codes, unpack_codes
from emulate.pallas import compute, qcodebook, qweight
from emulate.pallas.matmul_config import Stored
from emulate.pallas.qcodebook import KernelCodebook
from emulate.pallas.qweight import KernelQWeight, QParts, Scaling
from emulate.pallas.weights import KernelWeight, kernel_layout
from emulate.quantized.array import QArray

__all__ = ["MatmulArgs", "matmul_args"]

_X_IN_KERNEL = ("bfloat16", "float32")  # wide activation types decoded in the kernel


@dataclasses.dataclass(frozen=True, eq=False)
class _Source:
    """The weight argument, checked, before its layout is decided (:func:`_laid_out`): its
    codes (an array, Packed array or KernelWeight), their format, K, N, and a QArray's or
    prepared weight's other parts (:func:`emulate.pallas.qweight.split`)."""

    codes: Any
    format: Format
    k: int
    n: int
    parts: QParts | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class _Weight:
    """The weight as the kernel reads it: stored array, codes' format, K, N, layout."""

    data: jax.Array
    format: Format
    k: int
    n: int
    stored: Stored
    copied: bool = False


class RelayoutError(ValueError):
    """A weight :func:`emulate.pallas.matmul` would lay out again on every call of a TPU
    program (a copy of the weight per call, several times its stored bytes): the message
    names what would be copied and the fix, preparing it once
    (:func:`emulate.pallas.prepare_weight`, :func:`emulate.prepare_weights`). Route
    "kernel" raises it; route "auto" takes the XLA route instead (which reads such a
    weight tens of times over) and ``emulate.weight_route`` / ``emulate.inspect`` show this
    refusal as the reason."""


@dataclasses.dataclass(frozen=True, eq=False)
class MatmulArgs:
    """One :func:`emulate.pallas.matmul` call's operands, checked (:func:`matmul_args`).

    Attributes:
      x: the (M, K) activations as the kernel takes them: values (bfloat16, float32; a
        float16 x widened) or low-precision codes as stored, in the weight's row order.
      x_format: ``x``'s format.
      w: the weight's stored array (codes, Packed bytes or K-planar bytes).
      w_format: the format of the weight's codes.
      stored: the layout the kernel reads ``w`` in.
      m, n, k: the problem shape.
      target: the TPU target.
      compute: how the pair computes on ``target`` (:func:`emulate.pallas.compute.in_kernel`).
      out: the result type's name.
      passthrough: the weight goes to the matrix unit as stored (no decoding).
      weight: the weight argument the gradient decodes (an act-order QArray without its
        permutation: ``x`` is gathered instead).
      scales, tensor_scale, affine: a QArray weight's scales as the kernel reads them,
        its tensor scale and its zero point / offset arrays (:attr:`emulate.pallas.
        qoffsets.AffineParts.arrays`); None, None, () for a plain weight.
      scaling: a QArray weight's :class:`emulate.pallas.qweight.Scaling`, or None.
      perm, perm_axis: a QArray weight's permutation and its axis (-2: of K, gathered
        into ``x``; -1: of N, the result's columns restored after the kernel), or None.
      codebook: a codebook weight's :class:`emulate.pallas.qcodebook.KernelCodebook`.
      relaid: what the call lays out again for the kernel (the codes into the K-planar
        layout, a QArray's sub-byte parts packed along the groups): copies made on every
        call; empty for weights read as stored (:func:`refuse_relayout`).
    """

    x: jax.Array
    x_format: Format
    w: jax.Array
    w_format: Format
    stored: Stored
    m: int
    n: int
    k: int
    target: targets.Target
    compute: compute.Compute
    out: str
    passthrough: bool
    weight: Any
    scales: Any = None
    tensor_scale: Any = None
    affine: tuple[Any, ...] = ()
    scaling: Scaling | None = None
    perm: Any = None
    perm_axis: int | None = None
    codebook: KernelCodebook | None = None
    relaid: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Whether M, N or K is 0: nothing to launch (an empty contraction sums to 0)."""
        return 0 in (self.m, self.n, self.k)

    @property
    def kernel_operands(self) -> tuple[Any, ...]:
        """The kernel's weight arrays: codes, scales (or None), tensor scale (or None),
        then the zero point and offset arrays."""
        return (self.w, self.scales, self.tensor_scale, *self.affine)


def _tpu(target: targets.TargetLike) -> targets.Target:
    t = targets.current_target(target)
    if t.kind != "tpu":
        raise ValueError(
            f"target: emulate.pallas.matmul is a TPU kernel and the target is {t.name}; pass "
            "a TPU target (target='tpu_v5e', emulate.target(...) or EMULATE_TARGET); on a "
            "machine without a TPU it runs in interpret mode"
        )
    return t


def _packed(w: Packed, w_format: FormatLike | None) -> _Source:
    f = w.format
    if w_format is not None and formats.get(w_format) != f:
        raise ValueError(
            f"w_format: {formats.get(w_format).name} disagrees with the Packed w's format {f.name}"
        )
    if w.ndim != 2 or w.axis != -2:
        raise ValueError(
            f"w: a Packed weight must be 2-D (K, N) and packed along K (axis 0); got "
            f"shape {w.shape} packed along axis {w.axis + w.ndim}: pack it with "
            "emulate.pack(w, axis=0)"
        )
    return _Source(w, f, w.length, int(w.data.shape[1]))


def _weight(
    w: jax.Array | np.ndarray | Packed | KernelWeight, w_format: FormatLike | None
) -> _Source:
    """The weight argument (or a QArray's codes), checked; its layout is decided once, after
    the route (:func:`_laid_out`)."""
    if isinstance(w, Packed):
        return _packed(w, w_format)
    if isinstance(w, KernelWeight):
        if w_format is not None and formats.get(w_format) != w.format:
            raise ValueError(
                f"w_format: {formats.get(w_format).name} disagrees with the KernelWeight's "
                f"format {w.format.name}"
            )
        return _Source(w, w.format, w.length, int(w.data.shape[1]))
    if not is_array(w):
        raise TypeError(
            f"w: expected an array, uint8 codes with w_format=, a Packed array or a "
            f"KernelWeight; got {type(w).__name__}"
        )
    dt = np.dtype(w.dtype)
    as_is = dt.name in formats.names() and formats.get(dt).xla_storable
    if as_is and (w_format is None or formats.get(w_format).name == dt.name):
        f = formats.get(dt)
        data = jnp.asarray(w)
    else:
        data, f = to_codes(w, w_format, arg="w")
    _refuse_wide_codes(f, "w")
    _refuse_wide_values(f)
    if data.ndim != 2:
        raise ValueError(f"w: expected a 2-D (K, N) weight, got shape {tuple(data.shape)}")
    return _Source(data, f, int(data.shape[0]), int(data.shape[1]))


def _activation(
    x: jax.Array | np.ndarray | Packed, x_format: FormatLike | None
) -> tuple[jax.Array, Format]:
    """(values or codes, format) for the activation argument."""
    if isinstance(x, QArray):
        raise NotImplementedError(
            f"x: emulate.pallas.matmul decodes a QArray weight (w) only, not QArray "
            f"activations ({x!r}); use emulate.dot_general, or pass the codes alone"
        )
    if isinstance(x, Packed):
        return unpack_codes(x), x.format
    if not is_array(x):
        raise TypeError(
            f"x: expected an array, uint8 codes with x_format=, or a Packed array; got "
            f"{type(x).__name__}"
        )
    dt = np.dtype(x.dtype)
    if x_format is None and dt.name in formats.WIDE:
        return jnp.asarray(x), formats.get(dt)
    own = dt.name in formats.names() and formats.get(dt).xla_storable and formats.get(dt).bits == 8
    if own and (x_format is None or formats.get(x_format).name == dt.name):
        return jnp.asarray(x), formats.get(dt)  # int8 / uint8 / float8: read as stored
    codes, f = to_codes(x, x_format, arg="x")
    _refuse_wide_codes(f, "x")
    if not f.is_low_precision:
        return jnp.asarray(x), f
    return codes, f


def _refuse_wide_values(f: Format) -> None:
    """A weight of a wide type (bfloat16, float16, float32) is refused with a ValueError."""
    if not f.is_low_precision:
        raise ValueError(
            f"w: a {f.name} weight needs no decoding; pass a low-precision weight (int8, "
            "float8 codes, or emulate.pack(w4, axis=0) for 4- and 6-bit formats)"
        )


def _refuse_wide_codes(f: Format, arg: str) -> None:
    """The Pallas kernels read codes of at most 8 bits: a format of 9 to 16 bits without a
    dtype (a wide P3109 format) is refused with a ValueError naming ``arg``."""
    if f.bits > 8 and not f.has_dtype:
        raise ValueError(
            f"{arg}: {f.name} is a {f.bits}-bit format (uint16 codes); the Pallas kernels "
            "take codes of at most 8 bits, wider ones are not built there: use "
            "emulate.matmul or emulate.dot_general (the XLA route)"
        )


def _quantized(w: QArray | KernelQWeight, w_format: FormatLike | None) -> _Source:
    """A QArray or prepared weight: its parts as the kernel reads them
    (:func:`emulate.pallas.qweight.split`), its codes as stored (raw codes of a format
    without an XLA dtype as :func:`emulate.numerics.storage.to_codes` gives them)."""
    qweight.check_format(w, w_format)
    p = qweight.split(w)
    f = p.format
    _refuse_wide_codes(f, "w")
    _refuse_wide_values(f)
    codes = p.codes
    if not isinstance(codes, (Packed, KernelWeight)) and not (
        np.dtype(codes.dtype).name == f.name and f.xla_storable
    ):
        codes = to_codes(codes, f, arg="w")[0]
    return _Source(codes, f, p.shape[0], p.shape[1], p)


def matmul_args(
    x: Any,
    w: Any,
    *,
    target: targets.TargetLike = None,
    out_dtype: FormatLike | None = None,
    x_format: FormatLike | None = None,
    w_format: FormatLike | None = None,
) -> MatmulArgs:
    """The checked operands of ``emulate.pallas.matmul(x, w, ...)`` (its arguments of the
    same names; module docstring).

    Raises:
      TypeError: an operand that is not an array, Packed, codes (or, for ``w``, a
        KernelWeight, QArray or KernelQWeight).
      ValueError: a non-TPU target; shapes that are not (M, K) x (K, N); a weight packed
        along N; a wide weight; a format that disagrees with the operand's; a result type
        XLA cannot hold.
      NotImplementedError: a QArray ``x``; a QArray part the kernel does not decode
        (:func:`emulate.pallas.qweight.split`, :func:`emulate.pallas.qcodebook.
        kernel_codebook`).
    """
    t = _tpu(target)
    src = (
        _quantized(w, w_format) if isinstance(w, (QArray, KernelQWeight)) else _weight(w, w_format)
    )
    xv, xf = _activation(x, x_format)
    if xv.ndim != 2:
        raise ValueError(f"x: expected a 2-D (M, K) array, got shape {tuple(xv.shape)}")
    m, k = xv.shape
    if k != src.k:
        raise ValueError(
            f"x, w: x's K ({k}) differs from w's K ({src.k}); x {xf.name}{[m, k]}, "
            f"w {src.format.name}{[src.k, src.n]}"
        )
    final = cb = None
    p = src.parts
    if p is not None:
        final = qweight.result_type(xf, p.dtype, out_dtype)
        cb = qcodebook.kernel_codebook(p.codebook, src.format.name, xf, t)
        if p.perm is not None and p.perm_axis == -2:  # act-order along K
            xv = qcodebook.permute_x(xv, p.perm)
    vf = cb.value_format if cb is not None else src.format
    if src.format.name in formats.CODE_FORMATS:  # 2- to 6-bit integer codes: values as int8
        vf = formats.get("int8")
    r = compute.in_kernel(
        xf, vf, target=t, preferred_element_type="float32" if final else out_dtype
    )
    out = final or r.out
    if not formats.get(out).xla_storable:
        raise ValueError(
            f"out_dtype: the result type would be {r.out}, which XLA cannot hold; pass "
            "out_dtype (e.g. jnp.float32)"
        )
    nonempty = 0 not in (m, src.n, k)
    wt = _laid_out(src, r, nonempty)
    if nonempty and not xf.is_low_precision and xv.dtype.name not in _X_IN_KERNEL:
        xv = compute.decode_values(xv, r.lhs_compute)  # float16: widened outside the kernel
    passthrough = (
        cb is None
        and r.rhs_compute == wt.format.name
        and not r.rhs_scale
        and wt.stored.layout == "dense"
    )
    relaid = (("codes (into the K-planar layout)",) if wt.copied else ()) + (
        p.repacked if p is not None and nonempty else ()
    )
    return MatmulArgs(
        x=xv, x_format=xf, w=wt.data, w_format=wt.format, stored=wt.stored, m=m, n=wt.n,
        k=k, target=t, compute=r, out=out, passthrough=passthrough, codebook=cb,
        weight=w if p is None else p.weight,
        scales=None if p is None else p.scales,
        tensor_scale=None if p is None else p.tensor,
        affine=() if p is None or p.affine is None else p.affine.arrays,
        scaling=None if p is None else p.scaling,
        perm=None if p is None else p.perm,
        perm_axis=None if p is None else p.perm_axis,
        relaid=relaid,
    )  # fmt: skip


def refuse_relayout(a: MatmulArgs, w: Any, interpret: bool) -> None:
    """Raise :class:`RelayoutError` where a call built for a TPU (not ``interpret``) would
    lay its weight ``w`` out again (``a.relaid``) and ``w`` is traced: the copy would run
    on every call of the compiled program (a weight closed over as a constant is laid out
    once, when the program is traced)."""
    if interpret or not a.relaid:
        return
    if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(w)):
        return
    what = "an array" if is_array(w) else f"a {type(w).__name__}"
    raise RelayoutError(
        f"w: {what} {a.w_format.name}{[a.k, a.n]} is not stored as the TPU kernel reads "
        f"it: its {' and '.join(a.relaid)} would be laid out again on every call of the "
        "program (a copy of the weight each call, several times its stored bytes); "
        "prepare it once, outside the program: emulate.pallas.prepare_weight(w) (a model's "
        "parameters: emulate.prepare_weights(params, target=...); emulate.flax.load_weights "
        "and quantize_model do it under emulate.target(...) with a TPU target)"
    )


def _laid_out(src: _Source, r: compute.Compute, nonempty: bool) -> _Weight:
    """The weight in the layout the kernel reads it in: the one place a call decides it
    (:func:`emulate.pallas.weights.kernel_layout`; a group-scaled Packed QArray K-planar
    under float32 activations), and the codes' format named in the layout."""
    s = src.parts.scaling if src.parts is not None else None
    group = s.group if s is not None and s.along_k else None
    # f32 x column planes cut into groups overrun v2/v3's 16 MiB of VMEM (XLA:TPU:
    # RESOURCE_EXHAUSTED at 64x4096x4096): the K-planar layout instead (prepare once)
    planar = nonempty and group is not None and r.lhs_compute == "float32"
    codes = kernel_layout(src.codes, group=group, planar=planar)
    copied = nonempty and codes is not src.codes
    if isinstance(codes, (KernelWeight, Packed)):
        data, k = jnp.asarray(codes.data), codes.length
        g, nbytes = group_shape(codes.format.bits)
        layout = "planar" if isinstance(codes, KernelWeight) else "packed"
        stored = Stored(layout, "uint8", int(data.shape[0]), g, nbytes)
    else:
        data = jnp.asarray(codes)
        k = int(data.shape[0])
        stored = Stored("dense", np.dtype(data.dtype).name, k)
    if nonempty and src.format.name in formats.CODE_FORMATS:
        stored = dataclasses.replace(stored, code=src.format.name)
    return _Weight(data, src.format, k, int(data.shape[1]), stored, copied)
