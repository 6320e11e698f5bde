"""Reading libtpu's final bundle schedule: the VLIW bundles a TPU core issues, one a cycle.

With ``LIBTPU_INIT_ARGS="--xla_jf_dump_to=DIR --xla_jf_dump_llo_text=true"`` (read once,
when libtpu loads), the TPU compiler writes, for every program it compiles (the top-level
program ``TLP``, each XLA fusion, each Mosaic kernel), ``<id>-<name>-<pass>-final_bundles.txt``
(the last pass: every bundle in issue order) and ``...-schedule-analysis_final_bundles.txt``
(counts); ``--xla_jf_dump_llo_pass_label_regex=final_bundles`` keeps only those two. This
module reads them into records; it interprets nothing (:mod:`emulate.compiler.replay` runs
the control flow, :mod:`emulate.compiler.timing` turns it into seconds).

The grammar, as libtpu 0.0.42.1 writes it (checked on v2 ... 7x)::

    = control target key start          a legend: LH loop header, LB loop body, LE loop
    ...                                 exit, PB predicated region body, PF predicated
    = control target key end            region fallthrough, CT control target

       0x14 LB: > { OP  ;;  OP ... } /* Start region 152 :: Start region 41 */
       0x15   : > { OP }
    ADDR [MARK]: [>...] { ops separated by ";;" } [/* region notes */]

A bundle starts with its address (decimal ``0`` for the first, then hex), an optional
control-target mark, one ``>`` per enclosing loop, and its operations in braces; a bundle
may span several lines (a DMA's descriptor is written into a comment). Comments nest (a
bounds check quotes the DMA it guards, comments and all). Each operation reads
``%dest = opcode [attributes] [(predicate)] operands``, where

- a value is ``%<kind><id>_<register>`` (``%s41_s8``: scalar value 41 in register ``s8``,
  ``%p42_p0`` a predicate, ``%v``/``%vm`` vectors and masks), or a bare ``%<id>`` for an
  operation without a register result (a store, a DMA, a branch);
- a predicate is ``(%p3)`` or ``(!%p3)`` (the operation happens only when it holds); an
  operation with a register result may write ``(%p3, %s41_s8)``, the second value being the
  register's old content, kept when the predicate fails;
- ``/*name=*/value`` names an operand (``/*size_in_granules=*/4096``,
  ``/*predicate=*/%p81_p7``); immediates are decimal or ``$0x...``;
- memory operands are ``[smem:[#allocation21_spill]]``, ``[smem:[%s5_s1 + $0x3]]``,
  ``[#allocation4 + $0x1]`` (a sync flag).

The operations that matter for time: ``sbr.rel (pred) target = $regionN`` (a branch, taken
after the bundles of its delay slots), ``scmp.ge.s32 ..., N /* loop exit test */`` (a
loop's exit test), ``dma.hbm_to_vmem`` / ``dma.vmem_to_hbm`` (a DMA of
``size_in_granules``; its comment states the window: ``window_bounds`` x
``element_size_in_bytes`` bytes, and the grid: ``iteration_bounds``), ``dma [#allocationN]``
(v2/v3: a DMA whose descriptor was stored to SMEM, sized by its comment only),
``dma.done.wait flag, granules`` and ``vsyncadd flag, delta`` (waiting for a DMA),
``vdelay N`` (v2/v3: N more cycles without issue) and ``inlined_call`` (the top-level
program calling a fusion or kernel, named in its comment).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

__all__ = [
    "Analysis",
    "Bundle",
    "Op",
    "Schedule",
    "ScheduleFiles",
    "Window",
    "aliases",
    "dump_files",
    "parse",
    "parse_analysis",
    "physical",
    "read",
]

#: The control-target marks of the legend.
MARKS: Final = ("LH", "LB", "LE", "PB", "PF", "CT")

_HEADER = re.compile(r"^[ \t]*(0x[0-9a-f]+|\d+)[ \t]+([A-Z]{2})?:[ \t]*(>*)[ \t]*\{", re.M)
_TOKEN = re.compile(r"/\*|\*/|\{|\}")
_NAMED = re.compile(r"/\*(\w+)=\*/")
_PRED = re.compile(r"\((!?%p\w+)(?:,\s*(%[\w]+))?\)")
_REGION = re.compile(r"(Start|End|Start/End empty) region (\d+)")
_TARGET = re.compile(r"target\s*=\s*\$region(\d+)")
_VALUE = re.compile(r"^%[a-z]*\d+_([a-z]+\d+)$")
_FIELD = re.compile(r"^(\w+): (.*)$", re.M)


def physical(value: str) -> str:
    """The register a value lives in: ``"%s41_s8"`` -> ``"s8"``; a value without a
    register (``"%20792"``) is its own name."""
    m = _VALUE.match(value)
    return m.group(1) if m else value


@dataclasses.dataclass(frozen=True)
class Window:
    """A DMA's window as its comment states it (Pallas pipelines and XLA fusions write one;
    none for DMAs that move a whole buffer).

    Attributes:
      bounds: ``window_bounds``, in elements of ``element_bytes``.
      element_bytes: ``element_size_in_bytes`` (one element of the window's tiling).
      iteration_bounds: the grid the window is fetched over (``(1, 56, 4)``), or ``()``.
    """

    bounds: tuple[int, ...]
    element_bytes: int
    iteration_bounds: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """The bytes one transfer of the window moves."""
        return math.prod(self.bounds) * self.element_bytes


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a bundle. Its operands are parsed when first asked for (most of
    a schedule's operations are vector work that only counts as issued).

    Attributes:
      dest: the value it defines (``"%s41_s8"``), or its bare id (``"%12906"``).
      opcode: ``"sadd.s32"``, ``"dma.hbm_to_vmem"``, ``"sbr.rel"`` ...
      text: the operation as written (comments included).
    """

    dest: str
    opcode: str
    text: str

    @functools.cached_property
    def _parts(self) -> tuple[tuple[str, ...], dict[str, str], str | None, str | None, str]:
        return _parse_operands(self.text)

    @property
    def operands(self) -> tuple[str, ...]:
        """The positional operands, as written, comments removed (``("1",
        "%s13372_s29")``); bracketed attributes (``[thread:$0]``, memory operands) stay in
        place, a memory operand with the value after it (``"[smem:[#allocation21_spill]]
        %s13340_s21"``)."""
        return self._parts[0]

    @property
    def named(self) -> Mapping[str, str]:
        """The ``/*name=*/value`` operands (``{"size_in_granules": "4096"}``)."""
        return self._parts[1]

    @property
    def predicate(self) -> str | None:
        """``"%p42_p0"`` / ``"!%p42_p0"`` when the operation is predicated, else None."""
        return self._parts[2]

    @property
    def keeps(self) -> str | None:
        """The old value of ``dest`` kept when the predicate fails (``(%p, %old)``)."""
        return self._parts[3]

    @property
    def comment(self) -> str:
        """The operation's comments, joined (``"loop exit test"``, a DMA's window)."""
        return self._parts[4]

    @property
    def window(self) -> Window | None:
        """The DMA window its comment states, or None."""
        fields = dict(_FIELD.findall(self.comment))
        if "window_bounds" not in fields or "element_size_in_bytes" not in fields:
            return None
        return Window(
            _ints(fields["window_bounds"]),
            int(fields["element_size_in_bytes"]),
            _ints(fields.get("iteration_bounds", "()")),
        )


@dataclasses.dataclass(frozen=True)
class Bundle:
    """One VLIW bundle: the operations a core issues in one cycle.

    Attributes:
      address: its index in the schedule (issue order).
      mark: ``"LB"``, ``"PF"`` ... (:data:`MARKS`), or None.
      depth: the loops around it (the ``>`` marks).
      ops: its operations; empty for an empty bundle (``{}``).
      starts: the regions that start here (a branch's ``$regionN`` names one).
      ends: the regions that end here.
    """

    address: int
    mark: str | None
    depth: int
    ops: tuple[Op, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One program's final bundles.

    Attributes:
      name: the program: ``"TLP"`` (top level), an XLA fusion's or a kernel's HLO name
        (``"emulate_matmul.1"``), ``"<late-initialization>"`` ...
      bundles: every bundle in issue order (``bundles[i].address == i``).
      path: the file it was read from, or ``""``.
    """

    name: str
    bundles: tuple[Bundle, ...]
    path: str = ""

    def __len__(self) -> int:
        return len(self.bundles)

    def region_starts(self) -> dict[int, int]:
        """Each region's first bundle: ``{region: address}`` (branch targets)."""
        found: dict[int, int] = {}
        for b in self.bundles:
            for r in b.starts:
                found.setdefault(r, b.address)
        return found

    def ops(self, prefix: str = "") -> Iterator[tuple[Bundle, Op]]:
        """Every (bundle, op) whose opcode starts with ``prefix``, in issue order."""
        for b in self.bundles:
            for op in b.ops:
                if op.opcode.startswith(prefix):
                    yield b, op


@dataclasses.dataclass(frozen=True)
class Analysis:
    """A ``schedule-analysis_final_bundles.txt`` file's counts."""

    total: int
    empty: int


@dataclasses.dataclass(frozen=True)
class ScheduleFiles:
    """The two files libtpu writes for one program (the analysis may be missing)."""

    name: str
    bundles: Path
    analysis: Path | None


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"-?\d+", text))


