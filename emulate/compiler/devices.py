"""libtpu and the compile-only TPU devices: which generations the installed compiler offers.

With libtpu installed (``pip install "jax[tpu]"``), ``jax.experimental.topologies`` hands
out compile-only TPU devices: ``jax.jit(f).lower(specs on that device).compile()`` runs the
real XLA:TPU and Mosaic compilers, and nothing executes. :data:`TOPOLOGIES` maps each TPU
target (:mod:`emulate.targets`) to the libtpu topology that stands for it (``"tpu_v5e"`` ->
``"v5e:2x2"``), or to None where libtpu offers none (``tpu_v4i``, ``tpu_v7``, ``tpu_v8i`` in
libtpu 0.0.42.1: ``v4i`` and ``v7`` are refused as "Invalid TPU external name", and no name
for 8i is known; none is guessed).

libtpu prints warnings about ``TPU_ACCELERATOR_TYPE`` and ``TPU_WORKER_HOSTNAMES`` when it
loads on a machine without a TPU. They are harmless; this module loads libtpu with file
descriptor 2 redirected and passes on only the lines that are not those warnings
(:func:`is_libtpu_noise`). Where something else loaded libtpu first (``jax.devices()``
does, when libtpu is installed), the warnings have already been printed and cannot be
taken back.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.metadata
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import Final

import jax

from emulate import targets as _targets

__all__ = [
    "COMPAT_FLAG",
    "TOPOLOGIES",
    "CompilerUnavailable",
    "available",
    "compat_mode",
    "compat_setting",
    "device",
    "first_line",
    "generations",
    "is_libtpu_noise",
    "libtpu_version",
    "offered_devices",
    "on_device",
    "skip_absent_tpu_backend",
]

#: Each TPU target's libtpu topology (the first device of which is the compile-only device),
#: or None where the installed libtpu (0.0.42.1 when this was written) offers no topology.
TOPOLOGIES: Final[Mapping[str, str | None]] = {
    "tpu_v2": "v2:2x2",
    "tpu_v3": "v3:2x2",
    "tpu_v4": "v4:2x2x1",
    "tpu_v4i": None,  # "v4i:2x2": Invalid TPU external name: TPU v4i
    "tpu_v5e": "v5e:2x2",
    "tpu_v5p": "v5p:2x2x1",
    "tpu_v6e": "v6e:2x2",
    "tpu_v7": None,  # "v7:2x2x1": Invalid TPU external name: TPU v7
    "tpu_v7x": "tpu7x:2x2x1",
    "tpu_v8i": None,  # no topology name known for 8i
}


#: libtpu's flag for Mosaic's compatibility mode (in ``LIBTPU_INIT_ARGS``).
COMPAT_FLAG: Final = "--xla_mosaic_compat_mode"

# libtpu's start-up warnings on a machine without a TPU (see the module docstring).
_NOISE = re.compile(
    r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle|"
    r"Source Location Trace|libtpu_init_utils\.cc|^\s*$"
)


class CompilerUnavailable(RuntimeError):
    """The real TPU compiler cannot run here: libtpu is not installed or does not load.

    A RuntimeError rather than an ImportError: :mod:`emulate.compiler` itself always
    imports; what is missing is a capability of this environment, found when a function
    needs it, and ``except ImportError`` guards around imports should not swallow it.
    """

    @classmethod
    def because(cls, reason: str) -> CompilerUnavailable:
        """The error for ``reason``, with how to install the compiler."""
        return cls(
            f"the real TPU compiler is unavailable: {reason}; install it with "
            "pip install 'jax[tpu]' (or emulate[tpu]). The recorded probe "
            "(emulate.mosaic.recorded(), verdict()) needs no compiler."
        )


def is_libtpu_noise(line: str) -> bool:
    """Whether a line of stderr is one of libtpu's harmless start-up warnings (or blank)."""
    return bool(_NOISE.search(line))


def first_line(text: str) -> str:
    """The first meaningful line of a compiler error, without the boilerplate."""
    for line in text.splitlines():
        line = line.strip()
        for prefix in ("INTERNAL: ", "Mosaic failed to compile TPU kernel: "):
            if line.startswith(prefix):
                line = line[len(prefix) :].strip()
        if line:
            return line[:400]
    return text.strip()[:400]


