"""``out_sharding`` of the drop-ins: an emulated result placed as JAX's own call places it.

``lax.dot_general``, ``jnp.matmul``, ``jnp.einsum`` and ``lax.conv_general_dilated`` (jax
0.10.2) canonicalize ``out_sharding`` once (``None``; a ``NamedSharding``, over the mesh
of the ``jax.set_mesh`` context if there is one; a ``PartitionSpec``, only inside such a
context; never an Auto or Manual axis name) and give the result that sharding. Outside a
mesh context a ``NamedSharding`` is checked but its placement is not applied: the result
stays where the operands are. An emulated result has been computed by other operations,
so :func:`resharded` hands it to the one JAX operation that takes ``out_sharding`` and
changes nothing else, a reshape to its own shape: the same canonicalization, the same
placement, the same errors.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax

__all__ = ["resharded"]


def resharded(out: jax.Array, out_sharding: Any) -> jax.Array:
    """``out`` with the sharding JAX's own call given ``out_sharding`` returns.

    Raises:
      TypeError: ``out_sharding`` neither None, a NamedSharding nor a PartitionSpec.
      ValueError: JAX's refusals, prefixed with ``out_sharding:`` (a PartitionSpec outside
        a mesh context; a NamedSharding over a mesh other than the context's; an Auto or
        Manual axis name).
    """
    if out_sharding is None:
        return out
    if not isinstance(out_sharding, jax.sharding.NamedSharding | jax.sharding.PartitionSpec):
        raise TypeError(
            "out_sharding: expected None, a jax.sharding.NamedSharding or a PartitionSpec, "
            f"got {type(out_sharding).__name__} {out_sharding!r}"
        )
    try:
        return lax.reshape(out, out.shape, out_sharding=out_sharding)
    except ValueError as e:
        raise ValueError(f"out_sharding: {e}") from None
