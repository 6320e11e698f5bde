"""Planning in pure Python: which types, accumulator, K-chunks and slices keep the numerics
contract of one operand pair on one target. Nothing here imports JAX."""
