"""Reading a checkpoint's quantization settings (the ``quantization_config`` of a Hugging
Face ``config.json``, or a project's own ``quantize_config.json`` / ``quant_config.json``
/ ``hf_quant_config.json``) without guessing: every setting is looked up by its documented
names, checked against what the parser handles, and refused with a ValueError naming the
config entry, the field, what it holds and what is accepted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from emulate.importers.conventions.readers import bad

__all__ = ["setting", "MISSING"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: Marks a setting without a default: absent means refused.
MISSING: Any = _Missing()


def setting(
    config: Mapping[str, Any],
    names: str | tuple[str, ...],
    *,
    where: str,
    kind: type | tuple[type, ...],
    allowed: Collection[Any] | None = None,
    default: Any = MISSING,
) -> Any:
    """The value of the first of ``names`` present in ``config``, of type ``kind`` and (if
    given) in ``allowed``; ``default`` when none is present (refused when MISSING).
    ``where`` names the config in messages (e.g. ``"quantization_config"``)."""
    keys = (names,) if isinstance(names, str) else names
    for key in keys:
        if key in config:
            value = config[key]
            ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is int)
            if not ok or (allowed is not None and value not in allowed):
                want = (
                    ", ".join(map(repr, allowed))
                    if allowed is not None
                    else (
                        kind.__name__
                        if isinstance(kind, type)
                        else "/".join(k.__name__ for k in kind)
                    )
                )
                raise bad(where, key, repr(value), f"one of {want}" if allowed else want)
            return value
    if default is MISSING:
        raise bad(where, keys[0], "missing", "the setting to be present (it is not guessed)")
    return default