def _split_comments(text: str) -> tuple[str, str]:
    """``text`` without its comments (which nest), and the comments' text joined."""
    code: list[str] = []
    notes: list[str] = []
    depth, pos = 0, 0
    for m in re.finditer(r"/\*|\*/", text):
        if m.group() == "/*":
            if depth == 0:
                code.append(text[pos : m.start()])
                pos = m.end()
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                notes.append(text[pos : m.start()])
                pos = m.end()
    if depth == 0:
        code.append(text[pos:])
    else:  # an unclosed comment: the rest is comment
        notes.append(text[pos:])
    return "".join(code), " ".join(n.strip() for n in notes)


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets and parentheses."""
    if not any(c in text for c in "[("):
        return text.split(sep)
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    parts.append(text[start:])
    return parts


_OP_HEAD = re.compile(r"\s*(%[\w]+)\s*=\s*([^\s/]+)")


def _parse_op(text: str) -> Op | None:
    m = _OP_HEAD.match(text)
    if m is None:
        code = _split_comments(text)[0].strip()
        if not code:
            return None
        return Op("", code.partition(" ")[0], text)  # an operation without "=" (none seen)
    return Op(m.group(1), m.group(2), text)


def _parse_operands(
    text: str,
) -> tuple[tuple[str, ...], dict[str, str], str | None, str | None, str]:
    """An operation's (operands, named operands, predicate, kept value, comment)."""
    code, comment = _split_comments(_NAMED.sub(lambda m: f"\x00{m.group(1)}=", text))
    m = _OP_HEAD.match(code)
    args = code[m.end() :] if m else code.strip().partition(" ")[2]
    predicate = keeps = None
    p = _PRED.search(args)
    if p and args[: p.start()].count("[") == args[: p.start()].count("]"):
        predicate, keeps = p.group(1), p.group(2)
        args = args[: p.start()] + args[p.end() :]
    operands: list[str] = []
    named: dict[str, str] = {}
    for part in _split_top(args, ","):
        part, _, name = part.partition("\x00")  # "[thread:$0]  \x00hbm=%s39_s30"
        if part.strip():
            operands.append(part.strip())
        if name:
            key, _, value = name.partition("=")
            named[key] = value.strip()
    return tuple(operands), named, predicate, keeps, comment


