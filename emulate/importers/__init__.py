"""Importers: quantized weights from other projects' files, kept as stored.

``emulate.importers.ggml`` parses GGML block bytes (GGUF tensors) into parts in logical
element order, in numpy alone; ``emulate.importers.gguf`` reads GGUF files with the
``gguf`` package (the optional extra ``emulate[gguf]``) and turns the parts into
:class:`emulate.QArray` records.
"""
