"""emulate.compiler.replay: a schedule's control flow and DMAs replayed, on excerpts whose
counts are worked out by hand here, and on the real schedules of tests/compiler/schedules."""

from __future__ import annotations

import pytest

from emulate.compiler import bundles, replay
from tests.compiler._schedules import SCHEDULES

HEAD = "= control target key start\nLB: loop body\n= control target key end\n\n"

# A loop of four iterations (s0 = 1 .. 4) whose region 6 (a vdelay 3 and one more bundle)
# runs only when s0 == 2; each branch has one delay slot.
LOOP = (
    HEAD
    + """\
     0   :  { %s1_s0 = smov 0 }
   0x1 LB: > { %s2_s0 = sadd.s32 1, %s1_s0 } /* Start region 5 */
   0x2   : > { %p3_p0 = scmp.ne.s32.totalorder %s2_s0, 2 }
   0x3   : > { %4 = sbr.rel (%p3_p0) target = $region7 }
   0x4   : > {}
   0x5   : > { %5 = vdelay 3 } /* Start region 6 */
   0x6   : > {} /* End region 6 */
   0x7 PF: > { %p6_p1 = scmp.ge.s32.totalorder %s2_s0, 4 } /* Start/End empty region 7 */
   0x8   : > { %7 = sbr.rel (!%p6_p1) target = $region5 }
   0x9   : > {} /* End region 5 */
   0xa   :  {}
"""
)


def _machine(**kw: float) -> replay.Machine:
    base = {"clock_hz": 1e9, "hbm_bytes_per_second": 3.2e9, "granule_bytes": 32, "delay_slots": 1}
    return replay.Machine(**{**base, **kw})  # type: ignore[arg-type]


def test_a_loop_with_a_predicated_region_and_delay_slots():
    run = replay.replay(bundles.parse(LOOP, "loop"), _machine())
    # by hand: bundle 0; s0 = 1, 3, 4: 0x1-0x4, then 0x7-0x9 (7 bundles); s0 = 2: 0x1-0x9
    # (9 bundles, 3 delay cycles); then 0xa
    assert (run.issued, run.delay_cycles, run.stall_cycles) == (1 + 7 + 9 + 7 + 7 + 1, 3, 0.0)
    assert run.loops == {1: 3} and run.steps == 4 and run.unresolved == ()
    assert run.cycles == 35.0 and run.own_cycles == 35.0
    slow = replay.replay(bundles.parse(LOOP, "loop"), _machine(cycles_per_bundle=1.5))
    assert (slow.issued, slow.cycles) == (32, 35 * 1.5)


def test_more_delay_slots_run_more_of_the_loop():
    # two slots: the forward branch runs 0x4 and 0x5 (its vdelay included) before it
    # lands at 0x7; the back edge runs 0x9 and 0xa before it jumps. s0 = 1, 3, 4: 0x1-0x5
    # and 0x7-0xa (9 bundles); s0 = 2: 0x1-0xa (10); every iteration 3 delay cycles
    run = replay.replay(bundles.parse(LOOP, "loop"), _machine(delay_slots=2))
    assert (run.issued, run.delay_cycles, run.loops) == (1 + 9 + 10 + 9 + 9, 4 * 3, {1: 3})


def test_an_unknown_predicate_runs_the_region_and_says_so():
    text = LOOP.replace("%s1_s0 = smov 0", "%s1_s0 = sld [smem:[#allocation9]]")
    run = replay.replay(bundles.parse(text, "loop"), _machine())
    assert run.unresolved == (
        "branch at 0x3 on an unknown predicate: not taken",
        "branch at 0x8 on an unknown predicate: not taken",
    )
    assert (run.issued, run.delay_cycles, run.loops) == (11, 3, {})


def _dma_program(granules: int, compute: int) -> str:
    """One DMA of ``granules`` on flag 3, ``compute`` empty bundles, a wait for it."""
    lines = [
        "     0   :  { %1 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s9_s9, "
        f"/*size_in_granules=*/{granules}, /*vmem=*/%s9_s9, /*dst_syncflagno=*/[#allocation3] }}",
    ]
    lines += [f"   {i:#x}   :  {{}}" for i in range(1, compute + 1)]
    lines += [
        f"   {compute + 1:#x}   :  {{ %2 = dma.done.wait [#allocation3], {granules} }}",
        f"   {compute + 2:#x}   :  {{ %3 = vsyncadd [#allocation3], {2**32 - granules} }}",
    ]
    return HEAD + "\n".join(lines) + "\n"


def test_a_wait_stalls_until_its_dma_lands():
    # 100 granules of 32 bytes at 3.2 bytes a cycle: 1000 cycles, issued at cycle 0
    run = replay.replay(bundles.parse(_dma_program(100, 10), "dma"), _machine())
    assert (run.issued, run.hbm_read_bytes, run.dmas) == (13, 3200, 1)
    assert run.stall_cycles == pytest.approx(1000 - 11)  # the wait issues at cycle 11
    assert run.cycles == pytest.approx(1000 + 2)
    # compute longer than the DMA: no stall
    busy = replay.replay(bundles.parse(_dma_program(1, 20), "dma"), _machine())
    assert (busy.stall_cycles, busy.cycles) == (0.0, 23.0)
    # a fixed latency a DMA
    late = replay.replay(bundles.parse(_dma_program(1, 20), "dma"), _machine(dma_latency_s=1e-7))
    assert late.stall_cycles == pytest.approx(10 + 100 - 21)


