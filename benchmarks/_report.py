"""Writing a benchmark's report: the JSON, the markdown beside it, and an optional PNG.

matplotlib is only in the ``bench`` extra: the JSON and the markdown are the measurement,
the PNG only draws them, so a run without matplotlib says so and writes the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["legend_entries", "pyplot", "write"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or None (after printing
    how to install it) where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no PNG written")
        return None
    return plt


def legend_entries(axes: Iterable[Any]) -> tuple[list[Any], list[str]]:
    """The handles and labels of all ``axes``, each label once, in first-seen order: one
    figure legend for panels that each show some of the contenders."""
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    return handles, labels


def write(
    report: dict[str, Any],
    md: str,
    json_path: Path,
    plot: Callable[[dict[str, Any], Path], Path | None],
) -> None:
    """Write ``report`` to ``json_path``, ``md`` beside it (``.md``) and ``plot``'s PNG
    (``.png``, skipped where ``plot`` returns None); print each path written."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path = json_path.with_suffix(".md")
    md_path.write_text(md)
    print(f"wrote {json_path} and {md_path}")
    png = plot(report, json_path.with_suffix(".png"))
    if png is not None:
        print(f"wrote {png}")
