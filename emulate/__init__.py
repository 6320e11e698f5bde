"""emulate: low-precision matmuls with provable numerics on hardware that lacks them.

The public surface: format records (:mod:`emulate.formats`), exact codecs
(:func:`decode`, :func:`encode`), dense sub-byte storage (:func:`pack`, :func:`unpack`,
:class:`Packed`) and the independent oracle (:mod:`emulate.reference`).
"""

from emulate import formats
from emulate.codecs import decode, encode
from emulate.formats import Format
from emulate.packing import Packed, pack, unpack

__version__ = "0.1.0"

__all__ = [
    "Format",
    "Packed",
    "decode",
    "encode",
    "formats",
    "pack",
    "unpack",
]
