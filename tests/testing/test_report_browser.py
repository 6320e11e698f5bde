"""The HTML report in a real headless Chromium: it renders, its histograms are drawn, and
it needs no network. Marked ``browser``: deselected unless EMULATE_BROWSER_TESTS=1
(tests/conftest.py); then a missing ``chromium`` is a failure (install it with
``apt-get install -y chromium``).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib

import pytest

from emulate.testing.harness import CheckResult
from emulate.testing.report import render_html

pytestmark = pytest.mark.browser


def _entries():
    ok = CheckResult("m:good", "int8", "int8", "exact", "tpu_v4", 20, 0.0, [0.0] * 12 + [0.4] * 8)
    bad = CheckResult(
        "m:bad", "bfloat16", "float8_e4m3fn", "fast", "tpu_v5e", 7, 32768.0,
        [0.1, 0.2, 5.0], "first mismatch at index (0, 0): got 8.0, want -8.0", "import numpy",
    )  # fmt: skip
    return [("test_good[tpu_v4]", ok), ("test_bad[tpu_v5e]", bad)]


def _chromium(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed: apt-get install -y chromium"
    # No proxy that answers: any request for an outside resource would fail.
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9"]
    return subprocess.run(
        [exe, *flags, *args], capture_output=True, text=True, timeout=120, check=True
    )


def _png_colours(path) -> set[bytes]:
    """The distinct RGB colours of an 8-bit, non-interlaced RGB or RGBA PNG."""
    data = path.read_bytes()
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        ihdr = body if kind == b"IHDR" else ihdr
        idat += body if kind == b"IDAT" else b""
        pos += 12 + n
    w, h, depth, ctype = struct.unpack(">IIBB", ihdr[:10])
    assert depth == 8 and ctype in (2, 6)
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp
    prev, seen = bytearray(stride), set()
    for y in range(h):
        f, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        seen.update(bytes(line[i : i + 3]) for i in range(0, stride, bpp))
        prev = line
    return seen


def test_report_renders_in_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(_entries()))
    dom = _chromium("--dump-dom", page.as_uri()).stdout
    assert dom.count('<svg class="hist"') == 2
    assert dom.count("<rect") == 22  # 11 bars per histogram
    assert "2 checks, 1 failed" in dom and "got 8.0, want -8.0" in dom
    shot = tmp_path / "shot.png"
    _chromium(f"--screenshot={shot}", "--window-size=1000,800", page.as_uri())
    # The red failure bin (#c0392b) and the blue bars (#2e86c1) are painted.
    colours = _png_colours(shot)
    assert bytes.fromhex("c0392b") in colours and bytes.fromhex("2e86c1") in colours
