"""A small linen CNN ported to quantized weights in one call with
``emulate.flax.quantize_model``.

The model is plain flax linen (``Conv``, ``Dense``): nothing in it knows about emulate.
``port`` quantizes the convolutions to per-channel int8 and MXFP8 (e4m3) and the
classifier to MXFP4, returning a model whose ``apply`` runs emulate's convolutions and
matmuls for the current target, and the variables with each kernel's codes and scales at
the kernel's own path. Run it::

    python examples/linen_cnn.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

import emulate
import emulate.flax


class CNN(nn.Module):
    classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(16, (3, 3), name="stem")(x))
        x = nn.relu(nn.Conv(32, (3, 3), strides=2, name="conv")(x))
        x = nn.relu(nn.Conv(32, (3, 3), feature_group_count=2, name="grouped")(x))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.classes, name="head")(x)


RULES = [
    emulate.flax.Rule("stem", "int8"),
    emulate.flax.Rule("conv|grouped", emulate.mx.MXFP8_E4M3),
    emulate.flax.Rule("head", emulate.mx.MXFP4),
]


def make(seed: int = 0):
    model = CNN()
    images = jax.random.normal(jax.random.key(seed), (4, 12, 12, 3), jnp.float32)
    return model, model.init(jax.random.key(seed + 1), images), images


def port(model: CNN, variables, images, *, qat: bool = False):
    """The one call: ``(quantized model, quantized variables)``."""
    return emulate.flax.quantize_model(model, RULES, variables, images, qat=qat)


def main() -> None:
    model, variables, images = make()
    qmodel, qvars = port(model, variables, images)
    for target in ("tpu_v4", "tpu_v7x"):
        with emulate.target(target):
            logits = jax.jit(qmodel.apply)(qvars, images)
        print(target, jnp.argmax(logits, axis=-1).tolist())


if __name__ == "__main__":
    main()