def libtpu_version() -> str | None:
    """The installed libtpu's version (``"0.0.42.1"``), or None if it is not installed.

    Reads the package metadata of ``libtpu`` (or ``libtpu-nightly``); loads nothing.
    """
    for dist in ("libtpu", "libtpu-nightly"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def compat_setting(init_args: str) -> bool:
    """The compat setting a ``LIBTPU_INIT_ARGS`` value asks for (the last flag wins; on
    when none is given)."""
    setting = True
    for m in re.finditer(rf"{COMPAT_FLAG}(?:=(\S*))?", init_args):
        setting = (m.group(1) or "true").lower() not in ("false", "0", "no")
    return setting


_lock = threading.RLock()
_compat_at_load: bool | None = None


def compat_mode() -> bool:
    """This process's Mosaic compatibility mode: True unless ``LIBTPU_INIT_ARGS`` says
    ``--xla_mosaic_compat_mode=false``.

    libtpu reads the flag once, when it loads; this returns the value that the variable
    held when this module first loaded libtpu, or, before that, the value it holds now.
    If something else loaded libtpu earlier with other arguments, the answer can be wrong.
    """
    with _lock:
        if _compat_at_load is not None:
            return _compat_at_load
    return compat_setting(os.environ.get("LIBTPU_INIT_ARGS", ""))


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Redirect file descriptor 2; afterwards pass on the lines that are not libtpu noise."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real fd 2 (an embedded interpreter)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [
                line
                for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                if not is_libtpu_noise(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))


def _has_tpu_chips() -> bool:
    """Whether this machine has TPU chips (the device files JAX looks for)."""
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def _gpu_plugin_installed() -> bool:
    names = (d.metadata["Name"] or "" for d in importlib.metadata.distributions())
    return any(n.lower().replace("_", "-").startswith(("jax-cuda", "jax-rocm")) for n in names)


def skip_absent_tpu_backend() -> bool:
    """Keep JAX from starting a TPU backend on a machine that has no TPU chip.

    With libtpu installed, JAX's first ``jax.devices()`` (any computation) starts its TPU
    backend; without a chip, libtpu prints five lines about ``TPU_ACCELERATOR_TYPE`` and
    ``TPU_WORKER_HOSTNAMES`` on stderr, fails, and JAX goes on with the CPU. This sets
    ``jax_platforms`` to ``"cpu"`` first, so nothing is started and nothing printed; the
    compile-only devices (:func:`offered_devices`) load libtpu by themselves and still work.
    It does so only where the outcome is the same: ``JAX_PLATFORMS`` / ``jax_platforms``
    unset, libtpu installed, no TPU chip device file, and no GPU plugin of JAX installed
    (whose backend ``"cpu"`` would leave out). Returns whether it set ``jax_platforms``.
    """
    if getattr(jax.config, "jax_platforms", None) or libtpu_version() is None or _has_tpu_chips():
        return False
    if _gpu_plugin_installed():
        return False
    jax.config.update("jax_platforms", "cpu")
    return True


@functools.cache
def offered_devices() -> dict[str, jax.Device]:
    """The compile-only device per TPU target whose topology the installed libtpu accepts,
    in table order; loads libtpu on the first call (about half a second), then cached.

    Raises:
      CompilerUnavailable: libtpu is not installed or offers no topology.
    """
    global _compat_at_load
    version = libtpu_version()
    if version is None:
        raise CompilerUnavailable.because("libtpu is not installed")
    try:
        from jax.experimental import topologies
    except ImportError as e:  # pragma: no cover - part of every jax >= 0.4
        raise CompilerUnavailable.because(
            f"jax.experimental.topologies does not import ({e})"
        ) from e
    found: dict[str, jax.Device] = {}
    errors: list[str] = []
    with _lock:
        if _compat_at_load is None:
            _compat_at_load = compat_setting(os.environ.get("LIBTPU_INIT_ARGS", ""))
        if not _has_tpu_chips():
            # libtpu takes /tmp/libtpu_lockfile, which guards TPU chips, when it loads: a
            # second process (the other compat setting, a pytest-xdist worker) would then
            # fail. Without chips there is nothing to guard.
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        with _quiet_stderr():
            for target, name in TOPOLOGIES.items():
                if name is None:
                    continue
                try:
                    found[target] = topologies.get_topology_desc(name, "tpu").devices[0]
                except Exception as e:  # noqa: BLE001 - libtpu raises JaxRuntimeError
                    errors.append(f"{name}: {first_line(str(e))}")
    if not found:
        raise CompilerUnavailable.because(
            f"libtpu {version} is installed but offers no TPU topology ({'; '.join(errors)})"
        )
    return found


