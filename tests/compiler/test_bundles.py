"""emulate.compiler.bundles: libtpu's final bundle schedule read into records, on the real
files of tests/compiler/schedules (libtpu 0.0.42.1; see its README) and on excerpts."""

from __future__ import annotations

import pytest

from emulate.compiler import bundles
from tests.compiler._schedules import SCHEDULES

HEAD = "= control target key start\nLB: loop body\n= control target key end\n\n"


def _files(target: str) -> dict[str, bundles.ScheduleFiles]:
    return {f.name: f for f in bundles.dump_files(SCHEDULES / target)}


def test_a_dump_directory_groups_each_programs_two_files():
    found = _files("tpu_v5e")
    assert sorted(found) == ["TLP", "tiny_matmul.1"]
    kernel = found["tiny_matmul.1"]
    assert kernel.bundles.name.endswith("-tiny_matmul.1-01-final_bundles.txt")
    assert kernel.analysis is not None
    assert kernel.analysis.name.endswith("-00-schedule-analysis_final_bundles.txt")
    # only the files named (one compile's, say)
    only = bundles.dump_files(SCHEDULES / "tpu_v5e", iter([kernel.bundles.name, "README.md"]))
    assert [(f.name, f.analysis) for f in only] == [("tiny_matmul.1", None)]


def test_the_kernel_schedule_as_read():
    files = _files("tpu_v5e")["tiny_matmul.1"]
    s = bundles.read(files.bundles)
    assert s.name == "tiny_matmul.1" and s.path == str(files.bundles)
    analysis = bundles.parse_analysis(files.analysis.read_text())  # type: ignore[union-attr]
    assert (analysis.total, analysis.empty) == (227, 9)
    assert len(s) == 227 and [b.address for b in s.bundles] == list(range(227))
    assert [(b.address, b.mark) for b in s.bundles if b.mark] == [
        (0x10, "LB"),
        (0x63, "PF"),
        (0xB7, "PF"),
        (0xC9, "PF"),
    ]
    assert {b.depth for b in s.bundles[:0x10]} == {0}
    assert s.bundles[0x10].depth == 1 and s.bundles[0x10].starts == (94, 25, 26, 27)
    # the branch that skips the compute stage, and where it lands
    (_, branch), *_ = [(b, op) for b, op in s.ops("sbr") if b.address == 0x3F]
    assert (branch.dest, branch.predicate, branch.operands) == (
        "%192",
        "%p1201_p12",
        ("target = $region28",),
    )
    assert s.region_starts()[28] == 0xC9
    # the grid loop's exit test: 8 grid steps + 2
    (exit_test,) = [op for _, op in s.ops("scmp") if op.comment == "loop exit test"]
    assert (exit_test.dest, exit_test.opcode, exit_test.operands) == (
        "%p1373_p7",
        "scmp.ge.s32.totalorder",
        ("%s21_s24", "10"),
    )


def test_a_dma_with_its_named_operands_and_window():
    s = bundles.read(_files("tpu_v5e")["tiny_matmul.1"].bundles)
    (dma,) = s.bundles[0x25].ops
    assert (dma.opcode, dma.predicate, dma.operands) == (
        "dma.hbm_to_vmem",
        "!%p658_p9",
        ("[thread:$0]",),
    )
    assert dma.named == {
        "hbm": "%s155_s8",
        "size_in_granules": "2048",
        "vmem": "%s157_s26",
        "dst_syncflagno": "%s143_s28",
        "src_stride": "%s1431_s29",
        "dst_stride": "%s1432_s15",
        "steps_per_stride": "%s1433_s18",
    }
    w = dma.window
    assert w == bundles.Window(bounds=(16, 1), element_bytes=4096, iteration_bounds=(2, 2, 2))
    assert w.nbytes == 128 * 128 * 4  # one f32 block; 2048 granules of 32 bytes


def test_v2_writes_descriptor_dmas_and_delays():
    s = bundles.read(_files("tpu_v2")["tiny_matmul.1"].bundles)
    descriptor = [op for _, op in s.ops("dma") if op.opcode == "dma"]
    assert len(descriptor) == 3 and descriptor[0].operands == ("[#allocation8]",)
    assert descriptor[0].window == bundles.Window((16, 1), 4096, (2, 2, 2))
    delays = [op for _, op in s.ops("vdelay")]
    assert len(delays) == 41 and delays[0].operands[0].isdigit()


def test_values_live_in_registers():
    assert bundles.physical("%s41_s8") == "s8"
    assert bundles.physical("%p42_p0") == "p0"
    assert bundles.physical("%vm496_vm0") == "vm0"
    assert bundles.physical("%12906") == "%12906"


def test_an_excerpt_with_a_kept_value_nested_comments_and_a_multi_line_bundle():
    text = HEAD + (
        "     0   :  { %s21806_s8 = smov (%p42_p0, %s41_s8), 0  ;;  %s1_s1 = sadd.s32 1, %s2_s2 }"
        " /* Start region 3 */\n"
        "   0x1 LB: >> { %9 = shalt.err (!%p8_p1) /* BoundsCheck 1 [deref of %s4] for %5 = "
        "dma.vmem_to_hbm (%p7), /*vmem=*/%s4, /* \nwindow_bounds: (1, 2)\n */ \nhlo: k\n */ }"
        " /* End region 3 :: Start/End empty region 4 */\n"
        "   0x2   :  {}\n"
    )
    s = bundles.parse(text, "excerpt")
    first, second, third = s.bundles
    smov, add = first.ops
    assert (smov.dest, smov.opcode, smov.predicate, smov.keeps, smov.operands) == (
        "%s21806_s8",
        "smov",
        "%p42_p0",
        "%s41_s8",
        ("0",),
    )
    assert (add.opcode, add.operands, add.predicate) == ("sadd.s32", ("1", "%s2_s2"), None)
    assert first.starts == (3,) and first.ends == ()
    (halt,) = second.ops
    assert (second.mark, second.depth, halt.opcode, halt.predicate) == (
        "LB",
        2,
        "shalt.err",
        "!%p8_p1",
    )
    assert halt.comment.startswith("BoundsCheck 1 [deref of %s4]")
    assert second.ends == (3, 4) and second.starts == (4,)
    assert third.ops == ()


def test_what_is_not_a_schedule_is_refused_with_its_reason():
    with pytest.raises(
        ValueError, match=r"^schedule 'x': no bundle found \(not a final_bundles file\)$"
    ):
        bundles.parse("HloModule foo\n", "x")
    with pytest.raises(ValueError, match=r"^schedule 'x': bundle 1 has address 0x2$"):
        bundles.parse(HEAD + "   0   :  {}\n   0x2   :  {}\n", "x")
    with pytest.raises(ValueError, match=r"^schedule: a bundle without its closing brace: "):
        bundles.parse(HEAD + "   0   :  { %s1_s1 = smov 0 \n", "x")
    with pytest.raises(ValueError, match=r"^schedule analysis: no 'total scheduled bundles' line$"):
        bundles.parse_analysis("Schedule analysis:\n")
