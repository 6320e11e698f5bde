"""Quantized arrays: the :class:`~emulate.quantized.array.QArray` record and what reads and
makes it, one concept a module.

- :mod:`~emulate.quantized.checks`: each part of a QArray checked (the argument named, what
  it got, what is accepted), and the parts as the record stores them;
- :mod:`~emulate.quantized.index`: ``q[i]`` on a QArray's leading, unblocked axes;
- :mod:`~emulate.quantized.values`: :func:`~emulate.quantized.values.dequantize` and every
  reader of a part's values;
- :mod:`~emulate.quantized.layout`: what each part is (absent, constant, stored, two-level,
  table), described once per QArray (:func:`~emulate.quantized.layout.layout_of`): what
  the kernels read instead of the QArray's fields;
- :mod:`~emulate.quantized.array`: the record, its pytree, ``from_parts``, ``transpose``;
- :mod:`~emulate.quantized.quantizing`: :func:`~emulate.quantized.quantizing.quantize`,
  :class:`~emulate.quantized.quantizing.Scheme` and the resolved ``Recipe``;
- :mod:`~emulate.quantized.mx`: the named schemes (OCP MX, NVFP4, INT4_G128, FP8 blocks).

The public names stay at the top: ``emulate.QArray``, ``emulate.quantize``,
``emulate.dequantize``, ``emulate.mx``.
"""
