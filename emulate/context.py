"""Where the current target and mode are kept: a ContextVar, and jax.jit's key.

:mod:`emulate.targets` resolves the current target and mode (``use_target``,
``use_mode``, ``current_target``, ``current_mode``); this module holds what the ``with``
blocks set, a :class:`Setting`, in two places:

- a :class:`contextvars.ContextVar`, the truth: each thread starts with nothing set, and
  each asyncio task sees the blocks it entered, not those of other tasks in its thread;
- one of JAX's context settings (``jax.make_user_context``), part of the key of every
  ``jax.jit`` trace and cache: a function jitted under one target and called under another
  is traced again. JAX keeps that value per thread, not per task, and restores on exit the
  value it saw on entry; emulate sets it from the ContextVar on every entry and exit, and
  corrects it where it reads a stale one outside a trace. Inside a trace a stale key (asyncio
  tasks of one thread interleaving their blocks) would cache the program under another
  task's target: :func:`setting` refuses it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax

__all__ = ["Setting", "entered", "setting"]


class Setting(NamedTuple):
    """What the ``with`` blocks of a thread or task set: a target (an
    :class:`emulate.targets.Target`) and a mode (None: not set)."""

    target: Any
    mode: str | None


_UNSET = Setting(None, None)

_CONTEXT: contextvars.ContextVar[Setting] = contextvars.ContextVar(
    "emulate_setting", default=_UNSET
)

# Created at import: JAX asks that user contexts not be created concurrently.
_KEY = jax.make_user_context(default_value=_UNSET)


def setting(*, traced: bool = True) -> Setting:
    """The calling thread's or task's setting. ``traced=False``: without the check below
    (a block being entered sets the key itself).

    Raises:
      RuntimeError: a trace would be cached under another thread's or task's setting
        (asyncio tasks of one thread interleaved their blocks, or a thread was handed this
        task's context without entering a block itself).
    """
    value = _CONTEXT.get()
    keyed = _KEY.value
    keyed = keyed if isinstance(keyed, Setting) else _UNSET
    if keyed == value or not traced:
        return value
    from jax.extend.core import find_top_trace

    if type(find_top_trace(())).__name__ == "EvalTrace":  # not tracing: nothing cached yet
        _key_to(value)
        return value

    def describe(s: Setting) -> str:
        t = "none set" if s.target is None else s.target.name
        return t if s.mode is None else f"{t}, mode {s.mode!r}"

    raise RuntimeError(
        f"emulate.target: this code is traced under target {describe(value)}, but "
        f"jax.jit's cache key in this thread holds {describe(keyed)} (JAX keys jit by "
        "thread, and other asyncio tasks of this thread entered emulate.target or "
        "emulate.use_mode blocks meanwhile, or this thread did not enter the block "
        "itself); pass target= and mode= to the emulate calls, or call the jitted "
        "function with no await inside its block"
    )


def _key_to(value: Setting) -> None:
    """Set jax.jit's key in this thread to ``value``. JAX's context restores, on exit, the
    value it saw on entry, which is another task's when asyncio tasks interleave their
    blocks: the key is set from the ContextVar instead, so entering JAX's context without
    leaving it is the point (it holds one value per thread, not a stack)."""
    _KEY(value).__enter__()


@contextlib.contextmanager
def entered(value: Setting) -> Iterator[None]:
    """``value`` in the ContextVar and in jax.jit's key until the block ends; then the
    enclosing block's, of this thread or task."""
    token = _CONTEXT.set(value)
    _key_to(value)
    try:
        yield
    finally:
        _CONTEXT.reset(token)
        _key_to(_CONTEXT.get())
