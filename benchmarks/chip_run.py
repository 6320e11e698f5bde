"""What a timing run on a lent chip records about itself, for the raw JSON it writes:
package versions and the commit measured. Standard library only (a lent machine has
jax, numpy and ml_dtypes, and maybe no ``.git``: pass the commit)."""

from __future__ import annotations

import importlib.metadata
import subprocess


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None where it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def commit(given: str | None) -> str | None:
    """``given`` if set, else git's HEAD of the working directory, else None (no git, or
    no repository: a lent machine's copy of the tree)."""
    if given:
        return given
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None
