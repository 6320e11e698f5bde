"""benchmarks.pallas_ops: counting a Mosaic module's ops, matmuls and vector elements."""

from __future__ import annotations

from benchmarks import pallas_ops

MODULE = """module @m {
  func.func @k(%arg0: i32) {
    %0 = arith.addf %a, %b : vector<64x256xf32>
    %1 = "tpu.matmul"(%x, %y, %z) : (vector<64x32xbf16>, vector<32x256xbf16>, vector<64x256xf32>) -> vector<64x256xf32>
    %2 = vector.broadcast %c : vector<1x256xf32> to vector<8x256xf32>
    %3 = arith.constant 0 : i32
    return
  }
}"""  # noqa: E501


def test_count_reads_ops_matmuls_and_the_result_vectors():
    got = pallas_ops.count(MODULE)
    assert got == {"ops": 4, "matmuls": 1, "vector_elements": 64 * 256 + 8 * 256}
