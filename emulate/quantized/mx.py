"""Named quantization schemes: the OCP microscaling formats, NVFP4, group-wise int4 and
block-128 fp8. Pass one to :func:`emulate.quantize` as ``fmt``::

    w_q = emulate.quantize(w, emulate.mx.MXFP4, axis=0)   # blocks of 32 along K of (K, N)

Every scheme's ``axes`` default is the last axis (the last two for the 2-D block); name
the contraction axis with ``axis=`` for weights stored ``(K, N)``.

- ``MXFP8_E4M3``, ``MXFP8_E5M2``, ``MXFP6_E2M3``, ``MXFP6_E3M2``, ``MXFP4``, ``MXINT8``
  (OCP MX v1.0): float8_e4m3fn / float8_e5m2 / float6_e2m3fn / float6_e3m2fn /
  float4_e2m1fn / int8 elements, blocks of 32, float8_e8m0fnu scales, rule ``ocp_floor``.
- ``NVFP4``: float4_e2m1fn elements, blocks of 16, float8_e4m3fn scales by ``absmax``,
  and an f32 tensor scale.
- ``INT4_G128``: int4 elements, groups of 128, float16 scales by ``absmax`` (symmetric
  AWQ/GPTQ-style groups without zero points).
- ``FP8_BLOCK_128x128``: float8_e4m3fn elements in 128 x 128 blocks, float32 scales by
  ``absmax`` (DeepSeek-V3-style weights).
- ``INT8_PER_CHANNEL``, ``FP8_PER_CHANNEL``: int8 / float8_e4m3fn elements, one float32
  scale (``absmax``) per output channel: the whole of the named ``axis`` (the
  contraction axes) is one block.

MXINT8 follows the OCP spec: an int8 element is a fixed-point number with the implicit
scale 2**-6 (range -2 to 1 63/64, emax 0), so the e8m0 byte is the spec's ``X`` itself and
every spec block is representable, down to scale byte 0. The QArray records it as
``element_exponent=-6``; the integer codes are what the matmuls multiply.
"""

from __future__ import annotations

from emulate.quantized.quantizing import Scheme

__all__ = [
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP4",
    "MXINT8",
    "NVFP4",
    "INT4_G128",
    "FP8_BLOCK_128x128",
    "INT8_PER_CHANNEL",
    "FP8_PER_CHANNEL",
    "SCHEMES",
    "Scheme",
]


def _mx(name: str, fmt: str) -> Scheme:
    return Scheme(name, fmt, (32,), (-1,), "float8_e8m0fnu", "ocp_floor", doc="OCP MX v1.0")


MXFP8_E4M3 = _mx("MXFP8_E4M3", "float8_e4m3fn")
MXFP8_E5M2 = _mx("MXFP8_E5M2", "float8_e5m2")
MXFP6_E2M3 = _mx("MXFP6_E2M3", "float6_e2m3fn")
MXFP6_E3M2 = _mx("MXFP6_E3M2", "float6_e3m2fn")
MXFP4 = _mx("MXFP4", "float4_e2m1fn")
MXINT8 = Scheme(
    "MXINT8",
    "int8",
    (32,),
    (-1,),
    "float8_e8m0fnu",
    "ocp_floor",
    doc="OCP MX v1.0: int8 elements with six fraction bits",
    element_exponent=-6,
)
NVFP4 = Scheme(
    "NVFP4",
    "float4_e2m1fn",
    (16,),
    (-1,),
    "float8_e4m3fn",
    "absmax",
    tensor_scale=True,
    doc="NVIDIA NVFP4: e4m3 block scales and an f32 tensor scale",
)
INT4_G128 = Scheme(
    "INT4_G128",
    "int4",
    (128,),
    (-1,),
    "float16",
    "absmax",
    doc="symmetric group-wise int4 (AWQ/GPTQ without zero points)",
)
FP8_BLOCK_128x128 = Scheme(
    "FP8_BLOCK_128x128",
    "float8_e4m3fn",
    (128, 128),
    (-2, -1),
    "float32",
    "absmax",
    doc="fp8 weights in 128x128 blocks with f32 scales (DeepSeek-V3 style)",
)
INT8_PER_CHANNEL = Scheme(
    "INT8_PER_CHANNEL",
    "int8",
    None,
    (-1,),
    "float32",
    "absmax",
    doc="symmetric int8 with one f32 scale per output channel",
)
FP8_PER_CHANNEL = Scheme(
    "FP8_PER_CHANNEL",
    "float8_e4m3fn",
    None,
    (-1,),
    "float32",
    "absmax",
    doc="float8_e4m3fn with one f32 scale per output channel",
)

SCHEMES = {
    s.name: s
    for s in (
        MXFP8_E4M3,
        MXFP8_E5M2,
        MXFP6_E2M3,
        MXFP6_E3M2,
        MXFP4,
        MXINT8,
        NVFP4,
        INT4_G128,
        FP8_BLOCK_128x128,
        INT8_PER_CHANNEL,
        FP8_PER_CHANNEL,
    )
}
