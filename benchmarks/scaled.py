"""Matmul on block-scaled weights (QArray) against what a user would do instead, in one process.

Run: ``python -m benchmarks.scaled`` (or ``python benchmarks/scaled.py``); ``--quick`` for
a small shape. bf16 activations (M, K) times a (K, N) weight quantized with each scheme
along K. Contenders, interleaved after warm-up:

- ``dequantized``: the weight dequantized to bf16 once, before timing; a bf16 dot (the floor);
- ``dequantize + dot``: ``emulate.dequantize(w_q, to=bf16)`` then the dot, every call;
- ``emulate fast``: ``emulate.matmul(x, w_q)`` (segment by segment, scales applied to
  segment sums);
- ``emulate exact``: the same with ``mode="exact"``.

Ratios are medians over the floor's median from the same rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

import emulate
from benchmarks._timing import environment, interleave, stats, text_table, timed_call
from emulate import mx

SCHEMES = ["MXFP4", "MXFP8_E4M3", "MXINT8", "NVFP4", "INT4_G128"]


@dataclasses.dataclass
class Case:
    scheme: str
    name: str
    fn: object
    args: tuple
    times: list[float] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.scheme} {self.name}"

    def run(self) -> float:
        return timed_call(self.fn, *self.args)


def cases(scheme: str, m: int, k: int, n: int, target: str) -> list[Case]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w_q = emulate.quantize(w, mx.SCHEMES[scheme], axis=0)
    w_bf16 = emulate.dequantize(w_q, to=jnp.bfloat16)
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    deq = jax.jit(
        lambda a, q: jnp.dot(
            a, emulate.dequantize(q, to=jnp.bfloat16), preferred_element_type=jnp.float32
        )
    )
    out = [
        Case(scheme, "dequantized", dot, (x, w_bf16)),
        Case(scheme, "dequantize + dot", deq, (x, w_q)),
        Case(
            scheme,
            "emulate fast",
            jax.jit(lambda a, q: emulate.matmul(a, q, target=target)),
            (x, w_q),
        ),
    ]
    exact = jax.jit(lambda a, q: emulate.matmul(a, q, target=target, mode="exact"))
    out.append(Case(scheme, "emulate exact", exact, (x, w_q)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="64x2048x1024", help="MxKxN (default 64x2048x1024)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="16x512x256, 3 repeats")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    shape = "16x512x256" if args.quick else args.shape
    m, k, n = (int(v) for v in shape.split("x"))
    repeats = 3 if args.quick else args.repeats
    rows, record = [], {"environment": environment(), "shape": [m, k, n], "results": []}
    for scheme in args.schemes.split(","):
        ran, failed = interleave(cases(scheme, m, k, n, args.target), repeats)
        floor = stats(ran[0].times)["median_s"]
        for c in ran:
            st = stats(c.times)
            ratio = st["median_s"] / floor
            rows.append([scheme, c.name, f"{st['median_s'] * 1e3:.2f} ms", f"{ratio:.2f}x"])
            record["results"].append({"scheme": scheme, "case": c.name, **st, "ratio": ratio})
        for label, why in failed.items():
            rows.append([scheme, label, "n/a", why])
    print(f"bf16 x QArray, M x K x N = {m} x {k} x {n}, target {args.target}")
    print(text_table(["scheme", "contender", "median", "ratio"], rows, right={2, 3}))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
