"""Weight-only matmul with emulate.pallas.matmul against XLA's bf16 matmul and HBM bandwidth.

Run as ``python -m benchmarks.pallas_matmul`` (from the repo root; ``--help`` for the flags;
``--json PATH`` writes the rows).

On a TPU (JAX's default backend is "tpu") it times, for each weight format and shape
(M = 1 ... 512 rows of bf16 activations, K = N = 4096 and 8192 by default):

  kernel  ``emulate.pallas.matmul(x, w)``: the weight stays in HBM as stored (packed for
          4- and 6-bit formats, by ``emulate.pallas.prepare_weight``) and is decoded tile
          by tile in VMEM;
  xla     ``jnp.dot(x, w_bf16, preferred_element_type=f32)`` on the weight decoded to bf16
          up front (the decoding not timed): what a model that keeps bf16 weights pays;

and reports the kernel's bytes moved per second (weight bytes as stored, plus x and the
f32 result) as a fraction of the target's HBM bandwidth (``Target.mem_bw_bytes_per_second``
from JAX's TPU table), and the bandwidth-bound time of each side: weight-only matmuls at
small M are memory bound, so a 4-bit weight can beat bf16 by up to 4x there.

Anywhere else the kernel runs in Pallas' TPU interpret mode, which is a correctness tool:
the script then uses tiny shapes, checks every result against emulate.reference (bit for
bit for exact pairs, within the bound otherwise), prints the times only as what they
are (interpreter times, not TPU performance) and says so in its output.

Each time is the median of interleaved rounds (every case once per round) after a warm-up
call that compiles; every call ends in ``block_until_ready``.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import emulate
import emulate.pallas
from benchmarks import harness, timing, units
from benchmarks.cases import DN
from emulate import formats, targets
from emulate import testing as et

DEFAULT_FORMATS = ("int4", "float4_e2m1fn", "int8", "float8_e4m3fn")
TPU_M = (1, 8, 32, 128, 512)
TPU_KN = (4096, 8192)
CPU_M = (1, 8)
CPU_KN = (512,)


@dataclasses.dataclass
class Row:
    """One (format, M, K, N) case: times in seconds, bandwidths in bytes/s."""

    fmt: str
    m: int
    k: int
    n: int
    weight_bytes: int
    kernel_s: float
    xla_s: float
    kernel_bytes: int
    hbm_bw: float | None
    checked: str  # "exact", "bounded", or "" when not checked

    @property
    def speedup(self) -> float:
        return self.xla_s / self.kernel_s

    @property
    def kernel_bw(self) -> float:
        return self.kernel_bytes / self.kernel_s

    @property
    def bw_fraction(self) -> float | None:
        return self.kernel_bw / self.hbm_bw if self.hbm_bw else None

    @property
    def bound_s(self) -> float | None:
        """The kernel's time if it only moved its bytes at the full HBM bandwidth."""
        return self.kernel_bytes / self.hbm_bw if self.hbm_bw else None

    @property
    def xla_bound_s(self) -> float | None:
        """XLA's bf16 matmul, bandwidth bound: 2 bytes per weight element."""
        if not self.hbm_bw:
            return None
        return (2 * self.k * self.n + 2 * self.m * self.k + 4 * self.m * self.n) / self.hbm_bw


def _weight(fmt: str, k: int, n: int, rng: np.random.Generator) -> tuple[Any, np.ndarray]:
    """(the kernel's weight argument, the weight as an array of its format)."""
    f = formats.get(fmt)
    codes = rng.choice(np.array(et.finite_codes(f), np.uint8), (k, n))
    w = codes.view(f.dtype)
    if f.packable:  # kept as the kernel reads it: emulate.pallas.prepare_weight, once
        return emulate.pallas.prepare_weight(emulate.pack(w, axis=0)), w
    return jnp.asarray(w) if f.xla_storable else jnp.asarray(codes), w


