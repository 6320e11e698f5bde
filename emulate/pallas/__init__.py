"""Pallas TPU support: a mixed-input matmul kernel, an in-kernel ``dot``, a Mosaic check.

- :func:`matmul`: ``x @ w`` as one ``pallas_call`` whose low-precision weight (int8,
  float8 codes, or int4 / float4 / float6 kept packed) is decoded tile by tile in VMEM
  into the type the target's matrix unit takes.
- :func:`ragged_dot`: ``lax.ragged_dot`` (mixture-of-experts experts, rows sorted by
  group) as one grouped kernel in the style of megablox's ``gmm``: each routed expert's
  weight read as stored and decoded in VMEM, experts without rows never read
  (:mod:`emulate.pallas.gmm_kernel`; dense one-byte experts so far).
- :func:`prepare_weight`: a sub-byte weight, once, in the K-planar layout
  (:class:`KernelWeight`, the same bytes) that :func:`matmul` reads without any copy; a
  block-scaled :class:`emulate.QArray` weight likewise (:class:`KernelQWeight`:
  :mod:`emulate.pallas.qweight` says which scales the kernel applies).
- :func:`dot`: a ``jnp.dot`` for values loaded inside your own kernels that lowers to an
  operand pair the target runs; :func:`dot_vmem_bytes`: the VMEM its decoding adds.
- :func:`check`: lowers a function for TPU on any machine and reports each ``tpu.matmul``
  whose operand types the target lacks, and each operation that compiles only in Mosaic's
  compatibility mode, with the error Mosaic would give and a fix for that operation.

Import it as ``import emulate.pallas`` (it imports ``jax.experimental.pallas``). One kernel
per module: :mod:`emulate.pallas.matmul_kernel` (its weight layout:
:mod:`emulate.pallas.weights`), :mod:`emulate.pallas.kernel_dot`, the
check in :mod:`emulate.pallas.mosaic_check`, and the routes and in-kernel decoding they
share in :mod:`emulate.pallas.route`.
"""

from __future__ import annotations

from emulate.pallas.gmm_kernel import ragged_dot
from emulate.pallas.kernel_dot import dot, dot_vmem_bytes
from emulate.pallas.matmul_kernel import matmul
from emulate.pallas.mosaic_check import Finding, MatmulSite, check, diagnose, matmul_sites
from emulate.pallas.qweight import KernelQWeight, prepare_weight
from emulate.pallas.weights import KernelWeight

__all__ = [
    "Finding",
    "KernelQWeight",
    "KernelWeight",
    "MatmulSite",
    "check",
    "diagnose",
    "dot",
    "dot_vmem_bytes",
    "matmul",
    "matmul_sites",
    "prepare_weight",
    "ragged_dot",
]
