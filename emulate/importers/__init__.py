"""Importers: quantized weights read from other projects' checkpoints, kept as stored."""
