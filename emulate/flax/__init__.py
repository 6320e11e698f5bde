"""emulate for flax models (NNX and linen): :func:`quantize_model` quantizes a model's
weights by rules (:mod:`emulate.flax.quantize`), :func:`load_weights` puts a checkpoint's
weights, kept as stored, into a model by parameter path (:mod:`emulate.flax.load`).
Either way the chosen layers' matmuls run through emulate with QArray kernels.
:class:`KVCacheVariable` holds a quantized KV cache (:mod:`emulate.kvcache`) in a model
(:mod:`emulate.flax.kvcache`).

flax is an optional dependency (``pip install emulate[flax]``); ``import emulate`` does not
import it, ``emulate.flax`` does.
"""

from emulate.flax.kvcache import KVCacheVariable
from emulate.flax.load import GGUF_NAMES, NameRule, default_rule, load_weights
from emulate.flax.quantize import (
    QuantizedEmbed,
    QuantizedLinen,
    QuantizedWeight,
    Rule,
    emulate_layer,
    quantize_model,
)
from emulate.flax.rounding import rounding_key

__all__ = [
    "GGUF_NAMES",
    "KVCacheVariable",
    "NameRule",
    "QuantizedEmbed",
    "QuantizedLinen",
    "QuantizedWeight",
    "Rule",
    "default_rule",
    "emulate_layer",
    "load_weights",
    "quantize_model",
    "rounding_key",
]
