"""Decode throughput of every low-precision format, next to a memory copy in the same run.

Run as ``python -m benchmarks.decode`` (from the repo root; ``--help`` for the flags).
For each format in ``emulate.formats.LOW_PRECISION`` it times the jitted
``emulate.decode(x, fmt, to=...)`` into bf16 and into f32 for these inputs:

  native  an array of the format's own dtype (not float6: XLA cannot hold float6 arrays)
  codes   uint8 raw codes plus ``fmt`` (4- and 6-bit formats only; the only way for float6)
  packed  an :class:`emulate.Packed` array, unpacked on the fly (4- and 6-bit formats)
  convert XLA's own ``x.astype(to)`` of the native array, for comparison (not emulate's)

The copy baseline is a jitted ``x + 1`` on a uint8 and on a uint32 array of the same byte
size as the int8 input. An elementwise op, not ``jnp.copy``, so that XLA cannot elide it:
it reads every input byte and writes a fresh output buffer of the same size. Two more
uint32 copies write as many bytes as a decode into bf16 and into f32 does (2 and 4 bytes
an element): a decode's output that large can be over glibc's mmap threshold, so that
every call faults its pages in afresh, and the copy that writes the same amount pays the
same; ``same-size ratio`` compares each decode with the copy whose output matches its own.

Bandwidth counts the bytes of the input as stored (``nbytes`` as JAX reports it; one byte
per element for int4/uint4/float4 arrays, ``ceil(bits/8)`` per element in a Packed array)
plus the bytes of the output written. ``ratio`` is that bandwidth over the uint32 copy's.
Each timing is the median of interleaved repeats (every case once per round, rounds
repeated) after a warm-up call that compiles; every call ends in ``block_until_ready``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness, provenance, tables, units
from benchmarks.timing import interleave, minor_faults, timed_call
from emulate import formats
from emulate.numerics import codecs, storage

TARGETS = {"bf16": jnp.bfloat16, "f32": jnp.float32}


@dataclasses.dataclass
class Case:
    """One timed call: ``fn(arg)`` on ``n`` elements, reading ``bytes_in`` and writing
    ``bytes_out``."""

    fmt: str
    kind: str
    to: str
    n: int
    bytes_in: int
    bytes_out: int
    fn: Callable[[Any], jax.Array]
    arg: Any
    times: list[float] = dataclasses.field(default_factory=list)
    faults: list[int] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.fmt} {self.kind} -> {self.to}"

    def run(self) -> float:
        before = minor_faults()
        dt = timed_call(self.fn, self.arg)
        after = minor_faults()
        if before is not None and after is not None:
            self.faults.append(after - before)
        return dt

    def result(self, copy_gbs: float | None) -> dict[str, Any]:
        med = statistics.median(self.times)
        gbs = (self.bytes_in + self.bytes_out) / med / 1e9
        return {
            "format": self.fmt,
            "input": self.kind,
            "to": self.to,
            "elements": self.n,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "median_s": med,
            "min_s": min(self.times),
            "elements_per_s": self.n / med,
            "gb_per_s": gbs,
            "ratio_to_copy": gbs / copy_gbs if copy_gbs else None,
            "ratio_to_same_size_copy": None,
            "page_faults_per_call": statistics.median(self.faults[-len(self.times) :])
            if self.faults
            else None,
        }


def _codes(n: int, bits: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniformly random codes of ``bits`` bits (NaN/Inf codes included) as uint8."""
    return rng.integers(0, 1 << bits, size=n, dtype=np.uint8)


def _decoder(fmt: str | None, to: Any) -> Callable[[Any], jax.Array]:
    return jax.jit(lambda x: codecs.decode(x, fmt, to=to))


