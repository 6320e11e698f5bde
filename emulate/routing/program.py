"""A kernel op's kernel traced once on a call's abstract operands: the program the kernel
route replays (:func:`emulate.routing.run`), or the kernel's refusal as text
(:func:`emulate.routing.choose` reads it). Cached per op (its XLA route left out), operand
structure and shapes, so that a call decided and then run traces its kernel once; the
:data:`CACHED` most recently used programs are kept (a server whose shapes change every
call does not grow it without end).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any

import jax

from emulate import targets
from emulate.routing.ops import KernelOp

__all__ = ["kernel_program"]

#: How many traced programs (or refusals) the cache keeps, least recently used dropped.
CACHED = 512

#: The cache: key (op, operand structure, shapes and dtypes) -> program or refusal, the
#: most recently used last.
PROGRAMS: collections.OrderedDict[Any, Any] = collections.OrderedDict()


def kernel_program(op: KernelOp, x: Any, w: Any) -> Any:
    """``op``'s kernel traced on the abstract operands ``(x, w)``: a ClosedJaxpr of the
    leaves of ``(x, w)``, or the kernel's refusal as text (the NotImplementedError,
    ValueError or TypeError it raised, after "<kernel> refuses it: "). A Pallas kernel is
    traced as for a TPU (:func:`emulate.targets.tpu_branch`) unless in interpret mode.
    A :class:`emulate.pallas.RelayoutError` is a refusal like the others: route "kernel"
    raises it with its fix, route "auto" takes the XLA route and says why
    (``emulate.weight_route`` / ``emulate.inspect``)."""
    op = dataclasses.replace(op, xla_route=None)  # type: ignore[type-var]
    try:
        avals = tuple((tuple(v.shape), str(v.dtype)) for v in jax.tree.leaves((x, w)))
        key: Any = (op, jax.tree.structure((x, w)), avals)
        hash(key)
    except TypeError:  # an unhashable part (a codebook's table): no cache
        key = None
    if key is not None and key in PROGRAMS:
        PROGRAMS.move_to_end(key)
        return PROGRAMS[key]
    treedef = jax.tree.structure((x, w))

    def flat(*leaves: Any) -> jax.Array:
        return op.kernel(*jax.tree.unflatten(treedef, leaves))

    tpu = op.platform == "tpu" and not op.interpret
    try:
        # the TPU branch of the routed program: the kernel is built as for a TPU
        with targets.tpu_branch() if tpu else contextlib.nullcontext():
            got: Any = jax.make_jaxpr(flat)(*jax.tree.leaves((x, w)))
    except (NotImplementedError, ValueError, TypeError) as e:
        got = f"{op.kernel_name} refuses it: {e}"
    if key is not None:
        PROGRAMS[key] = got
        if len(PROGRAMS) > CACHED:
            PROGRAMS.popitem(last=False)
    return got
