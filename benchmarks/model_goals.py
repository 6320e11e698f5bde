"""Issue 47's goals for quantized KV caches, read off ``benchmarks.models``' rows: each
goal met, or its measured distance and the reason, for the markdown report.

- a decode step with a quantized cache moves at most 1.1x (v4 to 7x) / 1.25x (v2, v3) of
  its stored weights + stored cache (+ activations: the rows' ideal bytes), by the bytes
  its compiled schedule's DMAs move (libtpu's count beside);
- Llama-3-8B Q4_K_M, 16 sequences of 4096 tokens, fits one v2 core with a 4-bit cache;
- the same fits one v5e with an 8-bit cache with at least 4 GiB to spare;
- Llama-3-70B Q4_K_M, 16 sequences of 8192 tokens, fits 8 v5e chips with an 8-bit cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["EIGHT_BIT", "FOUR_BIT", "goal_lines"]

EIGHT_BIT = ("int8", "float8_e4m3fn", "float8_e5m2", "int8_per_head", "q8_0")
FOUR_BIT = ("q4_0", "mxfp4")
_GiB = 1 << 30


def _bytes_goal(r: dict[str, Any]) -> str:
    """The step's bytes against the goal: what the compiled schedule's DMAs move between
    HBM and VMEM where the row has it (``dma_over_ideal``: the chip's traffic), with
    libtpu's "bytes accessed" beside it (which also counts XLA's ops on values held in
    VMEM: the norms, RoPE and the cache write's merge, about 16 MB a layer of the 8B at
    16 sequences that no DMA moves); libtpu's count alone where there is no schedule."""
    limit = 1.25 if r["generation"] in ("tpu_v2", "tpu_v3") else 1.1
    counted = r["bytes_over_ideal"]
    dma = r.get("dma_over_ideal")
    got = counted if dma is None else dma
    head = f"{r['model']} {r['step']} {r['generation']} {r['cache']} cache: {got:.3f}x"
    if dma is not None:
        head += f" by the schedule's DMAs (libtpu's bytes accessed {counted:.3f}x)"
    if got <= limit:
        return f"- met: {head} <= {limit}x"
    return f"- **not met**: {head} > {limit}x, over by {got - limit:.3f}x of the ideal"


def _fit_goal(rows: Sequence[dict[str, Any]], what: str, spare: float = 0.0) -> str:
    if not rows:
        return f"- not measured here: {what}"
    best = min(rows, key=lambda r: r["footprint"])
    room = (best["hbm"] - best["footprint"]) / _GiB
    head = (
        f"{what}: {best['cache']} cache, {best['footprint'] / _GiB:.2f} GiB of "
        f"{best['hbm'] / _GiB:.0f} GiB ({room:.2f} GiB spare)"
    )
    if room >= spare:
        return f"- met: {head}"
    return f"- **not met**: {head}, {spare - room:.2f} GiB short"


def goal_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown lines: every measured quantized-cache decode row against the bytes goal,
    then the three footprint goals (each met, short by how much, or not measured)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("cache")]
    if not ok:
        return []

    def pick(model: str, gen: str, step: str, caches: tuple[str, ...]) -> list[dict]:
        return [
            r for r in ok
            if (r["model"], r["generation"], r["step"]) == (model, gen, step)
            and r["cache"] in caches
        ]  # fmt: skip

    lines = ["#### Goals for quantized KV caches (issue 47)", ""]
    lines += [_bytes_goal(r) for r in ok if r["step"].startswith("decode")]
    lines.append(
        _fit_goal(
            pick("llama3-8b-q4_k_m", "tpu_v2", "decode-16", FOUR_BIT),
            "Llama-3-8B Q4_K_M, 16 x 4096 tokens, one v2 core, a 4-bit cache",
        )
    )
    lines.append(
        _fit_goal(
            pick("llama3-8b-q4_k_m", "tpu_v5e", "decode-16", EIGHT_BIT),
            "Llama-3-8B Q4_K_M, 16 x 4096 tokens, one v5e, an 8-bit cache, 4 GiB spare",
            spare=4.0,
        )
    )
    lines.append(
        _fit_goal(
            pick("llama3-70b-q4_k_m-tp8", "tpu_v5e", "decode-16x8192", EIGHT_BIT),
            "Llama-3-70B Q4_K_M, 16 x 8192 tokens, 8 v5e chips, an 8-bit cache",
        )
    )
    return [*lines, ""]
