"""The numeric suite of three kernels of your own (docs/my_kernels.py), walked through in
docs/testing.md. From docs/: ``python -m pytest kernels_test.py --emulate-report report``
runs it and writes report.json and report.html (``--hypothesis-seed=N`` draws other
problems); the project's own tests run it through tests/test_kernels_tutorial.py.
"""

from __future__ import annotations

import my_kernels
import pytest

from emulate import testing

# The int4 weights: an emulate.QArray, codes in groups of 32 along K (axis 0 of the (K, N)
# weight), one float32 scale per group. Codes boost -8, 7, 0; scales boost NaN, +-Inf, 0,
# subnormals, the largest float32, 1, and draw others with every mantissa bit.
INT4_GROUPS = testing.quantized("int4", axis=0, block=32, scale_format="float32")


def test_int4_weight_only(emulate_target):
    # float32 sums of dequantized values: within gamma_(K + S + 4) * sum |a * b|, S the
    # number of groups along K (the segment bound of docs/numerics.md).
    testing.check_function(my_kernels.int4_weight_only, "float32", INT4_GROUPS, contract="fast")


@pytest.mark.emulate(targets=["tpu_v4", "tpu_v5e"])
def test_bf16_times_fp8_pallas_kernel(emulate_target):
    # tpu_numerics: on the CPU, each matmul of the kernel rounds to the type it declares
    # and meets Mosaic's rules for the target, as on that TPU. Within the bound of
    # emulate.bounds.dot_general_bound of the exact sum.
    testing.check_function(
        my_kernels.bf16_fp8, "bfloat16", "float8_e4m3fn", contract="fast", tpu_numerics=True
    )


def test_int8_matmul(emulate_target):
    # Integers are exact: bit for bit with the reference. The harness also draws K at the
    # pair's exactness thresholds (1024 to 2083 for int8) with odd extreme operands, where
    # a float32 running sum would drop units.
    testing.check_function(my_kernels.int8_matmul, "int8", "int8", contract="exact")
