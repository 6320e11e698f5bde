"""The operations of a final bundle schedule that :mod:`emulate.compiler.replay` acts on,
compiled once per schedule: scalar arithmetic, SMEM loads and stores, the divider,
branches (with their delay slots), DMAs and their waits, sync-flag updates, ``vdelay``,
calls. Vector and matrix work compiles to nothing: it only counts as issued bundles.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from emulate.compiler.bundles import Op, Schedule, physical
from emulate.compiler.scalar import IMMEDIATE, SMEM, Getter, Value, getter, smem_address, value_fn

__all__ = [
    "BRANCH",
    "CALL",
    "DELAY",
    "DIVIDE",
    "DMA",
    "LOAD",
    "POP",
    "SET",
    "STORE",
    "SYNC_ADD",
    "SYNC_SET",
    "WAIT",
    "Compiled",
    "Step",
    "compile_schedule",
    "delay_slots",
]

_CALLEE = re.compile(r"%([\w.\-]+) = |^\s*(<[\w\-]+>)")
_TARGET = re.compile(r"\$region(\d+)")


def delay_slots(schedule: Schedule, slots: int) -> dict[int, int]:
    """For each branch of ``schedule`` (by address), the bundles it issues after itself
    before it takes effect: ``slots`` (the generation's, :class:`Machine`), or fewer for a
    forward branch whose target comes sooner (the bundles in between run either way)."""
    starts = schedule.region_starts()
    found: dict[int, int] = {}
    for b in schedule.bundles:
        for op in b.ops:
            if not op.opcode.startswith("sbr"):
                continue
            m = _TARGET.search(" ".join(op.operands))
            target = starts.get(int(m.group(1))) if m else None
            n = slots
            if target is not None and target > b.address:
                n = min(n, target - b.address - 1)
            found[b.address] = n
    return found


#: The kinds of operations the replay acts on (:attr:`Step.kind`): a scalar register
#: set, an SMEM load and store, a divide and a pop of its results, a branch, a DMA, a wait
#: for DMAs, a sync flag's add and set, a ``vdelay``, a call.
SET, LOAD, STORE, DIVIDE, POP, BRANCH, DMA, WAIT, SYNC_ADD, SYNC_SET, DELAY, CALL = range(12)


@dataclasses.dataclass
class Step:
    """One operation the replay acts on, compiled: its kind (:data:`SET` ... :data:`CALL`),
    its predicate, the register it writes, the value it computes, its arguments."""

    kind: int
    pred: Getter | None
    dest: str = ""  # the register written (SET, LOAD, POP)
    fn: Callable[[dict[str, Value]], Value] | None = None  # SET's value
    args: tuple[Any, ...] = ()


def _callee(op: Op) -> str:
    m = _CALLEE.search(op.comment)
    return (m.group(1) or m.group(2)) if m else ""


def _compile_op(op: Op, starts: Mapping[int, int]) -> Step | None:
    code = op.opcode
    if code == "sphi" or code.startswith(("shalt", "sfence", "cfence", "compiler")):
        return None
    if code.startswith("v") and not code.startswith(("vsyncadd", "vsyncpa", "vdelay")):
        return None  # vector work: it only counts as issued
    pred = getter(op.predicate) if op.predicate else None
    if code.startswith("v"):
        if code.startswith("vsyncadd") and op.operands:
            return Step(SYNC_ADD, pred, args=(getter(op.operands[0]), getter(op.operands[-1])))
        if code.startswith("vsyncpa") and op.operands:
            return Step(SYNC_SET, pred, args=(getter(op.operands[0]), getter(op.operands[-1])))
        if code == "vdelay" and op.operands:
            m = IMMEDIATE.match(op.operands[0])
            return Step(DELAY, pred, args=(int(m.group(1), 0) if m else 0,))
        return None
    if code == "sbr.rel" or code.startswith("sbr"):
        m = _TARGET.search(" ".join(op.operands))
        target = starts.get(int(m.group(1))) if m else None
        return Step(BRANCH, pred, args=(target,))
    if code == "dma.done.wait" and len(op.operands) >= 2:
        return Step(WAIT, pred, args=(getter(op.operands[0]), getter(op.operands[1])))
    if code == "dma" or code.startswith("dma."):
        if code == "dma.done.wait":
            return None
        return _dma_step(op, pred)
    if code == "inlined_call":
        return Step(CALL, pred, args=(_callee(op),))
    if code == "sdivrem.u32" and len(op.operands) == 2:
        a, b = getter(op.operands[0]), getter(op.operands[1])
        return Step(DIVIDE, pred, dest=op.dest, args=(a, b))
    if code.startswith("spop") and op.operands:
        return Step(POP, pred, dest=physical(op.dest), args=(op.operands[0],))
    if code == "sld" and op.operands:
        m = SMEM.match(op.operands[0])
        address = smem_address(m.group(1)) if m else (lambda r: None)
        return Step(LOAD, pred, dest=physical(op.dest), args=(address,))
    if code == "sst" and op.operands:
        m = SMEM.match(op.operands[0])
        if m is None:
            return None
        return Step(STORE, pred, args=(smem_address(m.group(1)), getter(m.group(2))))
    reg = physical(op.dest)
    if reg[:1] not in ("s", "p") or reg == op.dest:
        return None  # no scalar register written
    keep = getter(op.keeps) if op.keeps else None
    return Step(SET, pred, dest=reg, fn=value_fn(op), args=(keep,))


def _dma_step(op: Op, pred: Getter | None) -> Step:
    code = op.opcode
    window = op.window
    size = op.named.get("size_in_granules")
    granules = getter(size) if size is not None else None
    flag_text = op.named.get("dst_syncflagno")
    flag = getter(flag_text) if flag_text is not None else None
    direction = code.partition(".")[2]
    reads = direction.startswith("hbm")
    writes = direction.endswith("to_hbm")
    descriptor = None
    if code == "dma" and op.operands:  # v2/v3: the descriptor was stored to SMEM
        m = re.match(r"^\[#(\w+)", op.operands[0])
        descriptor = m.group(1) if m else ""
    return Step(
        DMA,
        pred,
        args=(window.nbytes if window else None, granules, flag, reads, writes, descriptor),
    )


@dataclasses.dataclass
class Compiled:
    """A schedule compiled for the replay."""

    steps: list[tuple[Step, ...]]  # per bundle: the operations the replay acts on
    next_busy: list[int]  # per bundle: the next bundle (>= it) with steps, or len
    delay_slots: dict[int, int]
    grid: tuple[int, ...]


def compile_schedule(schedule: Schedule, slots: int) -> Compiled:
    """``schedule``'s operations as :class:`Step` records, bundle by bundle, for a
    generation whose branches have ``slots`` delay slots."""
    starts = schedule.region_starts()
    steps: list[tuple[Step, ...]] = []
    grid: tuple[int, ...] = ()
    for b in schedule.bundles:
        compiled = tuple(s for op in b.ops if (s := _compile_op(op, starts)) is not None)
        steps.append(compiled)
        if not grid:
            for op in b.ops:
                if op.opcode.startswith("dma") and (w := op.window) and w.iteration_bounds:
                    grid = w.iteration_bounds
                    break
    nxt = [len(steps)] * (len(steps) + 1)
    for i in range(len(steps) - 1, -1, -1):
        nxt[i] = i if steps[i] else nxt[i + 1]
    return Compiled(steps, nxt, delay_slots(schedule, slots), grid)
