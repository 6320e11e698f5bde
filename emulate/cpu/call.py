"""The JAX side of the CPU kernel: :func:`contract` puts a QArray weight and float32 rows
of activations through XLA's FFI (:func:`jax.ffi.ffi_call`) to the kernel compiled for the
weight's :class:`~emulate.cpu.form.Form` (:mod:`emulate.cpu.gemv`).

Under ``vmap`` the call runs once per batch element (``vmap_method="sequential"``), each
reading the whole weight: put the rows in the activations' array instead (the front end,
:mod:`emulate.scaled`, gives the kernel every row of it in one call).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from emulate import cpu
from emulate.cpu.form import Form, Orientation, vector_step
from emulate.cpu.operands import weight_operands, wire
from emulate.cpu.route import MAX_ROWS, many_rows
from emulate.quantized.array import QArray

__all__ = ["contract"]


def _block_sums(x: jax.Array, bk: int) -> jax.Array:
    """``x`` (M, K) summed over each block of ``bk`` columns, float32 (M, ceil(K / bk))."""
    m, k = x.shape
    nb = -(-k // bk)
    x = jnp.pad(x, ((0, 0), (0, nb * bk - k)))
    return x.reshape(m, nb, bk).sum(axis=-1, dtype=jnp.float32)


def contract(q: QArray, x: jax.Array, form: Form) -> jax.Array:
    """``x @ W`` as float32 (M, N), ``W`` the weight ``q`` oriented (K, N): ``x`` (M, K)
    float32; ``q`` stored (N, K) for layout ROWS, (K, N) for COLUMNS (``form``,
    from :func:`emulate.cpu.form.weight_form` for this contraction).

    Raises:
      RuntimeError: the kernels cannot be compiled here (:func:`emulate.cpu.unavailable`
        says why; check :func:`emulate.cpu.available` first).
      ValueError: ``x`` has more than :data:`emulate.cpu.route.MAX_ROWS` rows and the
        many-rows kernel does not take ``form`` (:func:`emulate.cpu.route.many_rows`).
    """
    why = cpu.unavailable()
    if why is not None:
        raise RuntimeError(f"emulate.cpu.call.contract: {why}")
    columns = form.orientation == Orientation.COLUMNS
    n = q.shape[1] if columns else q.shape[0]
    many = x.shape[0] > MAX_ROWS
    if x.shape[0] < 1 or (many and not many_rows(form, n)):
        raise ValueError(
            f"x: expected 1 to {MAX_ROWS} rows for this weight's form, got shape {tuple(x.shape)}"
        )
    from emulate.cpu import ffi, handler  # numba: only now

    parallel = cpu.parallel()
    name = f"{form.name}_{'p' if parallel else 's'}{'_many' if many else ''}"
    ffi.register(name, handler.handler(form, parallel, many))
    m, _ = x.shape
    bk = q.block_shape[0] if columns else q.block_shape[1]
    placeholder = jnp.zeros((m, 1), jnp.float32)
    xe = placeholder
    g = form.codes.group
    if not columns and vector_step(form) and g > 1:
        xe = x.reshape(m, -1, g).swapaxes(1, 2).reshape(m, -1)  # xe[q K / g + t] = x[g t + q]
    xsum = _block_sums(x, bk) if form.offset is not None else placeholder
    call = jax.ffi.ffi_call(
        name, jax.ShapeDtypeStruct((m, n), jnp.float32), vmap_method="sequential"
    )
    return call(*wire(x, xe, xsum, weight_operands(q, form)))
