"""emulate.flax.layers: rules normalised into one function, the scheme names they take."""

from __future__ import annotations

import pytest
from flax import nnx

import emulate
import emulate.flax.layers as efl


def _lin():
    return nnx.Linear(4, 2, rngs=nnx.Rngs(0))


def test_rules_choose_a_scheme_mode_and_whether_subclasses_match():
    fn = efl.rule_fn(
        [
            efl.Rule("skip", None),
            efl.Rule("exact_only", "MXFP4", mode="exact", subclasses=False),
            efl.Rule(".*", "int8"),
        ]
    )
    assert fn("skip", _lin()) is None
    got = fn("exact_only", _lin())
    assert (got.scheme, got.mode, got.subclasses) == (emulate.mx.MXFP4, "exact", False)
    got = fn("a/b", _lin())
    assert (got.scheme.name, got.scheme.format, got.mode, got.subclasses) == (
        "int8_PER_CHANNEL",
        "int8",
        None,
        True,
    )
    # a callable may answer with a Rule, a scheme or None
    by_fn = efl.rule_fn(lambda path, m: efl.Rule(path, "MXFP4", subclasses=False))
    assert by_fn("x", _lin()).subclasses is False
    assert efl.rule_fn(lambda path, m: "NVFP4")("x", _lin()).scheme == emulate.mx.NVFP4


@pytest.mark.parametrize(
    ("rule", "exc", "pattern"),
    [
        (efl.Rule(".*", "int8", subclasses="no"), ValueError, r"^rules: subclasses must be True "),
        (efl.Rule(".*", "int8", mode="slow"), ValueError, r"^rules: mode must be 'fast', 'exact'"),
        (efl.Rule(".*", "float32"), ValueError, r"^rules: expected an emulate.mx Scheme"),
        (5, TypeError, r"^rules: expected a Rule, a sequence of Rules"),
    ],
)
def test_bad_rules_are_refused_when_normalised(rule, exc, pattern):
    with pytest.raises(exc, match=pattern):
        efl.rule_fn(rule)
