"""Replaying a final bundle schedule: how many cycles a TPU core spends on a program.

A TPU core issues one bundle a cycle, in order, with no out-of-order execution and no
caches to guess about; what varies from call to call is control flow (loops, predicated
regions, the grid of a Pallas kernel) and the waits for DMAs. :func:`replay` therefore runs
the program's *scalar* side exactly as the core would: the scalar registers, predicates
and SMEM (spills, DMA descriptors), every branch with its delay slots, the divider's
result queue; the vector and matrix work only counts as issued bundles. DMAs go on a
timeline: each moves its bytes at the HBM bandwidth, one after another, and a
``dma.done.wait`` stalls the core until the DMAs it waits for (by sync flag and granule
count) have landed. So a Pallas grid step costs the larger of its bundles and its DMA, and
the first step's fetch and the last write-back show as the prologue and epilogue they are.

What it cannot know is data: a value loaded from an input (a scalar-prefetch operand,
say) is unknown, and so is anything computed from it. A branch on an unknown predicate is
taken as not taken (a forward branch: the region runs, an upper bound; a loop's back edge:
the loop ends, a lower bound) and noted in :attr:`Run.unresolved`.

Semantics assumed (they reproduce the grid of every kernel checked; see
docs/targets.md): values are 32-bit; a bundle reads every register before any of its
operations writes one; a branch is taken after its delay slots (1 on v2, v3 and v4, 4 on
v5e, v5p, v6e and 7x: :class:`Machine`; libtpu ends the region holding a loop's back edge
that many bundles after it); ``vdelay N``
adds N cycles; a DMA's bytes are its comment's window, or its granules times
``granule_bytes``; a DMA's sync flag counts its granules when it lands, ``vsyncadd`` adds
to the count, ``vsyncpa`` sets it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from emulate.compiler.bundles import Op, Schedule, physical
from emulate.compiler.scalar import (
    IMMEDIATE,
    SMEM,
    Addr,
    Getter,
    Value,
    getter,
    signed,
    smem_address,
    value_fn,
)

__all__ = ["Machine", "Run", "delay_slots", "replay"]

_CALLEE = re.compile(r"%([\w.\-]+) = |^\s*(<[\w\-]+>)")
_TARGET = re.compile(r"\$region(\d+)")


@dataclasses.dataclass(frozen=True)
class Machine:
    """What a replay needs of a TPU generation.

    Attributes:
      clock_hz: the core's clock: bundles issued per second.
      hbm_bytes_per_second: the HBM bandwidth one core's DMAs share.
      granule_bytes: the unit of ``size_in_granules`` and of sync-flag counts.
      delay_slots: the bundles a branch issues after itself before it takes effect.
      cycles_per_bundle: cycles one issued bundle (or ``vdelay`` cycle) takes: 1.0 on the
        core's own terms; a calibration may set more (stalls the schedule does not show).
      dma_latency_s: a fixed time every DMA takes on top of its bytes (0: none).
      max_bundles: a guard: a replay that issues more bundles stops with a note.
    """

    clock_hz: float
    hbm_bytes_per_second: float
    granule_bytes: int
    delay_slots: int = 4
    cycles_per_bundle: float = 1.0
    dma_latency_s: float = 0.0
    max_bundles: int = 2_000_000_000


@dataclasses.dataclass(frozen=True)
class Run:
    """What replaying one program took.

    Attributes:
      name: the program (``"TLP"``, a fusion's or kernel's HLO name).
      issued: bundles issued (one cycle each).
      delay_cycles: cycles of ``vdelay`` (v2/v3: the core waits without issuing).
      stall_cycles: cycles the core waited on DMAs.
      hbm_read_bytes, hbm_write_bytes: bytes its DMAs moved from / to HBM (a DMA whose
        direction the schedule does not state counts as a read).
      dmas: the DMAs issued.
      loops: for each loop (the address its back edge jumps to), the back edges taken.
      grid: the grid its DMA windows state (``iteration_bounds``), or ``()``.
      unresolved: what the replay could not decide (a branch on an unknown value ...).
      calls: the runs of the programs it called (the top-level program's fusions and
        kernels), in call order; their cycles are part of this run's.
      start_cycle: the cycle it started at on the caller's timeline.
      cycles_per_bundle: the machine's (:class:`Machine`).
    """

    name: str
    issued: int
    delay_cycles: int
    stall_cycles: float
    hbm_read_bytes: int
    hbm_write_bytes: int
    dmas: int
    loops: Mapping[int, int]
    grid: tuple[int, ...]
    unresolved: tuple[str, ...]
    calls: tuple[Run, ...] = ()
    start_cycle: float = 0.0
    cycles_per_bundle: float = 1.0

    @property
    def issue_cycles(self) -> float:
        """Cycles of this program's own bundles and delays, stalls and callees excluded."""
        return (self.issued + self.delay_cycles) * self.cycles_per_bundle

    @property
    def own_cycles(self) -> float:
        """Cycles of this program's own bundles, delays and stalls, callees excluded."""
        return self.issue_cycles + self.stall_cycles

    @property
    def cycles(self) -> float:
        """Cycles from its first bundle to its last, callees included."""
        return self.own_cycles + sum(c.cycles for c in self.calls)

    @property
    def steps(self) -> int:
        """Grid steps: the product of :attr:`grid`, else 1 plus the back edges of its
        outermost loop (0 for a program without a loop)."""
        if self.grid:
            return math.prod(self.grid)
        return (max(self.loops.values()) + 1) if self.loops else 1


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


