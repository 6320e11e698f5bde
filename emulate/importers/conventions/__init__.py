"""The storage conventions of quantized safetensors checkpoints, parsed with numpy into
:class:`~emulate.importers.stored.StoredParts` (codes in logical order, their
scales, zero points, offsets, codebook and act-order permutation, as stored).

One module per family: :mod:`.integer` (AutoAWQ GEMM, GPTQ v1/v2, compressed-tensors
pack-quantized), :mod:`.floats` (gpt-oss MXFP4, FP8 blocks, modelopt NVFP4,
compressed-tensors NVFP4/MXFP4), :mod:`.bnb` (bitsandbytes NF4/FP4). No JAX here.
"""
