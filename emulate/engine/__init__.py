"""The execution engine: one jitted program per :class:`emulate.Plan`. Operands, layouts,
the plain and chunked contraction, the sliced exact contraction, CPU tiling, and the
program that picks among them."""
