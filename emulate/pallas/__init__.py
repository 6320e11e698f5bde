"""Pallas TPU support: a mixed-input matmul kernel, an in-kernel ``dot``, a Mosaic check.

- :func:`matmul`: ``x @ w`` as one ``pallas_call`` whose low-precision weight (int8,
  float8 codes, or int4 / float4 / float6 kept packed) is decoded tile by tile in VMEM
  into the type the target's matrix unit takes.
- :func:`ragged_dot`: ``lax.ragged_dot`` (mixture-of-experts experts, rows sorted by
  group) as one grouped kernel in the style of megablox's ``gmm``: each routed expert's
  weight read as stored and decoded in VMEM by :func:`matmul`'s kernel body, experts
  without rows never read (:mod:`emulate.pallas.gmm_kernel`: one-byte, 4-bit and
  stacked QArray experts such as MXFP4, Q4_K, AWQ); :func:`prepare_experts` puts stacked
  experts once in the layout it reads.
- :func:`prepare_weight`: a sub-byte weight, once, in the K-planar layout
  (:class:`KernelWeight`, the same bytes) that :func:`matmul` reads without any copy; a
  block-scaled :class:`emulate.QArray` weight likewise (:class:`KernelQWeight`:
  :mod:`emulate.pallas.qweight` says which scales the kernel applies).
- :func:`dot`: a ``jnp.dot`` for values loaded inside your own kernels that lowers to an
  operand pair the target runs; :func:`dot_vmem_bytes`: the VMEM its decoding adds.
- :func:`check`: lowers a function for TPU on any machine and reports each ``tpu.matmul``
  whose operand types the target lacks, and each operation that compiles only in Mosaic's
  compatibility mode, with the error Mosaic would give and a fix for that operation.

Import it as ``import emulate.pallas`` (it imports ``jax.experimental.pallas``). Modules:

- the matmul kernel, in the order of a call: :mod:`emulate.pallas.matmul_args` (the
  operands, checked once into a ``MatmulArgs``), :mod:`emulate.pallas.matmul_config`
  (blocks, layouts and VMEM: the static ``Config``), :mod:`emulate.pallas.matmul_kernel`
  (the kernel and :func:`matmul`);
- its weights, on the host: :mod:`emulate.pallas.weights` (the K-planar layout,
  :class:`KernelWeight`), :mod:`emulate.pallas.qweight` (QArray weights,
  :class:`KernelQWeight`, :func:`prepare_weight`), :mod:`emulate.pallas.qoffsets` (zero
  points, offsets and two-level parts), :mod:`emulate.pallas.qcodebook` (codebooks,
  act-order);
- its steps in the kernel: :mod:`emulate.pallas.compute` (a pair's compute, decoding and
  exact dots, shared with :func:`dot`), :mod:`emulate.pallas.qgroups` (per K step: group sums,
  two-level parts, the offset dot), :mod:`emulate.pallas.qsteps` (scales per group, scale
  blocks of several columns, zero-point and offset terms, the store);
- :mod:`emulate.pallas.kernel_dot`: :func:`dot` for your own kernels;
- :mod:`emulate.pallas.checking`: the Mosaic check (:func:`check`, :func:`diagnose`).
"""

from __future__ import annotations

from emulate.pallas.checking.mosaic_check import (
    Finding,
    MatmulSite,
    NoMatmulWarning,
    RecordedRulesWarning,
    check,
    diagnose,
    matmul_sites,
)
from emulate.pallas.gmm_kernel import prepare_experts, ragged_dot
from emulate.pallas.kernel_dot import dot, dot_vmem_bytes
from emulate.pallas.matmul_args import RelayoutError
from emulate.pallas.matmul_kernel import matmul
from emulate.pallas.qweight import KernelQWeight, prepare_weight
from emulate.pallas.weights import KernelWeight

__all__ = [
    "Finding",
    "KernelQWeight",
    "KernelWeight",
    "MatmulSite",
    "NoMatmulWarning",
    "RecordedRulesWarning",
    "RelayoutError",
    "check",
    "diagnose",
    "dot",
    "dot_vmem_bytes",
    "matmul",
    "matmul_sites",
    "prepare_experts",
    "prepare_weight",
    "ragged_dot",
]
