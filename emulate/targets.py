"""Target profiles: which operand pairs a device's matrix unit runs natively, and how fast.

One frozen :class:`Target` per hardware profile, in table order: the TPU generations
``tpu_v2`` ... ``tpu_v8i``, the XLA CPU backend ``cpu``, and the NVIDIA GPU profiles
``gpu_sm80``, ``gpu_sm89``, ``gpu_sm90``, ``gpu_sm100``.

TPU profiles are derived from JAX's own table
(``jax.experimental.pallas.tpu.get_tpu_info_for_chip(chip, 1)``, its ``is_matmul_supported``
and op rates) when the installed JAX has it; otherwise, or if reading it raises anything,
from the builtin copy of that table in :mod:`emulate.profiles`, which also holds the CPU and
GPU rows and says where their figures come from. :attr:`Target.source` records which
(``"jax"`` or ``"builtin"``); the tests check that the copy agrees with JAX's table.
TPU figures are per TensorCore, as JAX states them: multiply by
:attr:`Target.cores_per_chip` for a whole chip. Where the recorded probe of the real
compiler (:mod:`emulate.mosaic`) covers a TPU generation, its native pairs are the
compiler's, and :meth:`Target.compiles` answers whether Mosaic compiles a pair there.

The current target and the default mode a ``with use_target(...)`` / ``use_mode(...)``
block sets follow threads and asyncio tasks, and are part of every ``jax.jit`` cache key
(:mod:`emulate.context` keeps them): a function jitted under one block and called under
another is traced again, never run with the first target's program.
:func:`current_target` resolves, in order: an explicit argument, the innermost
``with use_target(...)`` block of this thread or task, the ``EMULATE_TARGET`` environment
variable, then detection from ``jax.devices()[0]``. :func:`current_mode` resolves an
explicit mode, the innermost ``with use_mode(...)`` block, then ``"fast"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import re
from collections.abc import Iterator
from typing import TypeAlias

import jax

from emulate import context, mosaic, moved, profiles
from emulate import formats as _formats
from emulate.formats import FormatLike
from emulate.profiles import OPERANDS, TPU_F32_PASSES

__all__ = [
    "OPERANDS",
    "TPU_F32_PASSES",
    "Target",
    "TargetLike",
    "all_targets",
    "build_table",
    "MODES",
    "current_mode",
    "current_target",
    "detect",
    "from_device",
    "get",
    "building_for_tpu",
    "tpu_branch",
    "names",
    "target",
    "use_mode",
    "use_target",
]


@dataclasses.dataclass(frozen=True)
class Target:
    """One hardware profile.

    Rates are dense peak multiply-add rates counted as 2 ops per multiply-add, in ops/s:
    0 means the target has no native path for that type, None that no figure is stated
    (the ``cpu`` profile). TPU figures are per TensorCore (JAX's convention); GPU figures
    per device, approximate.

    Attributes:
      name: canonical name (``"tpu_v5e"``).
      kind: ``"tpu"``, ``"cpu"`` or ``"gpu"``.
      generation: the TPU generation (2 ... 8); None for the CPU and GPUs (see
        ``compute_capability``).
      device_kinds: the ``jax.Device.device_kind`` strings :func:`detect` maps to this
        profile (TPUs and the CPU; GPUs are matched by compute capability).
      native_pairs: the (lhs, rhs) format-name pairs the matrix unit (TPU, at the
        Pallas/Mosaic level) or the compiler (XLA CPU/GPU) runs without converting,
        accumulating in int32 (two integer operands) or float32. Names as in
        :mod:`emulate.formats`; only pairs of :data:`OPERANDS` appear.
      bf16_ops_per_second: bf16 x bf16 rate.
      f32_ops_per_second: float32 x float32 rate at full float32 precision; on TPUs
        derived as ``bf16_ops_per_second // 6`` (XLA's six-pass bf16 scheme for
        ``Precision.HIGHEST``); on GPUs the CUDA-core float32 rate (no TF32).
      int8_ops_per_second, fp8_ops_per_second, int4_ops_per_second: rates for those
        operand types.
      mem_bw_bytes_per_second: main-memory (HBM) bandwidth, in bytes/s.
      vmem_capacity_bytes: TPU vector memory per TensorCore, in bytes; None elsewhere.
      mxu_column_size: width of a TPU matrix unit (128 or 256); None elsewhere.
      cores_per_chip: TensorCores per TPU chip (1 for the CPU and GPUs).
      compute_capability: the GPU profile's compute capability (``"9.0"``), else None.
      source: ``"jax"`` where the profile was read from JAX's TPU table, else
        ``"builtin"``.
      rules: where ``native_pairs`` comes from: ``"compiler"`` for the TPU generations of
        the recorded probe of the real compiler (:mod:`emulate.mosaic`: the pairs Mosaic
        compiles with its compatibility mode off), ``"table"`` otherwise (JAX's table or
        the builtin profile).
      table_pairs: where ``rules`` is ``"compiler"``, the pairs JAX's table (or its builtin
        copy) calls native, kept to show where the two disagree; else None.
    """

    name: str
    kind: str
    generation: int | None
    device_kinds: tuple[str, ...]
    native_pairs: frozenset[tuple[str, str]]
    bf16_ops_per_second: int | None
    f32_ops_per_second: int | None
    int8_ops_per_second: int | None
    fp8_ops_per_second: int | None
    int4_ops_per_second: int | None
    mem_bw_bytes_per_second: int | None
    vmem_capacity_bytes: int | None = None
    mxu_column_size: int | None = None
    cores_per_chip: int = 1
    compute_capability: str | None = None
    source: str = "builtin"
    rules: str = "table"
    table_pairs: frozenset[tuple[str, str]] | None = None

    def supports(self, lhs: FormatLike, rhs: FormatLike) -> bool:
        """Whether ``lhs x rhs`` runs natively; operands as format names, dtypes or Formats.

        Raises:
          ValueError, TypeError: an operand that is not a registered format.
        """
        return (_formats.get(lhs).name, _formats.get(rhs).name) in self.native_pairs

    def accumulator(self, lhs: FormatLike, rhs: FormatLike) -> str | None:
        """The accumulator format of the native ``lhs x rhs`` dot, or None if not native.

        ``"int32"`` for two integer operands, ``"float32"`` otherwise.
        """
        if not self.supports(lhs, rhs):
            return None
        return _formats.dot_accumulator(lhs, rhs)

    def compiles(
        self,
        lhs: FormatLike,
        rhs: FormatLike,
        *,
        acc: FormatLike | None = None,
        compat: bool = False,
    ) -> bool:
        """Whether Mosaic, the TPU kernel compiler, compiles a Pallas ``jnp.dot`` of ``lhs x
        rhs`` accumulating in ``acc`` (default: int32 for two integers, else float32) on
        this target, with its compatibility mode ``compat`` (default off: nothing converted).

        The recorded probe of the real compiler answers where it has the case
        (:func:`emulate.mosaic.verdict`). Elsewhere (a TPU generation or a case it did not
        probe, and every CPU and GPU profile) the profile's table answers: the pair must be
        native (:meth:`supports`), whatever ``acc``; on a TPU with ``compat`` off its two
        operands must also have one type (Mosaic refuses mixed element types without
        compatibility mode on every probed generation). What compatibility mode would
        convert there is not guessed. :func:`emulate.compiler.compiles` asks the real
        compiler instead.

        Raises:
          ValueError, TypeError: an operand or accumulator that is not a format.
        """
        found = mosaic.verdict(self.name, lhs, rhs, acc=acc, compat=compat)
        if found is not None:
            return found.ok
        mixed = _formats.get(lhs) != _formats.get(rhs)
        return self.supports(lhs, rhs) and not (self.kind == "tpu" and mixed and not compat)

    def rate(self, compute: str) -> float:
        """The matrix-unit rate (ops/s) for ``compute`` operands: "int8", "int4", "fp8",
        "bfloat16" or "float32"; 0.0 where the target has none or states none."""
        attr = {
            "int8": self.int8_ops_per_second,
            "int4": self.int4_ops_per_second,
            "bfloat16": self.bf16_ops_per_second,
            "float32": self.f32_ops_per_second,
            "fp8": self.fp8_ops_per_second,
        }
        if compute not in attr:
            raise ValueError(f"compute: expected one of {', '.join(attr)}, got {compute!r}")
        return float(attr[compute] or 0)

    def native_rate(self, lhs: FormatLike, rhs: FormatLike) -> float:
        """The rate (ops/s) of a native ``lhs x rhs`` dot, by the wider operand's type
        (int8/uint8, int4/uint4, float8, 16-bit floats; float32 otherwise)."""
        a, b = _formats.get(lhs), _formats.get(rhs)
        name = a.name if a == b else max(a.name, b.name, key=lambda n: _formats.get(n).bits)
        if name in ("int8", "uint8"):
            return self.rate("int8")
        if name in ("int4", "uint4"):
            return self.rate("int4")
        if name.startswith("float8"):
            return self.rate("fp8")
        if name in ("bfloat16", "float16"):
            return self.rate("bfloat16")
        return self.rate("float32")

    @property
    def native_formats(self) -> tuple[str, ...]:
        """The formats ``f`` of :data:`OPERANDS` with ``f x f`` native, in that order."""
        return tuple(f for f in OPERANDS if (f, f) in self.native_pairs)

    @property
    def has_int8_matmul(self) -> bool:
        """Whether int8 x int8 is native."""
        return ("int8", "int8") in self.native_pairs

    @property
    def has_int4_matmul(self) -> bool:
        """Whether int4 x int4 is native."""
        return ("int4", "int4") in self.native_pairs

    def __repr__(self) -> str:
        return f"Target({self.name!r})"


#: What names a target: a name or alias, a :class:`Target`, or None for the current one.
TargetLike: TypeAlias = str | Target | None


def _with_probe(t: Target) -> Target:
    """``t`` with the native pairs of the recorded compiler probe, where it has them."""
    probed = mosaic.native_pairs(t.name)
    if probed is None:
        return t
    pairs = frozenset(p for p in probed if p[0] in OPERANDS and p[1] in OPERANDS)
    return dataclasses.replace(t, native_pairs=pairs, rules="compiler", table_pairs=t.native_pairs)


def build_table() -> dict[str, Target]:
    """The profiles by canonical name, in table order, built afresh: TPU rows from JAX's
    table where it can be read (:func:`emulate.profiles.from_jax`), else the builtin rows;
    TPU native pairs from the recorded compiler probe where it has them. :func:`get` reads
    the table built once per process."""
    table = {}
    for row in profiles.BUILTIN:
        read = (profiles.from_jax(row) if row.kind == "tpu" else None) or row
        t = Target(**read._asdict())
        table[t.name] = _with_probe(t) if t.kind == "tpu" else t
    return table


_table = functools.cache(build_table)


def _key(name: str) -> str:
    """Normalized alias key: lower case, runs of spaces, dashes and underscores as ``_``."""
    return re.sub(r"[\s_-]+", "_", name.strip().lower())


@functools.cache
def _aliases() -> dict[str, str]:
    aliases: dict[str, str] = {}
    for t in profiles.BUILTIN:
        for alias in (t.name, *t.device_kinds, *profiles.ALIASES[t.name]):
            key = _key(alias)
            if aliases.setdefault(key, t.name) != t.name:
                raise AssertionError(f"alias {alias!r} names both {aliases[key]} and {t.name}")
    return aliases


def names() -> tuple[str, ...]:
    """The canonical target names, in table order."""
    return tuple(t.name for t in profiles.BUILTIN)


def all_targets() -> tuple[Target, ...]:
    """Every profile, in table order."""
    return tuple(_table().values())


def _unknown(arg: str, name: str) -> str:
    return f"{arg}: unknown target {name!r}; known targets: {', '.join(names())}"


def get(name: str | Target) -> Target:
    """The profile for a canonical name or alias (case-insensitive), or a Target as is.

    Aliases: short names (``"v5e"``), JAX device kinds (``"TPU v5 lite"``), code names
    (``"trillium"``, ``"ironwood"``), GPU architectures (``"sm90"``, ``"h100"``).

    Raises:
      ValueError: an unknown name; the message lists the canonical names.
      TypeError: anything but a string or Target.
    """
    if isinstance(name, Target):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"target: expected a target name or Target, got {type(name).__name__} {name!r}"
        )
    canonical = _aliases().get(_key(name))
    if canonical is None:
        raise ValueError(_unknown("target", name))
    return _table()[canonical]


def _parse_cc(compute_capability: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", compute_capability)
    if match is None:
        raise ValueError(
            f"compute_capability: expected 'major.minor' such as '9.0', got {compute_capability!r}"
        )
    return int(match[1]), int(match[2])


def detect(platform: str, device_kind: str = "", compute_capability: str | None = None) -> Target:
    """The profile for a device described by its JAX attributes; pure, needs no hardware.

    Args:
      platform: ``jax.Device.platform``: ``"cpu"``, ``"tpu"``, ``"gpu"`` or ``"cuda"``.
      device_kind: ``jax.Device.device_kind``; for TPUs one of the profiles'
        ``device_kinds`` (``"TPU v4"``, ``"TPU v5 lite"``, ``"TPU7x"``, ...).
      compute_capability: a CUDA device's ``"major.minor"``. A GPU gets the newest profile
        whose compute capability is at most this (so 8.6 -> sm80, 12.0 -> sm100), the
        oldest profile (sm80) if none is, or if the capability is unknown.

    Raises:
      ValueError: an unknown TPU device kind or platform; set ``EMULATE_TARGET`` then.
    """
    if not isinstance(platform, str):
        raise TypeError(
            f"platform: expected a string such as 'cpu', 'tpu' or 'gpu' "
            f"(jax.Device.platform), got {type(platform).__name__} {platform!r}"
        )
    if not isinstance(device_kind, str):
        raise TypeError(
            f"device_kind: expected a string (jax.Device.device_kind), got "
            f"{type(device_kind).__name__} {device_kind!r}"
        )
    if compute_capability is not None and not isinstance(compute_capability, str):
        raise TypeError(
            f"compute_capability: expected a 'major.minor' string or None, got "
            f"{type(compute_capability).__name__} {compute_capability!r}"
        )
    table = _table()
    kind = platform.strip().lower()
    if kind == "cpu":
        return table["cpu"]
    if kind in ("gpu", "cuda"):
        gpus = [
            (_parse_cc(t.compute_capability), t) for t in table.values() if t.compute_capability
        ]
        if not compute_capability:
            return gpus[0][1]
        cc = _parse_cc(compute_capability)
        fitting = [t for t_cc, t in gpus if t_cc <= cc]
        return fitting[-1] if fitting else gpus[0][1]
    if kind == "tpu":
        for t in table.values():
            if t.kind == "tpu" and device_kind in t.device_kinds:
                return t
        known = [k for t in table.values() if t.kind == "tpu" for k in t.device_kinds]
        raise ValueError(
            f"device_kind: unknown TPU device kind {device_kind!r}; known kinds: "
            f"{', '.join(known)}; set EMULATE_TARGET to pick a profile"
        )
    raise ValueError(
        f"platform: no target profile for platform {platform!r}; set EMULATE_TARGET to one "
        f"of: {', '.join(names())}"
    )


def from_device(device: jax.Device) -> Target:
    """The profile for a ``jax.Device``: :func:`detect` on its attributes."""
    cc = getattr(device, "compute_capability", None)
    kind = getattr(device, "device_kind", "")
    return detect(device.platform, kind, None if cc is None else str(cc))


_TPU_BRANCH: contextvars.ContextVar[bool] = contextvars.ContextVar("tpu_branch", default=False)


@contextlib.contextmanager
def tpu_branch() -> Iterator[None]:
    """Trace code inside the block that only a TPU lowering reaches (the TPU branch of a
    ``lax.platform_dependent``, as :func:`emulate.routing.run` builds it):
    :func:`building_for_tpu` is True there, whatever this process has. Lowering it for a
    TPU still needs the chip (a TPU backend or default device: :func:`compiler.compile`)."""
    token = _TPU_BRANCH.set(True)
    try:
        yield
    finally:
        _TPU_BRANCH.reset(token)


def building_for_tpu(*arrays: object) -> bool:
    """Whether the program being traced is built for a TPU: inside :func:`tpu_branch`, or
    where JAX's default backend, its default device (``jax.default_device``;
    :func:`emulate.compiler.compile` sets the target's compile-only device), the abstract
    mesh's device (``jax.sharding.use_abstract_mesh``) or the devices of a concrete array
    among the leaves of ``arrays`` (tracers carry none) is a TPU. A program traced with none
    of these and lowered for a TPU afterwards
    (``.trace(...).lower(lowering_platforms=("tpu",))``) cannot be seen here."""
    if _TPU_BRANCH.get():
        return True
    default = getattr(jax.config, "jax_default_device", None)  # Device, platform or None
    abstract = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    concrete = [
        a
        for a in jax.tree.leaves(arrays)
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
    ]
    platforms = {
        jax.default_backend(),
        getattr(default, "platform", default),
        getattr(abstract, "platform", None),
        *(d.platform for a in concrete for d in a.devices()),
    }
    return "tpu" in platforms


#: The modes of the matmuls: "fast" (bounded) and "exact" (docs/numerics.md).
MODES = ("fast", "exact")


@contextlib.contextmanager
def use_target(name: str | Target) -> Iterator[Target]:
    """Make ``name`` the current target inside a ``with`` block, for this thread or
    asyncio task only.

    Blocks nest; leaving one (also by an exception) restores the previous target. The
    setting lives in a ContextVar (each thread and each asyncio task sees its own blocks)
    and in one of JAX's context settings, part of ``jax.jit``'s cache key, so a function
    jitted under one target and called under another is traced again for that target
    (JAX's key is per thread: see :mod:`emulate.context` for asyncio tasks). Also exported
    as ``target`` (``with emulate.target("v5e"):``).

    Raises:
      ValueError: an unknown target name (before the block starts).
    """
    resolved = get(name)
    with context.entered(context.setting(traced=False)._replace(target=resolved)):
        yield resolved


target = use_target


def _check_mode(mode: str) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode


@contextlib.contextmanager
def use_mode(mode: str) -> Iterator[str]:
    """Make ``mode`` ("fast" or "exact") the default mode of every matmul inside a
    ``with`` block, for this thread or asyncio task only; an explicit ``mode=`` argument
    still wins.

    Blocks nest and restore on exit; like :func:`use_target` the setting is part of
    ``jax.jit``'s cache key. :func:`emulate.polyfill` enters it (with :func:`use_target`)
    while it traces the wrapped function.

    Raises:
      ValueError: a mode other than "fast" or "exact" (before the block starts).
    """
    with context.entered(context.setting(traced=False)._replace(mode=_check_mode(mode))):
        yield mode


def current_mode(mode: str | None = None) -> str:
    """The mode to run in: ``mode`` if given, else the innermost :func:`use_mode` block of
    this thread or task, else ``"fast"``.

    Raises:
      ValueError: a mode other than "fast" or "exact".
    """
    if mode is not None:
        return _check_mode(mode)
    return context.setting().mode or "fast"


def current_target(target: TargetLike = None) -> Target:
    """The target to plan for.

    Resolution order: ``target`` if given; the innermost :func:`use_target` block of this
    thread or asyncio task; the ``EMULATE_TARGET`` environment variable (read at each call);
    else the profile detected from ``jax.devices()[0]`` (:func:`from_device`).

    Raises:
      ValueError: an unknown ``target`` or ``EMULATE_TARGET`` value (the message names
        which), or a device with no profile.
    """
    if target is not None:
        return get(target)
    chosen = context.setting().target
    if chosen is not None:
        return chosen
    env = os.environ.get("EMULATE_TARGET", "").strip()
    if env:
        try:
            return get(env)
        except ValueError:
            raise ValueError(_unknown("EMULATE_TARGET", env)) from None
    return from_device(jax.devices()[0])


__getattr__ = moved.module_getattr(__name__)
