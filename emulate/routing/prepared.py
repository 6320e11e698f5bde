"""Prepared weights on the routes: :func:`prepare_weights` lays out, once, every weight of
a tree that a kernel of the target reads as stored; the read-back side (how the XLA route
reads a prepared weight: :func:`is_prepared`, :func:`unprepared`) is the XLA engine's
(:mod:`emulate.engine.prepared`), re-exported here.
"""

from __future__ import annotations

from typing import Any

import jax

from emulate import targets
from emulate.engine.prepared import Prepared, is_prepared, unprepared
from emulate.numerics.storage import Packed
from emulate.quantized.array import QArray

__all__ = ["Prepared", "is_prepared", "prepare_weights", "unprepared"]


def prepare_weights(tree: Any, *, target: targets.TargetLike = None, experts: bool = True) -> Any:
    """``tree`` with every QArray and Packed weight a kernel route takes replaced, once,
    by its prepared form (the same bytes, sub-byte codes in the K-planar layout), so that
    no call relayouts it:

    - a 2-D ``(K, N)`` QArray with parts ``emulate.pallas.matmul`` decodes, or a 2-D Packed
      array packed along K (``emulate.pack(w, axis=0)``): :func:`emulate.pallas.prepare_weight`
      (a :class:`emulate.pallas.KernelQWeight` or :class:`emulate.pallas.KernelWeight`);
    - with ``experts`` (default), stacked experts ``(E, K, N)`` (a 3-D QArray with parts the
      grouped kernel decodes, or a 3-D Packed array packed along K):
      :func:`emulate.pallas.prepare_experts`, which ``emulate.ragged_dot`` reads as stored.

    On a non-TPU target (the CPU kernel reads a QArray as stored), and for any other leaf
    (an embedding table read by row, a scheme the kernels refuse, 3-D weights with
    ``experts=False``: the ``emulate.flax`` layers' 3-D kernels are einsum weights), the
    leaf is returned as it is. The result is a pytree like ``tree``; every front end takes
    the prepared weights (on the XLA route through their QArray, as read back).

    Raises:
      TypeError: ``experts`` is not a bool.
      ValueError: an unknown ``target``.
    """
    if not isinstance(experts, bool):
        raise TypeError(
            f"experts: expected a bool (True: prepare stacked (E, K, N) experts too), got "
            f"{type(experts).__name__} {experts!r}"
        )
    t = targets.current_target(target)
    if t.kind != "tpu":
        return tree

    def prepare(x: Any) -> Any:
        if not isinstance(x, (QArray, Packed)) or (isinstance(x, Packed) and x.axis != -2):
            return x
        import emulate.pallas as p  # imports jax.experimental.pallas: only for a TPU target

        make = {2: p.prepare_weight, 3: p.prepare_experts if experts else None}.get(len(x.shape))
        if make is None:
            return x
        try:
            return make(x)
        except (NotImplementedError, ValueError):
            return x

    return jax.tree.map(prepare, tree, is_leaf=lambda v: isinstance(v, (QArray, Packed)))
