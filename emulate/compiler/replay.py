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
from collections.abc import Callable, Mapping
from typing import Any, Final

from emulate.compiler.bundles import Schedule
from emulate.compiler.scalar import Addr, Value, signed
from emulate.compiler.steps import (
    BRANCH,
    CALL,
    DELAY,
    DIVIDE,
    DMA,
    LOAD,
    POP,
    SET,
    STORE,
    SYNC_ADD,
    SYNC_SET,
    WAIT,
    Compiled,
    Step,
    compile_schedule,
    delay_slots,
)

__all__ = ["Machine", "Run", "delay_slots", "replay"]


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


#: The granularity (cycles) of the DMA backlog a memoized callee run is keyed by.
_BACKLOG_STEP: Final = 64


@dataclasses.dataclass
class _Memo:
    """What one replay reuses: each schedule compiled once, and each callee's run by the
    DMA backlog it started with (a callee starts with fresh registers and flags, so its
    run depends on nothing else: a loop calling a kernel 20 times replays it once)."""

    compiled: dict[int, Compiled] = dataclasses.field(default_factory=dict)
    runs: dict[tuple[int, int], tuple[Run, float]] = dataclasses.field(default_factory=dict)


def _call(
    callee: Schedule,
    machine: Machine,
    programs: Mapping[str, Schedule] | None,
    dmas: _Dmas,
    start: float,
    memo: _Memo,
) -> Run:
    """``callee``'s run from cycle ``start`` on the shared DMA timeline."""
    # the backlog in steps of _BACKLOG_STEP cycles: a loop's calls then replay once
    backlog = int(max(dmas.free_at - start, 0) // _BACKLOG_STEP) * _BACKLOG_STEP
    key = (id(callee), backlog)
    if key in memo.runs:
        run, free_after = memo.runs[key]
        dmas.free_at = max(dmas.free_at, start + free_after)
        return dataclasses.replace(run, start_cycle=start)
    run = replay(callee, machine, programs, _dmas=dmas, _start=start, _cache=memo)
    memo.runs[key] = (run, dmas.free_at - start)
    return run


class _Core:
    """One program's replay: the core's scalar state, its position and its counts."""

    def __init__(
        self,
        schedule: Schedule,
        machine: Machine,
        programs: Mapping[str, Schedule] | None,
        dmas: _Dmas,
        start: float,
        memo: _Memo,
    ) -> None:
        compiled = memo.compiled.get(id(schedule))
        if compiled is None:
            compiled = memo.compiled[id(schedule)] = compile_schedule(schedule, machine.delay_slots)
        self.schedule, self.compiled, self.machine = schedule, compiled, machine
        self.programs, self.dmas, self.memo, self.start = programs or {}, dmas, memo, start
        self.flags = _Flags()
        self.regs: dict[str, Value] = {}
        self.smem: dict[Value, Value] = {}
        self.divider: collections.deque[Value] = collections.deque()
        self.unresolved: list[str] = []
        self.loops: collections.Counter[int] = collections.Counter()
        self.calls: list[Run] = []
        self.issued = self.delay = self.read = self.written = self.dmas_issued = 0
        self.stall = 0.0
        self.now = start  # the current cycle on the shared timeline
        self.cpb = machine.cycles_per_bundle
        self.pc = 0
        self.jump_at, self.jump_to = -1, 0  # a taken branch: after jump_at, go to jump_to
        # this bundle's register and SMEM writes, applied when it ends
        self.writes: list[tuple[str, Value]] = []
        self.stores: list[tuple[Value, Value]] = []

    def note(self, text: str) -> None:
        if len(self.unresolved) < 20 and text not in self.unresolved:
            self.unresolved.append(text)

    def run(self) -> Run:
        steps, nxt = self.compiled.steps, self.compiled.next_busy
        n = len(steps)
        while True:
            if 0 <= self.jump_at < self.pc:
                self.pc, self.jump_at = self.jump_to, -1
            pc = self.pc
            if pc >= n:
                break
            if not steps[pc]:  # bundles without scalar work: one cycle each
                limit = nxt[pc] if self.jump_at < 0 else min(nxt[pc], self.jump_at + 1)
                self.issued += limit - pc
                self.now += (limit - pc) * self.cpb
                self.pc = limit
                continue
            self.bundle(steps[pc])
            if self.issued > self.machine.max_bundles:
                self.note(f"stopped after {self.machine.max_bundles} bundles")
                break
        return Run(
            name=self.schedule.name,
            issued=self.issued,
            delay_cycles=self.delay,
            stall_cycles=self.stall,
            hbm_read_bytes=self.read,
            hbm_write_bytes=self.written,
            dmas=self.dmas_issued,
            loops=dict(self.loops),
            grid=self.compiled.grid,
            unresolved=tuple(self.unresolved),
            calls=tuple(self.calls),
            start_cycle=self.start,
            cycles_per_bundle=self.cpb,
        )

    def bundle(self, steps: tuple[Step, ...]) -> None:
        """Issue the bundle at ``pc``: every operation reads the registers as they were
        before it; then its writes land and the core moves on a cycle."""
        regs = self.regs
        for s in steps:
            if s.pred is not None:
                p = s.pred(regs)
                if p is None or isinstance(p, Addr):
                    if s.kind == BRANCH:
                        self.note(f"branch at {self.pc:#x} on an unknown predicate: not taken")
                        continue
                    if s.kind in (SET, LOAD, POP):
                        self.writes.append((s.dest, None))
                        continue
                elif not p:
                    continue
            self.HANDLERS[s.kind](self, s)
        for reg, value in self.writes:
            regs[reg] = value
        for address, value in self.stores:
            self.smem[address] = value
        self.writes.clear()
        self.stores.clear()
        self.issued += 1
        self.now += self.cpb
        self.pc += 1

    def set(self, s: Step) -> None:
        self.writes.append((s.dest, s.fn(self.regs) if s.fn is not None else None))

    def load(self, s: Step) -> None:
        self.writes.append((s.dest, self.smem.get(s.args[0](self.regs))))

    def store(self, s: Step) -> None:
        self.stores.append((s.args[0](self.regs), s.args[1](self.regs)))

    def branch(self, s: Step) -> None:
        target = s.args[0]
        if target is None:
            self.note(f"branch at {self.pc:#x} to a region the schedule does not start")
            return
        if target <= self.pc:
            self.loops[target] += 1
        self.jump_at = self.pc + self.compiled.delay_slots.get(self.pc, 0)
        self.jump_to = target

    def divide(self, s: Step) -> None:
        a, b = s.args[0](self.regs), s.args[1](self.regs)
        ok = isinstance(a, int) and isinstance(b, int) and b
        # the divider's results pop in order: quotient, then remainder
        self.divider.extend((a // b, a % b) if ok else (None, None))

    def pop(self, s: Step) -> None:
        self.writes.append((s.dest, self.divider.popleft() if self.divider else None))

    def direction(self, descriptor: str) -> tuple[bool, bool]:
        """(reads, writes) HBM of a descriptor DMA: its descriptor's words name the
        buffers it moves between; an output operand's is a write, else a read."""
        words = [self.smem.get(Addr(descriptor, i)) for i in range(8)]
        kinds = {w.base.split()[0] for w in words if isinstance(w, Addr)}
        return "output" not in kinds, "output" in kinds

    def dma(self, s: Step) -> None:
        nbytes, granules_of, flag_of, reads, writes_hbm, descriptor = s.args
        if descriptor is not None:
            reads, writes_hbm = self.direction(descriptor)
        granules = granules_of(self.regs) if granules_of is not None else None
        unit = self.machine.granule_bytes
        if nbytes is None:
            nbytes = granules * unit if isinstance(granules, int) else 0
            if not isinstance(granules, int):
                self.note(f"DMA at {self.pc:#x} of unknown size: counted as 0 bytes")
        if not isinstance(granules, int):
            granules = -(-nbytes // unit)
        self.dmas_issued += 1
        done = self.now
        if reads or writes_hbm:
            self.read += nbytes if reads else 0
            self.written += nbytes if writes_hbm else 0
            done = self.dmas.issue(self.now, nbytes)
        flag = flag_of(self.regs) if flag_of is not None else None
        self.flags.pending[flag].append((done, granules))

    def wait(self, s: Step) -> None:
        flag, need = s.args[0](self.regs), s.args[1](self.regs)
        if not isinstance(need, int):
            self.note(f"wait at {self.pc:#x} for an unknown count: no stall")
            return
        until = self.flags.wait(flag, need, self.now)
        if until is None:
            self.note(f"wait at {self.pc:#x} for granules no DMA brings: no stall")
        elif until > self.now:
            self.stall += until - self.now
            self.now = until

    def sync_add(self, s: Step) -> None:
        flag, delta = s.args[0](self.regs), s.args[1](self.regs)
        if isinstance(delta, int):
            self.flags.land(flag, self.now)
            self.flags.count[flag] += signed(delta)

    def sync_set(self, s: Step) -> None:
        flag, value = s.args[0](self.regs), s.args[1](self.regs)
        self.flags.land(flag, self.now)
        self.flags.count[flag] = value if isinstance(value, int) else 0

    def delay_cycles(self, s: Step) -> None:
        self.delay += s.args[0]
        self.now += s.args[0] * self.cpb

    def call(self, s: Step) -> None:
        name = s.args[0]
        callee = self.programs.get(name)
        if callee is None:
            self.note(f"call of {name or 'an unnamed program'}: not in the dump, 0 cycles")
            return
        run = _call(callee, self.machine, self.programs, self.dmas, self.now + self.cpb, self.memo)
        self.calls.append(run)
        self.now += run.cycles

    HANDLERS: dict[int, Callable[[_Core, Step], None]] = {
        SET: set,
        LOAD: load,
        STORE: store,
        BRANCH: branch,
        DIVIDE: divide,
        POP: pop,
        DMA: dma,
        WAIT: wait,
        SYNC_ADD: sync_add,
        SYNC_SET: sync_set,
        DELAY: delay_cycles,
        CALL: call,
    }


def replay(
    schedule: Schedule,
    machine: Machine,
    programs: Mapping[str, Schedule] | None = None,
    *,
    _dmas: _Dmas | None = None,
    _start: float = 0.0,
    _cache: _Memo | None = None,
) -> Run:
    """Run ``schedule``'s control flow on ``machine``; the cycles it takes.

    ``programs``: the schedules an ``inlined_call`` of ``schedule`` may call, by name (the
    top-level program calls its fusions and kernels); a call to a program not there costs
    its one bundle and is noted in :attr:`Run.unresolved`.
    """
    dmas = _dmas if _dmas is not None else _Dmas(machine)
    memo = _cache if _cache is not None else _Memo()
    return _Core(schedule, machine, programs, dmas, _start, memo).run()