def _bundle_body(text: str, start: int, end: int) -> tuple[str, str]:
    """The text inside the braces opened just before ``start`` and the text after them
    (the region notes), braces inside comments ignored."""
    depth, comment = 1, 0
    for m in _TOKEN.finditer(text, start, end):
        t = m.group()
        if t == "/*":
            comment += 1
        elif t == "*/":
            comment = max(comment - 1, 0)
        elif comment == 0:
            depth += 1 if t == "{" else -1
            if depth == 0:
                return text[start : m.start()], text[m.end() : end]
    raise ValueError(f"schedule: a bundle without its closing brace: {text[:120]!r}")


def parse(text: str, name: str = "", path: str = "") -> Schedule:
    """The :class:`Schedule` of a ``*-final_bundles.txt`` file's text.

    Raises:
      ValueError: text with no bundle, a bundle without its closing brace, or addresses
        out of order (not a final bundle schedule).
    """
    heads = list(_HEADER.finditer(text))
    if not heads:
        raise ValueError(f"schedule {name or path!r}: no bundle found (not a final_bundles file)")
    bundles: list[Bundle] = []
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        address = int(h.group(1), 0)
        if address != len(bundles):
            raise ValueError(
                f"schedule {name or path!r}: bundle {len(bundles)} has address {address:#x}"
            )
        body, notes = _bundle_body(text, h.end(), end)
        ops = tuple(op for part in _split_top_ops(body) if (op := _parse_op(part)) is not None)
        starts, ends = [], []
        for kind, region in _REGION.findall(notes):
            if kind.startswith("Start"):
                starts.append(int(region))
            if kind != "Start":
                ends.append(int(region))
        bundles.append(
            Bundle(address, h.group(2), len(h.group(3)), ops, tuple(starts), tuple(ends))
        )
    return Schedule(name, tuple(bundles), path)


