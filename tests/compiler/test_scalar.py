"""emulate.compiler.scalar: the scalar unit's values and arithmetic as the replay runs them
(32-bit words, predicates, symbolic addresses, unknowns)."""

from __future__ import annotations

from emulate.compiler import scalar
from emulate.compiler.bundles import parse
from emulate.compiler.scalar import Addr

HEAD = "= control target key start\n= control target key end\n\n"


def _op(text: str):
    (bundle,) = parse(HEAD + f"     0   :  {{ {text} }}\n").bundles
    (op,) = bundle.ops
    return op


def test_operands_read_registers_immediates_and_allocations():
    regs = {"s3": 7, "p1": True}
    assert scalar.getter("%s9_s3")(regs) == 7
    assert scalar.getter("!%p4_p1")(regs) is False
    assert scalar.getter("%s9_s5")(regs) is None  # never written: unknown
    assert scalar.getter("4294967295")(regs) == 0xFFFFFFFF
    assert scalar.getter("-1")(regs) == 0xFFFFFFFF
    assert scalar.getter("$0x10")(regs) == 16
    assert scalar.getter("[#allocation7 + $0x1]")(regs) == Addr("allocation7", 1)
    assert scalar.getter("#allocation21_spill")(regs) == Addr("allocation21_spill", 0)
    assert scalar.getter("0.5")(regs) is None  # a float immediate: not followed
    assert scalar.getter("vmem")(regs) is None


def test_words_wrap_at_32_bits_and_signed_operations_read_them_signed():
    def run(text: str, regs: dict) -> object:
        fn = scalar.value_fn(_op(text))
        assert fn is not None
        return fn(regs)

    assert run("%s1_s0 = sadd.s32 4294967295, %s2_s1", {"s1": 5}) == 4
    assert run("%s1_s0 = ssub.s32 %s2_s1, 3", {"s1": 1}) == 0xFFFFFFFE
    assert run("%p1_p0 = scmp.lt.s32.totalorder %s2_s1, 0", {"s1": 0xFFFFFFFE}) is True
    assert run("%p1_p0 = scmp.lt.u32.totalorder %s2_s1, 0", {"s1": 0xFFFFFFFE}) is False
    assert run("%s1_s0 = sshra.s32 %s2_s1, 1", {"s1": 0xFFFFFFFE}) == 0xFFFFFFFF
    assert run("%s1_s0 = sshrl.u32 %s2_s1, 1", {"s1": 0xFFFFFFFE}) == 0x7FFFFFFF
    assert run("%s1_s0 = sand.u32 1, %s2_s1", {"s1": 7}) == 1
    assert run("%p1_p0 = pnand %p2_p1, %p3_p2", {"p1": True, "p2": True}) is False
    assert run("%p1_p0 = pneg %p2_p1", {"p1": False}) is True
    select = "%s1_s0 = scalar_select /*predicate=*/%p2_p1, /*on_true=*/%s3_s2, /*on_false=*/9"
    assert run(select, {"p1": True, "s2": 4}) == 4
    assert run(select, {"p1": False, "s2": 4}) == 9
    assert run(select, {"s2": 4}) is None  # an unknown predicate


def test_addresses_move_by_offsets_and_compare_within_one_allocation():
    lea = scalar.value_fn(_op("%s1_s0 = scalar_lea.sflag [#allocation7], %s2_s1"))
    assert lea is not None and lea({"s1": 1}) == Addr("allocation7", 1)
    assert scalar.add(Addr("a", 2), 0xFFFFFFFF) == Addr("a", 1)
    assert scalar.add(Addr("a", 2), Addr("a", 1)) is None
    lt = scalar.value_fn(_op("%p1_p0 = scmp.lt.s32.totalorder %s2_s1, %s3_s2"))
    assert lt is not None
    assert lt({"s1": Addr("a", 1), "s2": Addr("a", 2)}) is True
    assert lt({"s1": Addr("a", 1), "s2": Addr("b", 2)}) is None
    text = "[shape: f32[8], index: 2, kind: output, shape index: {}]"
    operand = scalar.value_fn(_op(f"%s5_s0 = inlined_call_operand.hbm {text}"))
    assert operand is not None and operand({}) == Addr("output 2")


def test_what_the_replay_does_not_follow_is_unknown():
    assert scalar.value_fn(_op("%s1_s0 = sunknownop %s2_s1, 3")) is None
    mul = scalar.value_fn(_op("%s1_s0 = smul.u32 %s2_s1, 3"))
    assert mul is not None and mul({}) is None and mul({"s1": Addr("a")}) is None
    assert scalar.smem_address("#allocation5 + $0x3")({}) == Addr("allocation5", 3)
    assert scalar.smem_address("%s1_s1 + %s2_s2")({"s1": Addr("x", 1), "s2": 2}) == Addr("x", 3)