def build_cases(n: int, seed: int = 0) -> tuple[list[Case], list[Case]]:
    """The copy baselines and the decode cases for ``n`` elements."""
    rng = np.random.default_rng(seed)
    add1 = jax.jit(lambda x: x + 1)
    u8 = jax.device_put(_codes(n, 8, rng))
    u32 = jax.device_put(np.frombuffer(_codes(4 * (n // 4), 8, rng).tobytes(), np.uint32))
    copies = [
        Case("copy", "uint8 x+1", "uint8", n, n, n, add1, u8),
        Case("copy", "uint32 x+1", "uint32", u32.size, u32.nbytes, u32.nbytes, add1, u32),
    ]
    for label, nbytes in (("bf16-sized", 2 * n), ("f32-sized", 4 * n)):
        big = jax.device_put(np.frombuffer(_codes(nbytes, 8, rng).tobytes(), np.uint32))
        copies.append(
            Case("copy", f"uint32 x+1, {label}", "uint32", big.size, nbytes, nbytes, add1, big)
        )
    cases: list[Case] = []
    for name in formats.LOW_PRECISION:
        f = formats.get(name)
        codes = _codes(n, f.bits, rng)
        inputs: list[tuple[str, Any, str | None, int]] = []
        if f.xla_storable:
            native = jax.device_put(codes.view(f.dtype))
            inputs.append(("native", native, None, native.nbytes))
        if f.packable:
            dev_codes = jax.device_put(codes)
            inputs.append(("codes", dev_codes, name, dev_codes.nbytes))
            packed = jax.block_until_ready(storage.pack(dev_codes, name))
            inputs.append(("packed", packed, None, packed.nbytes))
        for to_name, to in TARGETS.items():
            out_bytes = n * np.dtype(to).itemsize
            for kind, arg, fmt_arg, in_bytes in inputs:
                fn = _decoder(fmt_arg, to)
                cases.append(Case(name, kind, to_name, n, in_bytes, out_bytes, fn, arg))
            if f.xla_storable:
                native_arg = inputs[0][1]
                convert = jax.jit(lambda x, to=to: x.astype(to))
                cases.append(
                    Case(
                        name,
                        "convert",
                        to_name,
                        n,
                        native_arg.nbytes,
                        out_bytes,
                        convert,
                        native_arg,
                    )
                )
    return copies, cases


def measure(cases: Sequence[Case], repeats: int) -> list[Case]:
    """Warm up (compile) each case, then time ``repeats`` interleaved rounds.

    A case that fails to compile or run (e.g. XLA's own convert on a backend without
    that type) is dropped and reported on stderr.
    """
    ok, _ = interleave(cases, repeats)
    return ok


def _ratio_or_dash(value: float | None) -> str:
    """A ratio, or "-" where it does not apply (a copy against the same-size copy)."""
    return "-" if value is None else units.ratio(value)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The copy and decode rows as a plain-text table."""
    headers = [
        "format",
        "input",
        "to",
        "ms",
        "Gelem/s",
        "GB/s",
        "ratio",
        "same-size ratio",
        "faults",
    ]
    cells = [
        [
            r["format"],
            r["input"],
            r["to"],
            units.ms(r["median_s"], places=3),
            f"{r['elements_per_s'] / 1e9:.3f}",
            f"{r['gb_per_s']:.2f}",
            _ratio_or_dash(r["ratio_to_copy"]),
            _ratio_or_dash(r.get("ratio_to_same_size_copy")),
            "?" if r["page_faults_per_call"] is None else f"{r['page_faults_per_call']:.0f}",
        ]
        for r in rows
    ]
    return tables.text_table(headers, cells, right={3, 4, 5, 6, 7, 8})


def run(args: argparse.Namespace) -> harness.Report:
    """Build and measure; the table and the JSON."""
    size = args.size if args.size is not None else 2**20 if args.quick else 2**24
    if size < 8 or size % 8:
        raise harness.FlagError(f"--size must be a positive multiple of 8, got {size}")
    repeats = args.repeats
    copies, cases = build_cases(size)
    measured = measure([*copies, *cases], repeats)
    copy_rows = {c.kind: c.result(None) for c in measured if c.fmt == "copy"}
    ref = copy_rows.get("uint32 x+1", {}).get("gb_per_s")
    rows = [c.result(ref) for c in measured if c.fmt != "copy"]
    same = {
        r["bytes_out"]: r["gb_per_s"] for k, r in copy_rows.items() if k.startswith("uint32 x+1, ")
    }
    for r in rows:
        g = same.get(r["bytes_out"])
        r["ratio_to_same_size_copy"] = r["gb_per_s"] / g if g else None
    for r in copy_rows.values():
        r["ratio_to_copy"] = r["gb_per_s"] / ref if ref else None
    env = provenance.environment()
    report = {
        "benchmark": "decode",
        "command": args.command,
        "elements": size,
        "repeats": repeats,
        "statistic": "median of interleaved repeats after warm-up",
        "copy_reference": "uint32 x+1 (jitted elementwise add; reads and writes every byte)",
        "bytes": "input bytes as stored (jax nbytes; Packed data bytes) + output bytes",
        **env,
        "copy": list(copy_rows.values()),
        "decode": rows,
    }
    text = "\n".join(
        [
            f"decode benchmark: {size} elements, median of {repeats} interleaved repeats, "
            f"jax {env['jax']} on {env['backend']} ({env['device']})",
            "ratio = GB/s (input read + output written) / GB/s of the uint32 x+1 copy",
            "same-size ratio = the same over the uint32 copy that writes as many bytes",
            "faults = minor page faults per call (pages of buffers the allocator returned to",
            "         the OS after the previous call, faulted in and zeroed again)",
            "",
            table([*copy_rows.values(), *rows]),
        ]
    )
    return harness.Report(report, text + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    """decode's own flag: --size."""
    p.add_argument(
        "--size", type=int, help="elements per array (default 2**24, 2**20 with --quick)"
    )


BENCHMARK = harness.Benchmark(
    name="decode",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(10, 3),
    quick="a smoke run: 2**20 elements and 3 repeats unless --size/--repeats say otherwise",
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