def run(
    target: targets.Target,
    fmts: Sequence[str],
    ms: Sequence[int],
    kns: Sequence[int],
    repeats: int,
    interpret: bool,
    check: bool,
    on_row: Callable[[str], None] = lambda s: None,
) -> list[Row]:
    rng = np.random.default_rng(0)
    cases = []
    for fmt in fmts:
        f = formats.get(fmt)
        for kn in kns:
            w_arg, w = _weight(fmt, kn, kn, rng)
            w_bf16 = emulate.decode(w, None if f.xla_storable else fmt)
            w_format = None if f.packable or f.xla_storable else fmt
            for m in ms:
                x = jnp.asarray(rng.standard_normal((m, kn)), jnp.bfloat16)

                def kernel(x, w, w_format=w_format):
                    return emulate.pallas.matmul(
                        x,
                        w,
                        target=target,
                        out_dtype=jnp.float32,
                        interpret=interpret,
                        w_format=w_format,
                    )

                def xla(x, w):
                    return jnp.dot(x, w, preferred_element_type=jnp.float32)

                cases.append((fmt, m, kn, x, w_arg, w, w_bf16, jax.jit(kernel), jax.jit(xla)))
    times: dict[int, tuple[list[float], list[float]]] = {i: ([], []) for i in range(len(cases))}
    checked = {}
    for i, (fmt, m, kn, x, w_arg, w, w_bf16, kernel, xla) in enumerate(cases):
        on_row(f"compile {fmt} {m}x{kn}x{kn}")
        got = kernel(x, w_arg)
        jax.block_until_ready(xla(x, w_bf16))
        checked[i] = ""
        if check:
            c = et.compare(
                got, np.asarray(x), w, DN, mode="fast", preferred_element_type=jnp.float32
            )
            if not c.ok:
                raise AssertionError(f"{fmt} {m}x{kn}x{kn}: {c}")
            checked[i] = c.contract
    for _ in range(repeats):
        for i, (_, _, _, x, w_arg, _, w_bf16, kernel, xla) in enumerate(cases):
            times[i][0].append(timing.timed_call(kernel, x, w_arg))
            times[i][1].append(timing.timed_call(xla, x, w_bf16))
    rows = []
    for i, (fmt, m, kn, _, w_arg, _, _, _, _) in enumerate(cases):
        f = formats.get(fmt)
        weight_bytes = int(np.prod(w_arg.data.shape)) if f.packable else kn * kn
        rows.append(
            Row(
                fmt=fmt,
                m=m,
                k=kn,
                n=kn,
                weight_bytes=weight_bytes,
                kernel_s=statistics.median(times[i][0]),
                xla_s=statistics.median(times[i][1]),
                kernel_bytes=weight_bytes + 2 * m * kn + 4 * m * kn,
                hbm_bw=target.mem_bw_bytes_per_second,
                checked=checked[i],
            )
        )
    return rows


def render(rows: Sequence[Row], interpret: bool = False) -> str:
    """The rows as a table; in interpret mode the bandwidth columns are left blank ("-")."""
    header = ["format", "M", "K=N", "weight MB", "kernel ms", "xla bf16 ms", "xla/kernel"]
    header += ["GB/s", "of HBM", "bound ms", "xla bound ms", "checked"]
    body = []
    for r in rows:
        frac = None if interpret else r.bw_fraction
        body.append(
            [
                r.fmt,
                str(r.m),
                str(r.k),
                f"{r.weight_bytes / 1e6:.2f}",
                units.ms(r.kernel_s, 3),
                units.ms(r.xla_s, 3),
                f"{r.speedup:.2f}",
                "-" if interpret else f"{r.kernel_bw / 1e9:.1f}",
                "-" if frac is None else f"{frac:.0%}",
                units.ms(r.bound_s, 3),
                units.ms(r.xla_bound_s, 3),
                r.checked or "-",
            ]
        )
    widths = [max(len(c) for c in col) for col in zip(header, *body)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *body]]
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> harness.Report:
    """Time (or, without a TPU, check) every case; the table and the JSON."""
    on_tpu = jax.default_backend() == "tpu"
    target = targets.current_target(args.target) if (args.target or on_tpu) else None
    target = target or targets.get("tpu_v5e")
    if target.kind != "tpu":
        raise harness.FlagError(f"--target: {target.name} is not a TPU")
    interpret = not on_tpu
    lines = [
        f"emulate.pallas.matmul benchmark: target {target.name}, backend "
        f"{jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}, "
        f"python {platform.python_version()}"
    ]
    if interpret:
        lines.append(
            "NOTE: no TPU here, so the kernel runs in Pallas TPU interpret mode: this run "
            "checks correctness only (every result against emulate.reference), and its "
            "times are interpreter times, not TPU performance. Run it on a TPU for those."
        )
    rows = run(
        target,
        [formats.get(f).name for f in args.formats],
        args.m or (TPU_M if on_tpu else CPU_M),
        args.kn or (TPU_KN if on_tpu else CPU_KN),
        args.repeats or (5 if on_tpu else 2),
        interpret,
        check=interpret or args.check,
        on_row=lambda s: print(f"  {s}", file=sys.stderr),
    )
    lines += [
        render(rows, interpret),
        f"bytes moved: the weight as stored plus bf16 x and the f32 result; HBM bandwidth "
        f"{target.mem_bw_bytes_per_second / 1e9:.0f} GB/s ({target.name}, JAX's table).",
    ]
    payload = {
        "command": args.command,
        "target": target.name,
        "backend": jax.default_backend(),
        "interpret": interpret,
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    return harness.Report(payload, "\n".join(lines) + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    """pallas_matmul's own flags."""
    p.add_argument("--target", help="TPU target; default: the detected TPU, else tpu_v5e")
    p.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS), metavar="F")
    p.add_argument("--m", nargs="+", type=int, metavar="M", help="activation rows")
    p.add_argument("--kn", nargs="+", type=int, metavar="K", help="K = N sizes")
    p.add_argument("--check", action="store_true", help="check results on a TPU too")


BENCHMARK = harness.Benchmark(
    name="pallas_matmul",
    description=__doc__.split("\n\n")[0],
    run=run_benchmark,
    flags=flags,
    repeats=(None, None),
    repeats_help="default 5 on a TPU, 2 elsewhere",
    writes=False,
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
