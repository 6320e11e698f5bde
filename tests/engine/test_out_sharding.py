"""emulate.engine.out_sharding: an emulated result takes ``out_sharding`` as JAX's own call
does (one device here: the meshes are of one device; tests/_sharded_polyfill.py runs the
placements over two)."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import emulate

AUTO = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))
EXPLICIT = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))

#: (case, the mesh context or None, out_sharding)
CASES = [
    ("NamedSharding outside a mesh context", None, NamedSharding(EXPLICIT, P("x"))),
    ("an Auto axis name", None, NamedSharding(AUTO, P("x"))),
    ("PartitionSpec outside a mesh context", None, P("x")),
    ("NamedSharding of another mesh", EXPLICIT, NamedSharding(AUTO, P())),
    ("PartitionSpec in the context", EXPLICIT, P("x")),
    ("neither", None, "x"),
]

X = np.arange(16, dtype=np.float32).reshape(4, 4) / 4
CODES = emulate.encode(X, "float6_e2m3fn")  # float6 codes: emulate's own einsum
VALUES = np.asarray(emulate.decode(CODES, "float6_e2m3fn", to=jnp.float32))
F8 = X.astype(ml_dtypes.float8_e4m3fn)


def _outcome(fn):
    try:
        out = fn()
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return out.sharding, np.asarray(out).tolist()


@pytest.mark.parametrize(("mesh", "osh"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_out_sharding_as_jax(mesh, osh):
    context = jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()
    with context:
        pairs = [
            (
                lambda: jnp.einsum("ij,jk->ik", X, VALUES, out_sharding=osh),
                lambda: emulate.einsum(
                    "ij,jk->ik",
                    X,
                    CODES,
                    operand_formats=(None, "float6_e2m3fn"),
                    out_sharding=osh,
                ),
            ),
            (
                lambda: lax.conv_general_dilated(
                    F8[None],
                    F8[:, :, None],
                    (1,),
                    "VALID",
                    preferred_element_type=jnp.float32,
                    out_sharding=osh,
                ),
                lambda: emulate.conv_general_dilated(
                    F8[None],
                    F8[:, :, None],
                    (1,),
                    "VALID",
                    preferred_element_type=jnp.float32,
                    out_sharding=osh,
                    target="tpu_v4",
                ),
            ),
        ]
        for theirs, ours in pairs:
            want, got = _outcome(theirs), _outcome(ours)
            assert got[0] == want[0]
            if isinstance(want[0], type):  # the same refusal, naming out_sharding
                assert got[1].startswith("out_sharding: ")
            else:
                assert got[1] == want[1]
