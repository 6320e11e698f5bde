"""Real-size quantized models beside their bf16 models on every TPU generation, compile-only.

What one decode step or prefill moves, holds and costs, through emulate's front end and
through ``emulate.pallas.matmul`` on prepared weights, beside the bf16 model.

Models (``benchmarks.model_specs``): Llama-3-8B in Q4_K_M and in AWQ int4, gpt-oss-20B in
MXFP4, Llama-3-70B in Q4_K_M tensor-parallel over 8 devices (v5e 2x4, v6e 2x4, and the 8
TensorCores of a v4 2x2x1: libtpu's compile-only v4 devices are cores).
Weights are abstract (``jax.ShapeDtypeStruct`` pytrees of QArrays as the importers build
them, or of prepared kernel weights): nothing is materialized. Steps: decode at batch 1
and 16 over a KV cache of 4096, and a prefill of 2048 tokens (batch 1).

Each (model, generation, step, route) compiles one decoder layer and the output head with
the real compiler (``emulate.compiler``, KV caches donated) and extrapolates: per step,
``layers x layer + head``. A Pallas call counts in neither bytes nor flops in libtpu's
``cost_analysis()``: a program with kernels has its kernels' HBM traffic counted from
their block specs and grids (``benchmarks.pallas_traffic``) added to the compiler's bytes
for the rest, and no compiler estimate. Per row:

- bytes / ideal: bytes accessed per step over (stored weights read + KV cache read +
  activations in and out);
- temporaries outside kernels (the largest program's, as the layers run one after
  another);
- footprint: all layers' weights and caches + head + token embeddings + temporaries +
  outputs, against one device's HBM;
- the compiler's estimate against bytes / HBM bandwidth (one device's), and the larger
  of that and the step's flops (:func:`step_flops`) at the rate the route multiplies
  (f32 in the kernel on v2 and v3, bf16 elsewhere): a program with kernels gets no
  estimate from the compiler, so this roofline is what compares it with the bf16 model;
- the bundle model's time (:func:`emulate.compiler.estimate_compiled`: every kernel's and
  fusion's schedule replayed, calibrated where real-chip timings exist) per step and per
  token, its ratio to the bf16 model's, and the matrix units' feed floor: the weight
  elements a step multiplies (:func:`weight_elements`) at the rate the device's units take
  them in (:meth:`emulate.compiler.Generation.feed_seconds`: at decode each passes through
  a unit once). ``--no-bundles`` leaves these out; with
  them, the run happens in a process whose libtpu dumps its schedules (the harness
  starts one).

Run ``python -m benchmarks.models`` (every model, step and generation, routes pallas and
bf16: hours on 2 busy cores; ``--routes front`` adds the QArrays as loaded, relaid out by
each call, 3-6 minutes a program) or ``--quick`` (Llama-3-8B Q4_K_M decode at batch 1 on
v2 and v5e, pallas and bf16: 395 s at a load average of 16 on 2 shared cores);
``--resume PATH`` keeps every row as it is measured and
skips those already there.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness, model_layers, model_specs, provenance, timing, units
from benchmarks import model_weights as mw
from benchmarks.model_goals import goal_lines
from benchmarks.model_layers import ROUTES, head, layer
from benchmarks.model_steps import STEPS, ideal_bytes, routed_sizes, step_flops, weight_elements
from benchmarks.pallas_traffic import estimate_seconds, kernel_traffic
from emulate import compiler
from emulate.compiler.devices import on_device
from emulate.compiler.jobs import place_specs
from emulate.kvcache import KVCache, decode_kernel, prefill_kernel
from emulate.pallas import gmm_kernel

GENERATIONS = ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x")
#: KV cache formats a row may hold (:data:`emulate.kvcache.FORMATS`), bfloat16 first.
CACHES = ("bfloat16", "int8", "float8_e4m3fn", "int8_per_head", "q8_0", "q4_0", "mxfp4")
QUICK = {
    "models": ["llama3-8b-q4_k_m"],
    "generations": ["tpu_v2", "tpu_v5e"],
    "steps": ["decode-1"],
    "routes": ["pallas", "bf16"],
}


def cache_spec(s: model_layers.Shape, batch: int, tokens: int, fmt: str) -> Any:
    """One layer's abstract KV cache (a :class:`emulate.kvcache.KVCache` of shapes) in
    cache format ``fmt`` (fixed per-head scales where the format has them)."""
    scales = {"k_scales": 1.0, "v_scales": 1.0} if fmt.endswith("_per_head") else {}
    return jax.eval_shape(
        lambda: KVCache.create(1, batch, s.kv_heads, s.head_dim, tokens, fmt, **scales)
    )


def _programs(
    m: model_specs.Model, route: str, gen: str, step: str, cache_format: str = "bfloat16"
) -> dict[str, tuple]:
    s = m.shape
    b, t, kv = STEPS[step]
    x = jax.ShapeDtypeStruct((b, t, s.dim), jnp.bfloat16)
    cache = cache_spec(s, b, kv, cache_format)
    pos = jax.ShapeDtypeStruct((), jnp.int32)
    lw, hw = model_specs.layer_weights(m, route), model_specs.head_weights(m, route)
    alone = layer(s, route, gen, collective=False)  # traced outside shard_map
    return {
        "layer": (layer(s, route, gen), (lw, x, cache, pos), (2,), alone),
        "head": (head(s, route, gen), (hw, x), (), None),
    }


#: the weights split along their last axis (column-parallel) and their first (row-parallel)
_COLUMNS = ("q", "k", "v", "gate", "up", "head")
_ROWS = ("o", "down")


def _split_axis(path: tuple, leaf: Any) -> int | None:
    """The axis of a program argument's leaf that tensor parallelism splits: weights by
    their name (experts' leaves past their leading axis), the KV cache along its heads
    (code rows' lanes, scale rows, per-head scales; not the lengths)."""
    arg = path[0].idx
    if arg == 2:  # the layer's KV cache
        part = getattr(path[1], "name", "")
        if part == "lengths":
            return None
        return 3 if part in ("k", "v") else len(leaf.shape) - 2
    name = getattr(path[1], "key", None) if arg == 0 and len(path) > 1 else None
    nd = len(leaf.shape)
    if nd < 2 or name not in (*_COLUMNS, *_ROWS):
        return None
    return nd - 1 if name in _COLUMNS else nd - 2


def _compile(fn: Any, specs: tuple, gen: str, donate: tuple, chips: int) -> Any:
    """``fn(*specs)`` compiled for ``gen``: on one device, or over the 8-chip topology of
    :data:`model_specs.TOPOLOGIES` with ``fn`` as the per-chip program of a
    ``jax.shard_map`` (each argument leaf split by :func:`_split_axis`). The weights
    (``specs[0]``) and the donated KV caches take the layout the compiled program asks
    for (``Layout.AUTO``: a server puts them there once, with ``compiled.input_formats``);
    with the TPU's default layouts, an array whose last dimension is not a multiple of 128
    lies transposed (u8[32, 1536, 2880] as {1,2,0}, a cache of head_dim 64 as {2,3,1,0})
    and the program relayouts it on every call."""
    from jax.experimental import topologies
    from jax.experimental.layout import Format, Layout
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    held = (0, *donate)  # the weights and the KV caches: in the layout the program asks for
    if chips == 1:
        dev = compiler.device(gen)
        one = jax.sharding.SingleDeviceSharding(dev)
        auto = Format(Layout.AUTO, one)
        placed = place_specs(specs, dev)
        shardings = tuple(auto if i in held else one for i in range(len(specs)))
        outs = (one, auto) if donate else one
        with on_device(dev):
            jitted = jax.jit(fn, in_shardings=shardings, out_shardings=outs, donate_argnums=donate)
            return jitted.lower(*placed).compile()

    devices = topologies.get_topology_desc(model_specs.TOPOLOGIES[gen], "tpu").devices
    mesh = Mesh(devices, ("x",))
    paths, treedef = jax.tree_util.tree_flatten_with_path(specs)
    parts, leaves, donated = [], [], []
    for i, (path, leaf) in enumerate(paths):
        axis = _split_axis(path, leaf)
        shape = list(leaf.shape)
        spec = [None] * len(shape)
        if axis is not None:
            shape[axis] *= chips
            spec[axis] = "x"
        parts.append(P(*spec))
        leaves.append(
            jax.ShapeDtypeStruct(shape, leaf.dtype, sharding=NamedSharding(mesh, P(*spec)))
        )
        if path[0].idx in donate:
            donated.append(i)

    def body(*flat: Any) -> Any:
        return fn(*jax.tree_util.tree_unflatten(treedef, flat))

    shardings = [
        Format(Layout.AUTO, leaf.sharding) if path[0].idx in held else leaf.sharding
        for (path, _), leaf in zip(paths, leaves)
    ]
    caches = jax.tree_util.tree_map_with_path(
        lambda p, leaf: P(*[("x" if d == _split_axis((_ARG2, *p), leaf) else None)
                            for d in range(len(leaf.shape))]),
        specs[2],
    ) if donate else None  # fmt: skip
    out = (P(), caches) if donate else P(None, "x")
    outs: Any = NamedSharding(mesh, P(None, "x"))
    if donate:
        auto_cache = jax.tree.map(lambda p: Format(Layout.AUTO, NamedSharding(mesh, p)), caches)
        outs = (NamedSharding(mesh, P()), auto_cache)
    mapped = jax.shard_map(body, mesh=mesh, in_specs=tuple(parts), out_specs=out, check_vma=False)
    with on_device(devices[0]):
        jitted = jax.jit(
            mapped, in_shardings=tuple(shardings), out_shardings=outs,
            donate_argnums=tuple(donated),
        )  # fmt: skip
        return jitted.lower(*leaves).compile()


_ARG2 = jax.tree_util.SequenceKey(2)


def _prefetch(s: model_layers.Shape, step: str, eqn: Any) -> tuple:
    """A kernel's scalar-prefetch values: the attention's visible tokens (decode: a full
    cache, each sequence's ``kv`` tokens; prefill: query ``t`` sees ``1 + t``) and layer,
    a grouped kernel's visits under :func:`routed_sizes`."""
    b, t, kv = STEPS[step]
    if eqn.params["name"] in (decode_kernel.NAME, prefill_kernel.NAME):
        seen = kv if eqn.params["name"] == decode_kernel.NAME else 1
        return np.full((b,), seen, np.int32), np.zeros((1,), np.int32)
    x = eqn.params["grid_mapping"].block_mappings[0]
    m, bm = int(x.array_aval.shape[0]), int(x.block_shape[0].block_size)
    return gmm_kernel.schedule(jnp.asarray(routed_sizes(s, m // s.top_k)), m, bm)


def _costs(
    fn: Any,
    specs: tuple,
    gen: str,
    donate: tuple,
    chips: int,
    alone: Any = None,
    prefetch: Any = None,
) -> dict[str, Any]:
    """What one program costs per device: bytes accessed (the compiler's, plus its Pallas
    kernels' block traffic, counted on ``alone``, the program without collectives, where
    given), temporaries, outputs, the compiler's estimate (None with kernels, or where
    libtpu gives its sentinel) and the kernels' count."""
    timed = None
    if compiler.dump_directory() is not None:
        compiled, timed = compiler.estimate_compiled(
            lambda: _compile(fn, specs, gen, donate, chips), gen
        )
    else:
        compiled = _compile(fn, specs, gen, donate, chips)
    cost = compiled.cost_analysis() or {}
    mem = compiled.memory_analysis()
    kernels = compiled.as_text().count('custom_call_target="tpu_custom_call"')
    moved = float(cost.get("bytes accessed") or 0.0)
    if kernels:
        moved += kernel_traffic(alone or fn, specs, gen, prefetch)["bytes"]
    return {
        "bytes": moved,
        "temp": int(mem.temp_size_in_bytes),
        "output": int(mem.output_size_in_bytes) - int(mem.alias_size_in_bytes),
        "estimate": None if kernels else estimate_seconds(cost),
        "kernels": kernels,
        "bundle_s": None if timed is None else timed.seconds,
        "bundle_kernels_s": None if timed is None else timed.kernel_seconds,
        "dma_bytes": None if timed is None else timed.hbm_bytes,
    }


def _rate(gen: str, route: str) -> float:
    """Multiply-add x 2 per second of one device for ``route``: the kernel multiplies in
    f32 on v2 and v3 (Mosaic takes only f32 x f32 there), in bf16 elsewhere; XLA's bf16
    model in bf16."""
    from emulate import targets

    t = targets.get(gen)
    f32 = route != "bf16" and gen in ("tpu_v2", "tpu_v3")
    per_core = t.f32_ops_per_second if f32 else t.bf16_ops_per_second
    assert per_core is not None
    return float(per_core * model_specs.HBM[gen][1])


def measure(
    model: str, gen: str, step: str, route: str, log: Any, cache: str = "bfloat16"
) -> dict[str, Any]:
    """One row: the layer (its KV cache in format ``cache``) and the head compiled for
    ``gen``, extrapolated to the model."""
    m = model_specs.MODELS[model]
    s = m.shape
    row: dict[str, Any] = {"model": model, "generation": gen, "step": step, "route": route}
    if cache != "bfloat16":
        row["cache"] = cache
    progs = _programs(m, route, gen, step, cache)
    lw, hw = progs["layer"][1][0], progs["head"][1][0]
    ideal = ideal_bytes(m, route, step, lw, hw, cache)
    got: dict[str, dict] = {}
    for part, (fn, specs, donate, alone) in progs.items():
        t0 = time.perf_counter()
        try:
            prefetch = functools.partial(_prefetch, s, step)
            got[part] = _costs(fn, specs, gen, donate, s.chips, alone, prefetch)
        except timing.COMPILE_REFUSALS as e:
            row.update(status="refused", reason=f"{part}: {timing.short_error(e)}")
            log(f"{model} {gen} {step} {route}: {row['reason']}")
            return row
        log(f"{model} {gen} {step} {route} {cache} {part}: {time.perf_counter() - t0:.1f} s")
    lay, hd = got["layer"], got["head"]
    n = s.layers
    row.update(status="ok", kernels=lay["kernels"] + hd["kernels"])
    row["bytes"] = n * lay["bytes"] + hd["bytes"]
    row["ideal"] = n * ideal["layer"] + ideal["head"]
    row["bytes_over_ideal"] = row["bytes"] / row["ideal"]
    row["layer_bytes_over_ideal"] = lay["bytes"] / ideal["layer"]
    row["temp"] = max(lay["temp"], hd["temp"])
    row["flops"] = step_flops(s, step)
    row["stored_weights"] = n * ideal["layer_weights"] + mw.nbytes(hw)
    row["temp_over_weights"] = row["temp"] / row["stored_weights"]
    embed = model_specs.embed_bytes(m, route)
    row["footprint"] = (
        n * (ideal["layer_weights"] + ideal["cache"])
        + mw.nbytes(hw) + embed + row["temp"] + hd["output"]
    )  # fmt: skip
    est = [lay["estimate"], hd["estimate"]]
    row["estimate_s"] = None if None in est else n * est[0] + est[1]
    if lay["bundle_s"] is not None and hd["bundle_s"] is not None:
        row["bundle_s"] = n * lay["bundle_s"] + hd["bundle_s"]
        row["bundle_kernels_s"] = n * lay["bundle_kernels_s"] + hd["bundle_kernels_s"]
    if lay.get("dma_bytes") is not None and hd.get("dma_bytes") is not None:
        # what the schedule's DMAs move between HBM and VMEM: the chip's real traffic
        # (libtpu's "bytes accessed" also counts XLA ops whose operands live in VMEM)
        row["dma_bytes"] = n * lay["dma_bytes"] + hd["dma_bytes"]
        row["dma_over_ideal"] = row["dma_bytes"] / row["ideal"]
    return derive(row)


def derive(row: dict[str, Any]) -> dict[str, Any]:
    """A measured row's figures that follow from :data:`model_specs.HBM` and the targets'
    bandwidth: the device's HBM, whether the footprint fits it, bytes and ideal bytes over
    the bandwidth (seconds)."""
    if row.get("status") != "ok":
        return row
    gen = row["generation"]
    row["hbm"] = model_specs.HBM[gen][0]
    row["fits"] = row["footprint"] <= row["hbm"]
    row["bandwidth_s"] = row["bytes"] / model_specs.bandwidth(gen)
    row["floor_s"] = row["ideal"] / model_specs.bandwidth(gen)
    flops = row.setdefault("flops", step_flops(model_specs.MODELS[row["model"]].shape, row["step"]))
    compute = flops / _rate(gen, row["route"])
    row["roofline_s"] = max(row["bandwidth_s"], compute)
    s = model_specs.MODELS[row["model"]].shape
    b, t, _ = STEPS[row["step"]]
    cores = model_specs.HBM[gen][1]  # TensorCores a device drives (v5p: 2)
    row["feed_s"] = compiler.generation(gen).feed_seconds(weight_elements(s, row["step"])) / cores
    if row.get("bundle_s") is not None:
        row["bundle_token_s"] = row["bundle_s"] / (b * t)
    return row


def _gb(v: float | None) -> str:
    return units.MISSING if v is None else f"{v / 1e9:.2f}"


def _gib(v: float | None) -> str:
    return units.MISSING if v is None else f"{v / (1 << 30):.2f}"


#: each route's name in the tables
ROUTE_LABELS = {
    "front": "emulate.matmul (QArray)",
    "pallas": "pallas.matmul (prepared)",
    "bf16": "bf16 model",
}


def _bundle_cells(r: dict[str, Any], bf16: dict[str, Any] | None) -> list[str]:
    """The bundle model's cells: ms a step (ms a token), x the bf16 model's, feed floor."""
    if r.get("bundle_s") is None:
        return [units.MISSING, units.MISSING, units.ms(r["feed_s"], 2)]
    base = None if bf16 is None else bf16.get("bundle_s")
    ratio = units.MISSING if not base else f"{r['bundle_s'] / base:.2f}x"
    step = f"{units.ms(r['bundle_s'], 1)} ({units.ms(r['bundle_token_s'], 3)})"
    return [step, ratio, units.ms(r["feed_s"], 2)]


def _cells(r: dict[str, Any], bf16: dict[str, Any] | None = None) -> list[str]:
    if r["status"] != "ok":
        return [r["status"], r.get("reason", "")[:80], "", "", "", "", "", "", "", ""]
    fit = "fits" if r["fits"] else "**does not fit**"
    dma = "" if r.get("dma_over_ideal") is None else f"; DMAs {r['dma_over_ideal']:.3f}x"
    return [
        f"{_gb(r['bytes'])} GB ({r['bytes_over_ideal']:.3f}x{dma})",
        f"{_gib(r['temp'])} GiB ({100 * r['temp_over_weights']:.1f}%)",
        f"{_gib(r['footprint'])} GiB, {fit}",
        "none" if r["estimate_s"] is None else units.ms(r["estimate_s"], 1),
        units.ms(r["bandwidth_s"], 1),
        units.ms(r["floor_s"], 1),
        units.ms(r["roofline_s"], 1),
        *_bundle_cells(r, bf16),
    ]


def markdown(data: dict[str, Any]) -> str:
    """One table per model and step: a row per generation and route."""
    rows = data["results"]
    lines = [f"`{data['command']}` (libtpu {data['libtpu']}; {data['wall_s']:.0f} s)", ""]
    heads = [
        "generation (HBM)",
        "route",
        "bytes / step (x ideal)",
        "temporaries (% of weights)",
        "footprint",
        "compiler's estimate (ms)",
        "bytes / HBM BW (ms)",
        "ideal / HBM BW (ms)",
        "max(bytes / BW, flops / peak) (ms)",
        "bundle model: ms / step (ms / token)",
        "x bf16 model",
        "MXU feed floor (ms)",
    ]
    bf16 = {
        (r["model"], r["generation"], r["step"]): r
        for r in rows
        if r["route"] == "bf16" and r.get("status") == "ok" and _cache(r) == "bfloat16"
    }
    for model in dict.fromkeys(r["model"] for r in rows):
        for step in dict.fromkeys(r["step"] for r in rows if r["model"] == model):
            lines += [f"#### {model_specs.MODELS[model].name}, {step}", ""]
            lines += ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
            order = {g: i for i, g in enumerate(GENERATIONS)}
            picked = [r for r in rows if (r["model"], r["step"]) == (model, step)]
            for r in sorted(
                picked,
                key=lambda r: (
                    order[r["generation"]], ROUTES.index(r["route"]), CACHES.index(_cache(r))
                ),
            ):  # fmt: skip
                hbm = f"{r['generation']} ({model_specs.HBM[r['generation']][0] >> 30} GiB)"
                base = bf16.get((model, r["generation"], step))
                label = ROUTE_LABELS[r["route"]]
                if r.get("cache"):
                    label += f", {r['cache']} KV cache"
                cells = [hbm, label, *_cells(r, base)]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    lines += goal_lines(rows)
    return "\n".join(lines) + "\n"


def _names(text: str | None, known: Sequence[str], flag: str) -> list[str] | None:
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise harness.FlagError(f"{flag}: unknown {bad or text!r}; known: {', '.join(known)}")
    return names


def run(args: argparse.Namespace) -> harness.Report:
    """Compile every (model, generation, step, route) asked for; the report. With
    ``--from-json``, compile nothing: the tables of earlier runs' JSON, merged."""
    if args.from_json:
        runs = [json.loads(p.read_text()) for p in args.from_json]
        rows = [derive(r) for d in runs for r in d["results"]]
        commands = "`, `".join(d["command"] for d in runs)
        data = {"command": commands, "libtpu": runs[0]["libtpu"], "results": rows}
        data["wall_s"] = sum(d["wall_s"] for d in runs)
        return harness.Report(data, markdown(data), markdown=True)
    try:
        offered = compiler.generations()
    except compiler.CompilerUnavailable as e:
        raise harness.Unavailable(str(e)) from e
    pick = QUICK if args.quick else {}
    models = _names(args.models, list(model_specs.MODELS), "--models") or pick.get(
        "models", list(model_specs.MODELS)
    )
    gens = _names(args.generations, GENERATIONS, "--generations") or pick.get(
        "generations", list(GENERATIONS)
    )
    steps = _names(args.steps, list(STEPS), "--steps") or pick.get("steps", list(STEPS)[:3])
    routes = _names(args.routes, ROUTES, "--routes") or pick.get("routes", ["pallas", "bf16"])
    caches = _names(args.caches, CACHES, "--caches") or ["bfloat16"]
    t0 = time.perf_counter()
    done = _resumed(args.resume)
    rows = []
    for model in models:
        tp = model_specs.MODELS[model].shape.chips > 1
        for gen in gens:
            if gen not in offered or (tp and gen not in model_specs.TOPOLOGIES):
                continue
            for step, route, cache in itertools.product(steps, routes, caches):
                if route == "bf16" and cache != "bfloat16":
                    continue  # the bf16 model's rows: its bf16 cache
                key = (model, gen, step, route, cache)
                if key not in done:
                    done[key] = measure(model, gen, step, route, _log, cache)
                    if args.resume is not None:
                        with args.resume.open("a") as f:
                            f.write(json.dumps(done[key]) + "\n")
                rows.append(derive(done[key]))
    data = {
        "benchmark": "models",
        "command": args.command,
        "libtpu": compiler.libtpu_version(),
        "environment": provenance.environment(),
        "wall_s": time.perf_counter() - t0,
        "results": rows,
    }
    return harness.Report(data, markdown(data), markdown=True)


def _resumed(path: Path | None) -> dict[tuple, dict[str, Any]]:
    """The rows an earlier run appended to ``path`` (one JSON object a line), by (model,
    generation, step, route); none where there is no such file."""
    if path is None or not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["model"], r["generation"], r["step"], r["route"], _cache(r)): r for r in rows}


def _cache(row: dict[str, Any]) -> str:
    """A row's KV cache format (rows before cache formats hold a bfloat16 cache)."""
    return row.get("cache", "bfloat16")


def _log(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


def flags(p: argparse.ArgumentParser) -> None:
    """models' own flags: each a comma-separated subset (default all)."""
    p.add_argument("--models", help=f"from: {', '.join(model_specs.MODELS)}")
    p.add_argument("--generations", help=f"from: {', '.join(GENERATIONS)}")
    p.add_argument("--steps", help=f"from: {', '.join(STEPS)}")
    p.add_argument("--routes", help=f"from: {', '.join(ROUTES)} (default pallas,bf16)")
    p.add_argument(
        "--caches",
        help=f"KV cache formats, from: {', '.join(CACHES)} (default bfloat16; the bf16 "
        "model keeps its bfloat16 cache)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="PATH",
        help="append each row to PATH (JSON lines) as it is measured, and take the rows "
        "already there instead of compiling them again",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="compile nothing: the tables of earlier runs' JSON files, merged",
    )


BENCHMARK = harness.Benchmark(
    name="models",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    quick="Llama-3-8B Q4_K_M, decode at batch 1, on tpu_v2 and tpu_v5e, kernel and bf16",
    dumps=True,
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