def _split_top_ops(body: str) -> list[str]:
    """A bundle body split at its ``;;`` separators outside comments."""
    if "/*" not in body:
        return body.split(";;")
    parts, depth, start = [], 0, 0
    for m in re.finditer(r"/\*|\*/|;;", body):
        t = m.group()
        if t == "/*":
            depth += 1
        elif t == "*/":
            depth = max(depth - 1, 0)
        elif depth == 0:
            parts.append(body[start : m.start()])
            start = m.end()
    parts.append(body[start:])
    return parts


def parse_analysis(text: str) -> Analysis:
    """The counts of a ``schedule-analysis_final_bundles.txt`` file.

    Raises:
      ValueError: text without "total scheduled bundles".
    """
    total = re.search(r"total scheduled bundles:\s*(\d+)", text)
    empty = re.search(r"empty scheduled bundles:\s*(\d+)", text)
    if total is None:
        raise ValueError("schedule analysis: no 'total scheduled bundles' line")
    return Analysis(int(total.group(1)), int(empty.group(1)) if empty else 0)


def read(path: str | Path) -> Schedule:
    """The :class:`Schedule` in a ``*-final_bundles.txt`` file, named by its file name."""
    p = Path(path)
    return parse(p.read_text(), _program_name(p.name) or p.stem, str(p))


_FILE = re.compile(r"^(\d+)-(.+)-(\d+)-(schedule-analysis_)?final_bundles\.txt$")
_DEDUP = re.compile(r"^(\d+)-TLP-(\d+)-deduplication-map\.txt$")


def _program_name(file_name: str) -> str | None:
    m = _FILE.match(file_name)
    return m.group(2) if m else None


def dump_files(directory: str | Path, names: Iterator[str] | None = None) -> list[ScheduleFiles]:
    """The programs whose final bundles a dump directory holds, in file-name order
    (``TLP`` and the ``<late-...>`` pieces included). ``names``: only these files (file
    names within ``directory``), e.g. the ones one compile added."""
    d = Path(directory)
    listed = sorted(names) if names is not None else sorted(p.name for p in d.iterdir())
    found: dict[tuple[str, str], dict[str, Path]] = {}
    for file_name in listed:
        m = _FILE.match(file_name)
        if m is None:
            continue
        kind = "analysis" if m.group(4) else "bundles"
        found.setdefault((m.group(1), m.group(2)), {})[kind] = d / file_name
    return [
        ScheduleFiles(name, files["bundles"], files.get("analysis"))
        for (_, name), files in found.items()
        if "bundles" in files
    ]


def aliases(directory: str | Path, names: Iterator[str] | None = None) -> dict[str, str]:
    """The top-level programs' deduplication maps in a dump directory (written when the
    dump's pass regex matches ``deduplication-map``): each HLO name that libtpu compiled
    as a copy of another, mapped to the name whose schedule it dumped
    (``{"multiply_add_fusion": "multiply_add_fusion.1"}``). ``names``: only these files.

    The map's text reads ``key:NAME`` / ``equivalent_hlos[size=N]:`` / N indented names.
    """
    d = Path(directory)
    listed = sorted(names) if names is not None else sorted(p.name for p in d.iterdir())
    found: dict[str, str] = {}
    for file_name in listed:
        if not _DEDUP.match(file_name):
            continue
        key = ""
        for line in (d / file_name).read_text().splitlines():
            if line.startswith("key:"):
                key = line[4:].strip()
            elif line.startswith("  ") and key and line.strip() != key:
                found[line.strip()] = key
    return found