@functools.cache
def topology_devices(topology: str) -> tuple[jax.Device, ...]:
    """The compile-only devices of a multi-chip libtpu topology, for a
    ``jax.sharding.Mesh`` over them (nothing executes; ``jax.jit(...).lower(...).compile()``
    runs the real compiler for the sharded program, collectives included).

    ``topology`` is libtpu's name: ``"v5e:2x4"``, ``"v6e:2x4"``, ``"v5p:2x2x2"`` (8 chips,
    one device each), ``"v4:2x2x2"``, ``"tpu7x:2x2x2"`` (8 chips, 16 devices: libtpu
    0.0.42.1 lists their two TensorCores a chip apart, ``core_on_chip`` 0 and 1; take one
    of each chip for a mesh of chips); :data:`TOPOLOGIES` lists each target's one-chip
    name.

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError: a name libtpu refuses (its message).
    """
    offered_devices()  # loads libtpu as this module does (the lockfile setting)
    from jax.experimental import topologies

    try:
        with _quiet_stderr():
            return tuple(topologies.get_topology_desc(topology, "tpu").devices)
    except Exception as e:  # noqa: BLE001 - libtpu raises JaxRuntimeError
        raise ValueError(
            f"topology: libtpu {libtpu_version()} refuses {topology!r} ({first_line(str(e))}); "
            'names look like "v5e:2x4" or "v4:2x2x2"'
        ) from e


def available() -> bool:
    """Whether the real TPU compiler runs here (libtpu installed and loads).

    The first call loads libtpu (about half a second); the answer is cached.
    """
    try:
        offered_devices()
    except CompilerUnavailable:
        return False
    return True


def generations() -> tuple[str, ...]:
    """The TPU target names the installed libtpu offers a compile-only device for, in
    table order (``("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e",
    "tpu_v7x")`` with libtpu 0.0.42.1).

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
    """
    return tuple(offered_devices())


def device(target: str | _targets.Target) -> jax.Device:
    """The compile-only device standing for ``target`` (cached: the same object each call).

    ``target`` is a target name, alias (``"v5e"``, ``"ironwood"``) or Target. Compiling for
    it runs the real compiler; nothing can execute on it (``jax.device_put`` fails).

    Raises:
      ValueError: an unknown target (the message of :func:`emulate.targets.get`); a
        target that is not a TPU; a TPU target the installed libtpu offers no topology
        for (``tpu_v4i``, ``tpu_v7``, ``tpu_v8i``). The message names the argument, what
        it got and the accepted targets.
      CompilerUnavailable: libtpu is not installed or does not load.
    """
    name = _targets.get(target).name
    devices = offered_devices()
    if name in devices:
        return devices[name]
    accepted = ", ".join(devices)
    if name not in TOPOLOGIES:
        raise ValueError(
            f"target: the TPU compiler compiles for TPU targets only, got {name!r}; "
            f"accepted: {accepted}"
        )
    raise ValueError(
        f"target: libtpu {libtpu_version()} offers no compile-only topology for {name!r}; "
        f"accepted: {accepted}"
    )


@contextlib.contextmanager
def on_device(dev: jax.Device, target: _targets.TargetLike = None) -> Iterator[None]:
    """Trace and lower a program for ``dev`` and ``target``: ``dev`` is JAX's default device
    and the abstract mesh's device, and ``target`` (default: the target ``dev`` stands for,
    from its ``device_kind``) emulate's current target, as in ``emulate.target(target)``.

    So code that asks what it runs on sees the target, whether it reads emulate's target
    (``emulate.pallas.matmul``, every drop-in's plan), ``jax.devices()``'s default
    (``pltpu.get_tpu_info()``) or the abstract mesh (``pltpu.create_tensorcore_mesh``,
    which ``pl.kernel`` kernels call while they are traced, and which on a machine without
    a TPU would otherwise read the CPU)."""
    if target is None:
        target = _targets.detect("tpu", dev.device_kind)
    abstract = jax.sharding.AbstractDevice(
        device_kind=dev.device_kind, num_cores=getattr(dev, "num_cores", 1), platform="tpu"
    )
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=abstract)
    with (
        _targets.use_target(target),
        jax.default_device(dev),
        jax.sharding.use_abstract_mesh(mesh),
    ):
        yield
