"""The Mosaic check behind :func:`emulate.pallas.check` and :func:`emulate.pallas.diagnose`:
which ``tpu.matmul`` (and other narrow-type operation) of a lowered kernel a TPU target
compiles, decided without running anything.

- :mod:`emulate.pallas.checking.sites`: the sites read from the Mosaic MLIR JAX lowers a
  ``pallas_call`` to (:class:`~emulate.pallas.checking.sites.MatmulSite`, ``matmul_sites``).
- :mod:`emulate.pallas.checking.op_rules`: narrow-type operations outside a matmul, by the
  compiler's word.
- :mod:`emulate.pallas.checking.findings`: a site's finding (message, fix, cost), from
  :meth:`emulate.targets.Target.compiles`.
- :mod:`emulate.pallas.checking.mosaic_check`: ``check``, ``check_many``, ``reports``:
  which basis applies (the real compiler, the recorded probe, the table) and the run.

The package is named ``checking``, not ``check``: ``emulate.pallas.check`` is the function
(a subpackage of that name would be bound to the same attribute of ``emulate.pallas``).
Its public names are re-exported by :mod:`emulate.pallas`.
"""
