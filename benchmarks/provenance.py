"""Where a benchmark's figures come from, in the fields every result file shares.

A result kept in ``benchmarks/data/`` (and read by ``python -m benchmarks.report``) says
which benchmark wrote it, with which command, at which commit (40 hex digits), when, and on
what: the device, its target, the package versions. :func:`provenance` gives those fields;
the harness puts them at the head of every benchmark's JSON. Standard library and jax only
(a lent chip has jax, numpy and ml_dtypes, and maybe no ``.git``: pass the commit).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import time
from typing import Any

import jax


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None where it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*argv: str) -> str | None:
    try:
        out = subprocess.run(["git", *argv], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def commit(given: str | None) -> str | None:
    """The commit measured, in full (40 hex digits) where git can say it: ``given`` (a
    full or abbreviated name) resolved in the working directory's repository, else
    ``given`` as it is (no git, or no repository: a lent machine's copy of the tree);
    without ``given``, git's HEAD, else None."""
    if given:
        return _git("rev-parse", "--verify", "--quiet", f"{given}^{{commit}}") or given
    return _git("rev-parse", "HEAD")


def provenance(benchmark: str, command: str, given_commit: str | None = None) -> dict[str, Any]:
    """The fields at the head of every result file: ``benchmark`` (its module's name
    under ``benchmarks``), ``command``, ``commit`` (see :func:`commit`), ``date`` (UTC,
    ISO 8601, seconds), ``device_kind`` and ``platform`` of JAX's first device,
    ``target`` (emulate's name for it, None off a TPU), the versions of jax, jaxlib
    and libtpu (None where not installed), python's, and the machine's architecture
    and core count."""
    dev = jax.devices()[0]
    target = None
    if dev.platform == "tpu":
        import emulate

        target = emulate.targets.from_device(dev).name
    return {
        "benchmark": benchmark,
        "command": command,
        "commit": commit(given_commit),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "target": target,
        "jax": jax.__version__,
        "jaxlib": package_version("jaxlib"),
        "libtpu": package_version("libtpu") or package_version("libtpu-nightly"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def environment() -> dict[str, Any]:
    """Where and when a benchmark ran: versions, backend, cores, load, time."""
    try:
        load: list[float] | None = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_average": load,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # allocator settings that change the timings of programs with large temporaries
        "malloc_env": {k: v for k, v in os.environ.items() if k in _MALLOC_ENV},
    }


_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")