# --- the compiled program -------------------------------------------------------------

# Kinds of operations the replay acts on.
_SET, _SLD, _SST, _DIV, _POP, _BRANCH, _DMA, _WAIT, _SYNCADD, _SYNCSET, _DELAY, _CALL = range(12)


@dataclasses.dataclass
class _Step:
    """One operation the replay acts on, compiled."""

    kind: int
    pred: Getter | None
    dest: str = ""  # the register written (_SET, _SLD, _POP)
    fn: Callable[[dict[str, Value]], Value] | None = None  # _SET's value
    args: tuple[Any, ...] = ()


def _callee(op: Op) -> str:
    m = _CALLEE.search(op.comment)
    return (m.group(1) or m.group(2)) if m else ""


def _compile_op(op: Op, starts: Mapping[int, int]) -> _Step | None:
    code = op.opcode
    if code == "sphi" or code.startswith(("shalt", "sfence", "cfence", "compiler")):
        return None
    if code.startswith("v") and not code.startswith(("vsyncadd", "vsyncpa", "vdelay")):
        return None  # vector work: it only counts as issued
    pred = getter(op.predicate) if op.predicate else None
    if code.startswith("v"):
        if code.startswith("vsyncadd") and op.operands:
            return _Step(_SYNCADD, pred, args=(getter(op.operands[0]), getter(op.operands[-1])))
        if code.startswith("vsyncpa") and op.operands:
            return _Step(_SYNCSET, pred, args=(getter(op.operands[0]), getter(op.operands[-1])))
        if code == "vdelay" and op.operands:
            m = IMMEDIATE.match(op.operands[0])
            return _Step(_DELAY, pred, args=(int(m.group(1), 0) if m else 0,))
        return None
    if code == "sbr.rel" or code.startswith("sbr"):
        m = _TARGET.search(" ".join(op.operands))
        target = starts.get(int(m.group(1))) if m else None
        return _Step(_BRANCH, pred, args=(target,))
    if code == "dma.done.wait" and len(op.operands) >= 2:
        return _Step(_WAIT, pred, args=(getter(op.operands[0]), getter(op.operands[1])))
    if code == "dma" or code.startswith("dma."):
        if code == "dma.done.wait":
            return None
        return _dma_step(op, pred)
    if code == "inlined_call":
        return _Step(_CALL, pred, args=(_callee(op),))
    if code == "sdivrem.u32" and len(op.operands) == 2:
        a, b = getter(op.operands[0]), getter(op.operands[1])
        return _Step(_DIV, pred, dest=op.dest, args=(a, b))
    if code.startswith("spop") and op.operands:
        return _Step(_POP, pred, dest=physical(op.dest), args=(op.operands[0],))
    if code == "sld" and op.operands:
        m = SMEM.match(op.operands[0])
        address = smem_address(m.group(1)) if m else (lambda r: None)
        return _Step(_SLD, pred, dest=physical(op.dest), args=(address,))
    if code == "sst" and op.operands:
        m = SMEM.match(op.operands[0])
        if m is None:
            return None
        return _Step(_SST, pred, args=(smem_address(m.group(1)), getter(m.group(2))))
    reg = physical(op.dest)
    if reg[:1] not in ("s", "p") or reg == op.dest:
        return None  # no scalar register written
    keep = getter(op.keeps) if op.keeps else None
    return _Step(_SET, pred, dest=reg, fn=value_fn(op), args=(keep,))


