"""emulate.compiler.steps: the operations of a schedule the replay acts on, compiled once."""

from __future__ import annotations

from emulate.compiler import bundles, steps
from tests.compiler.test_replay import LOOP

DMA = (
    "= control target key start\n= control target key end\n\n"
    "     0   :  { %1 = dma.hbm_to_vmem [thread:$0]  (!%p1_p1), /*hbm=*/%s9_s9, "
    "/*size_in_granules=*/2048, /*vmem=*/%s8_s8, /*dst_syncflagno=*/[#allocation3] /* \n"
    "window_bounds: (16, 1)\niteration_bounds: (2, 2, 2)\nelement_size_in_bytes: 4096\n */ }\n"
    "   0x1   :  { %2 = dma [#allocation8] /* \nwindow_bounds: (2, 2)\n"
    "element_size_in_bytes: 1024\n */  ;;  %3 = vadd.f32 %v1_v1, %v2_v2 }\n"
)


def test_each_bundle_compiles_to_the_operations_the_replay_acts_on():
    c = steps.compile_schedule(bundles.parse(LOOP, "loop"), slots=1)
    kinds = [[s.kind for s in bundle] for bundle in c.steps]
    S, B, D = steps.SET, steps.BRANCH, steps.DELAY
    assert kinds == [[S], [S], [S], [B], [], [D], [], [S], [B], [], []]
    assert c.next_busy[:5] == [0, 1, 2, 3, 5] and c.next_busy[9:] == [11, 11, 11]
    assert c.delay_slots == {0x3: 1, 0x8: 1} and c.grid == ()
    assert c.steps[3][0].args == (0x7,)  # the branch's target: region 7 starts at 0x7
    assert c.steps[5][0].args == (3,)  # vdelay 3


def test_dmas_carry_their_bytes_flag_and_direction():
    c = steps.compile_schedule(bundles.parse(DMA, "dma"), slots=4)
    (first,), (second,) = c.steps
    nbytes, granules, flag, reads, writes, descriptor = first.args
    assert (first.kind, nbytes, reads, writes, descriptor) == (steps.DMA, 65536, True, False, None)
    assert granules({}) == 2048 and flag({}) is not None and first.pred({"p1": False}) is True
    assert second.args[0] == 4096 and second.args[5] == "allocation8"  # a v2/v3 descriptor
    assert c.grid == (2, 2, 2)


def test_a_branch_to_a_nearer_target_takes_fewer_slots():
    assert steps.delay_slots(bundles.parse(LOOP, "loop"), 2) == {0x3: 2, 0x8: 2}
    assert steps.delay_slots(bundles.parse(LOOP, "loop"), 4) == {0x3: 3, 0x8: 4}
