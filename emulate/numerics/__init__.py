"""Bit-level numerics in JAX: storage of codes and packed arrays, decoding and encoding,
float32 bit constructions, and the exact accumulation of partial sums."""