def _dma_step(op: Op, pred: Getter | None) -> _Step:
    code = op.opcode
    window = op.window
    size = op.named.get("size_in_granules")
    granules = getter(size) if size is not None else None
    flag_text = op.named.get("dst_syncflagno")
    flag = getter(flag_text) if flag_text is not None else None
    direction = code.partition(".")[2]
    reads = direction.startswith("hbm") or code == "dma"
    writes = direction.endswith("to_hbm")
    if not (reads or writes):  # SMEM, host: not HBM traffic
        reads = writes = False
    return _Step(
        _DMA,
        pred,
        args=(window.nbytes if window else None, granules, flag, reads, writes),
    )


@dataclasses.dataclass
class _Compiled:
    steps: list[tuple[_Step, ...]]  # per bundle: the operations the replay acts on
    next_busy: list[int]  # per bundle: the next bundle (>= it) with steps, or len
    delay_slots: dict[int, int]
    grid: tuple[int, ...]


def _compile(schedule: Schedule, slots: int) -> _Compiled:
    starts = schedule.region_starts()
    steps: list[tuple[_Step, ...]] = []
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
    return _Compiled(steps, nxt, delay_slots(schedule, slots), grid)


# --- the run --------------------------------------------------------------------------


@dataclasses.dataclass
class _Dmas:
    """The DMA timeline one core's programs share."""

    machine: Machine
    free_at: float = 0.0  # cycle the DMA engine is next free

    def issue(self, now: float, nbytes: int) -> float:
        """The cycle a DMA of ``nbytes`` issued at ``now`` lands."""
        m = self.machine
        start = max(now, self.free_at)
        duration = nbytes / m.hbm_bytes_per_second * m.clock_hz
        self.free_at = start + duration
        return self.free_at + m.dma_latency_s * m.clock_hz


class _Flags:
    """Sync flags: each counts granules that landed; pending DMAs land later."""

    def __init__(self) -> None:
        self.count: dict[Any, int] = collections.defaultdict(int)
        self.pending: dict[Any, collections.deque[tuple[float, int]]] = collections.defaultdict(
            collections.deque
        )

    def land(self, flag: Any, now: float) -> None:
        q = self.pending.get(flag)
        while q and q[0][0] <= now:
            self.count[flag] += q.popleft()[1]

    def wait(self, flag: Any, need: int, now: float) -> float | None:
        """The cycle a wait for ``need`` granules on ``flag`` issued at ``now`` ends, or
        None when no pending DMA would ever bring the count there."""
        self.land(flag, now)
        q = self.pending.get(flag)
        t = now
        while self.count[flag] < need:
            if not q:
                unknown = self.pending.get(None)  # DMAs whose flag the replay did not see
                if not unknown:
                    return None
                q = unknown
            done, n = q.popleft()
            self.count[flag] += n
            t = max(t, done)
        return t