def test_a_round_trip_overlaps_the_transfers_in_flight():
    # two DMAs of 100 granules issued in bundles 0 and 1, then waited for in turn; 100
    # cycles of round trip each: A lands at 1000 + 100, B's bytes follow A's on the HBM
    # timeline (1000 -> 2000) and land at 2100: one round trip is paid, not two
    text = HEAD + "\n".join([
        "     0   :  { %1 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s9_s9, "
        "/*size_in_granules=*/100, /*vmem=*/%s9_s9, /*dst_syncflagno=*/[#allocation3] }",
        "   0x1   :  { %2 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s9_s9, "
        "/*size_in_granules=*/100, /*vmem=*/%s9_s9, /*dst_syncflagno=*/[#allocation4] }",
        "   0x2   :  { %3 = dma.done.wait [#allocation3], 100 }",
        "   0x3   :  { %4 = dma.done.wait [#allocation4], 100 }",
    ]) + "\n"  # fmt: skip
    run = replay.replay(bundles.parse(text, "two"), _machine(dma_latency_s=1e-7))
    assert run.stall_cycles == pytest.approx((1100 - 2) + (2100 - 1101))
    assert run.cycles == pytest.approx(2101)
    plain = replay.replay(bundles.parse(text, "two"), _machine())
    assert plain.cycles == pytest.approx(2001)


def test_a_wait_no_dma_answers_does_not_stall():
    text = HEAD + "     0   :  { %2 = dma.done.wait [#allocation3], 8 }\n"
    run = replay.replay(bundles.parse(text, "w"), _machine())
    assert run.unresolved == ("wait at 0x0 for granules no DMA brings: no stall",)
    assert run.cycles == 1.0


def _kernel(target: str) -> bundles.Schedule:
    (f,) = [f for f in bundles.dump_files(SCHEDULES / target) if f.name == "tiny_matmul.1"]
    return bundles.read(f.bundles)


def test_the_real_kernel_runs_its_grid():
    run = replay.replay(_kernel("tpu_v5e"), _machine(hbm_bytes_per_second=820e9, delay_slots=4))
    # by hand from the schedule's addresses: the prologue 0x0-0xf (16); the two pipeline
    # iterations without a grid step run 0x10-0x3f and the branch's 4 delay slots, then
    # 0xc9-0xdc (52 + 20); each of the 8 grid steps runs 0x10-0xdc (205) but the init
    # (0x52-0x62) or the final store (0xa6-0xb6), 17 bundles, whichever K step it is not;
    # then 0xdd-0xe2 (6)
    assert run.issued == 16 + 2 * (52 + 20) + 8 * (205 - 17) + 6 == 1670
    assert run.loops == {0x10: 9} and run.grid == (2, 2, 2) and run.steps == 8
    # each step fetches a 128 x 128 f32 block of x and of w; four output blocks go back
    assert (run.dmas, run.hbm_read_bytes, run.hbm_write_bytes) == (20, 16 * 65536, 4 * 65536)
    assert run.unresolved == () and run.delay_cycles == 0
    # compute-bound: at most the first step's two fetches and the last write-back stall
    assert 0 < run.stall_cycles < 3 * 65536 / 820
    # memory-bound: the DMAs set the time, the bundles hide behind them
    slow = replay.replay(_kernel("tpu_v5e"), _machine(hbm_bytes_per_second=1e9, delay_slots=4))
    dma_cycles = 20 * 65536 / 1.0
    assert dma_cycles < slow.cycles < dma_cycles + 1670


def test_v2_descriptor_dmas_and_delays():
    run = replay.replay(_kernel("tpu_v2"), _machine(granule_bytes=1024))
    assert run.loops == {0xA: 9} and run.grid == (2, 2, 2) and run.unresolved == ()
    # a descriptor names its operand: the output's DMAs are writes
    assert (run.dmas, run.hbm_read_bytes, run.hbm_write_bytes) == (20, 16 * 65536, 4 * 65536)
    assert run.delay_cycles > 0 and run.issued > len(_kernel("tpu_v2"))


def test_the_top_level_program_calls_the_kernel():
    files = {f.name: bundles.read(f.bundles) for f in bundles.dump_files(SCHEDULES / "tpu_v5e")}
    m = _machine(hbm_bytes_per_second=820e9, delay_slots=4)
    top = replay.replay(files["TLP"], m, files)
    (kernel,) = top.calls
    alone = replay.replay(files["tiny_matmul.1"], m)
    assert kernel.name == "tiny_matmul.1" and kernel.issued == alone.issued == 1670
    assert top.cycles == pytest.approx(top.own_cycles + kernel.cycles)
    assert top.unresolved == (
        "call of <late-initialization>: not in the dump, 0 cycles",
        "branch at 0x16 on an unknown predicate: not taken",
        "branch at 0x68 on an unknown predicate: not taken",
        "call of <late-finalization>: not in the dump, 0 cycles",
    )
