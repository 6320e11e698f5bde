"""A record's pytree methods written from its data-field and static-field lists.

A frozen dataclass that subclasses :class:`PytreeRecord` with
``data=("codes", ...), static=("format_name", ...)`` is registered with JAX: its data
fields are the children (leaves, or nested pytrees such as a Packed array or None), each
under its name in key paths (``GetAttrKey``, so a checkpoint path reads ``.codes``); its
static fields are the treedef's auxiliary data, a tuple in the order listed, so they must be
hashable, and two treedefs are equal exactly when their static values are.

Unflattening sets the fields without calling ``__init__`` or ``__post_init__``: JAX rebuilds
records with placeholder leaves (``object()``, ``None``, tracers) that a record's own checks
would refuse, while a record built by hand is still checked. (JAX's
``jax.tree_util.register_dataclass`` rebuilds through the constructor, hence this helper.)
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax

__all__ = ["PytreeRecord"]

_R = TypeVar("_R", bound="PytreeRecord")


class PytreeRecord:
    """Base class of a record whose pytree is only a data / static split of its fields.

    Subclass it with the keyword arguments ``data`` (the fields that are children, in
    order) and ``static`` (the fields kept in the treedef, in order); together they must
    name every annotated field of the class once, else a TypeError at class creation.
    The subclass gets ``tree_flatten_with_keys``, ``tree_flatten`` and the classmethod
    ``tree_unflatten`` (what ``register_pytree_with_keys_class`` reads) and is registered.
    """

    _pytree_data: tuple[str, ...] = ()
    _pytree_static: tuple[str, ...] = ()

    def __init_subclass__(
        cls, *, data: tuple[str, ...], static: tuple[str, ...] = (), **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        data, static = tuple(data), tuple(static)
        fields = tuple(cls.__dict__.get("__annotations__", {}))
        listed = data + static
        if len(set(listed)) != len(listed) or set(listed) != set(fields):
            raise TypeError(
                f"{cls.__name__}: data {data} and static {static} must name each of its "
                f"fields {fields} exactly once"
            )
        cls._pytree_data, cls._pytree_static = data, static
        jax.tree_util.register_pytree_with_keys(
            cls, cls.tree_flatten_with_keys, cls.tree_unflatten, cls.tree_flatten
        )

    def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Any], ...], tuple[Any, ...]]:
        children = tuple((jax.tree_util.GetAttrKey(n), getattr(self, n)) for n in self._pytree_data)
        return children, tuple(getattr(self, n) for n in self._pytree_static)

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return (
            tuple(getattr(self, n) for n in self._pytree_data),
            tuple(getattr(self, n) for n in self._pytree_static),
        )

    @classmethod
    def tree_unflatten(cls: type[_R], aux: tuple[Any, ...], children: Any) -> _R:
        obj = object.__new__(cls)
        children = tuple(children)
        if len(children) != len(cls._pytree_data) or len(aux) != len(cls._pytree_static):
            raise ValueError(
                f"{cls.__name__}.tree_unflatten: expected {len(cls._pytree_data)} children "
                f"and {len(cls._pytree_static)} static values, got {len(children)} and "
                f"{len(aux)}"
            )
        for name, value in zip(cls._pytree_data + cls._pytree_static, children + tuple(aux)):
            object.__setattr__(obj, name, value)
        return obj