def replay(
    schedule: Schedule,
    machine: Machine,
    programs: Mapping[str, Schedule] | None = None,
    *,
    _dmas: _Dmas | None = None,
    _start: float = 0.0,
    _cache: dict[int, _Compiled] | None = None,
) -> Run:
    """Run ``schedule``'s control flow on ``machine``; the cycles it takes.

    ``programs``: the schedules an ``inlined_call`` of ``schedule`` may call, by name (the
    top-level program calls its fusions and kernels); a call to a program not there costs
    its one bundle and is noted in :attr:`Run.unresolved`.
    """
    cache = _cache if _cache is not None else {}
    compiled = cache.get(id(schedule))
    if compiled is None:
        compiled = cache[id(schedule)] = _compile(schedule, machine.delay_slots)
    dmas = _dmas if _dmas is not None else _Dmas(machine)
    flags = _Flags()
    regs: dict[str, Value] = {}
    smem: dict[Value, Value] = {}
    divider: collections.deque[Value] = collections.deque()
    unresolved: list[str] = []
    loops: collections.Counter[int] = collections.Counter()
    calls: list[Run] = []
    steps, nxt, slots = compiled.steps, compiled.next_busy, compiled.delay_slots
    n = len(steps)
    issued = delay = 0
    stall = 0.0
    read = written = count = 0
    pc = 0
    jump_at, jump_to = -1, 0  # a taken branch: after bundle jump_at, go to jump_to
    now = _start  # the current cycle on the shared timeline
    cpb = machine.cycles_per_bundle

    def note(text: str) -> None:
        if len(unresolved) < 20 and text not in unresolved:
            unresolved.append(text)

    while pc < n:
        if 0 <= jump_at < pc:
            pc, jump_at = jump_to, -1
            continue
        if not steps[pc]:  # bundles without scalar work: one cycle each
            limit = nxt[pc] if jump_at < 0 else min(nxt[pc], jump_at + 1)
            issued += limit - pc
            now += (limit - pc) * cpb
            pc = limit
            continue
        writes: list[tuple[str, Value]] = []
        stores: list[tuple[Value, Value]] = []
        for s in steps[pc]:
            if s.pred is not None:
                p = s.pred(regs)
                if p is None or isinstance(p, Addr):
                    if s.kind == _BRANCH:
                        note(f"branch at {pc:#x} on an unknown predicate: not taken")
                        continue
                    if s.kind == _SET or s.kind == _SLD or s.kind == _POP:
                        writes.append((s.dest, None))
                        continue
                elif not p:
                    continue
            kind = s.kind
            if kind == _SET:
                value = s.fn(regs) if s.fn is not None else None
                writes.append((s.dest, value))
            elif kind == _SLD:
                writes.append((s.dest, smem.get(s.args[0](regs))))
            elif kind == _SST:
                stores.append((s.args[0](regs), s.args[1](regs)))
            elif kind == _BRANCH:
                target = s.args[0]
                if target is None:
                    note(f"branch at {pc:#x} to a region the schedule does not start")
                    continue
                if target <= pc:
                    loops[target] += 1
                jump_at, jump_to = pc + slots.get(pc, 0), target
            elif kind == _DIV:
                a, b = s.args[0](regs), s.args[1](regs)
                ok = isinstance(a, int) and isinstance(b, int) and b
                # the divider's results pop in order: quotient, then remainder
                divider.extend((a // b, a % b) if ok else (None, None))
            elif kind == _POP:
                writes.append((s.dest, divider.popleft() if divider else None))
            elif kind == _DMA:
                nbytes, granules_of, flag_of, reads, writes_hbm = s.args
                granules = granules_of(regs) if granules_of is not None else None
                if nbytes is None:
                    nbytes = granules * machine.granule_bytes if isinstance(granules, int) else 0
                    if not isinstance(granules, int):
                        note(f"DMA at {pc:#x} of unknown size: counted as 0 bytes")
                if not isinstance(granules, int):
                    granules = -(-nbytes // machine.granule_bytes)
                count += 1
                if reads or writes_hbm:
                    read += nbytes if reads else 0
                    written += nbytes if writes_hbm and not reads else 0
                    done = dmas.issue(now, nbytes)
                else:
                    done = now
                flag = flag_of(regs) if flag_of is not None else None
                flags.pending[flag].append((done, granules))
            elif kind == _WAIT:
                flag, need = s.args[0](regs), s.args[1](regs)
                if not isinstance(need, int):
                    note(f"wait at {pc:#x} for an unknown count: no stall")
                    continue
                until = flags.wait(flag, need, now)
                if until is None:
                    note(f"wait at {pc:#x} for granules no DMA brings: no stall")
                elif until > now:
                    stall += until - now
                    now = until
            elif kind == _SYNCADD:
                flag, delta = s.args[0](regs), s.args[1](regs)
                if isinstance(delta, int):
                    flags.land(flag, now)
                    flags.count[flag] += signed(delta)
            elif kind == _SYNCSET:
                flag, value = s.args[0](regs), s.args[1](regs)
                flags.land(flag, now)
                flags.count[flag] = value if isinstance(value, int) else 0
            elif kind == _DELAY:
                delay += s.args[0]
                now += s.args[0] * cpb
            elif kind == _CALL:
                name = s.args[0]
                callee = (programs or {}).get(name)
                if callee is None:
                    note(f"call of {name or 'an unnamed program'}: not in the dump, 0 cycles")
                    continue
                run = replay(callee, machine, programs, _dmas=dmas, _start=now + cpb, _cache=cache)
                calls.append(run)
                now += run.cycles
        for reg, value in writes:
            regs[reg] = value
        for address, value in stores:
            smem[address] = value
        issued += 1
        now += cpb
        pc += 1
        if issued > machine.max_bundles:
            note(f"stopped after {machine.max_bundles} bundles")
            break
    return Run(
        name=schedule.name,
        issued=issued,
        delay_cycles=delay,
        stall_cycles=stall,
        hbm_read_bytes=read,
        hbm_write_bytes=written,
        dmas=count,
        loops=dict(loops),
        grid=compiled.grid,
        unresolved=tuple(unresolved),
        calls=tuple(calls),
        start_cycle=_start,
        cycles_per_bundle=cpb,
    )
