"""The HTML report in a real headless Chromium: it renders, its plots (histograms of
err/bound, passed/failed bars of exact checks) are drawn, and it needs no network; once
for a made-up report, once for the report the plugin writes for the docs suite with a bug
in it. Screenshots go to the test's tmp folder (and to ``$EMULATE_SCREENSHOTS`` if set).
Marked ``browser``: deselected unless EMULATE_BROWSER_TESTS=1 (tests/conftest.py); then a
missing ``chromium`` is a failure (install it with ``apt-get install -y chromium``).
"""

from __future__ import annotations

import os
import pathlib
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


def _screenshot(page: pathlib.Path, name: str) -> set[bytes]:
    """The colours Chromium paints for ``page`` (a 1100x2400 window)."""
    shot = page.parent / f"{name}.png"
    _chromium(f"--screenshot={shot}", "--window-size=1100,2400", page.as_uri())
    keep = os.environ.get("EMULATE_SCREENSHOTS")
    if keep:
        pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, pathlib.Path(keep) / shot.name)
    return _png_colours(shot)


# The plots' colours: histogram bars, the failure bin / failed bar, the passed bar.
BLUE, RED, GREEN = (bytes.fromhex(c) for c in ("2e86c1", "c0392b", "1e8449"))


def test_report_renders_in_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(_entries()))
    dom = _chromium("--dump-dom", page.as_uri()).stdout
    # The exact check: passed/failed bars; the bounded one: a histogram of err/bound.
    assert dom.count('<svg class="outcomes"') == 1 and dom.count('<svg class="hist"') == 1
    assert dom.count("<rect") == 13  # 2 bars, 11 bins
    assert "2 checks, 1 failed" in dom and "got 8.0, want -8.0" in dom
    colours = _screenshot(page, "made_up_report")
    assert BLUE in colours and RED in colours and GREEN in colours


def test_the_plugins_report_of_the_docs_suite_renders(pytester: pytest.Pytester, tmp_path):
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs"
    pytester.makepyfile(kernels_test=(docs / "kernels_test.py").read_text())
    bug = (
        "\ndef int4_weight_only(x, w):  # scales rounded to bfloat16\n"
        "    codes = w.unpacked_codes().astype(jnp.float32)\n"
        "    s = w.scales.astype(jnp.bfloat16).astype(jnp.float32)\n"
        "    scales = jnp.repeat(s, w.block_shape[0], axis=0)[: codes.shape[0]]\n"
        "    return jnp.dot(x, codes * scales, precision=lax.Precision.HIGHEST)\n"
    )
    pytester.makepyfile(my_kernels=(docs / "my_kernels.py").read_text() + bug)
    result = pytester.runpytest_subprocess(
        "-p", "emulate.testing.plugin", "--emulate-report", "report",
        "--hypothesis-seed", "3", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=3, failed=1)
    page = pytester.path / "report.html"
    dom = _chromium("--dump-dom", page.as_uri()).stdout
    assert "4 checks, 1 failed" in dom
    # Bounded checks (int4, the Pallas kernel on two targets): histograms; int8: bars.
    assert dom.count('<svg class="hist"') == 3 and dom.count('<svg class="outcomes"') == 1
    assert dom.count("seed 3") == 4 and "from my_kernels import int4_weight_only" in dom
    colours = _screenshot(page, "docs_suite_report")
    assert BLUE in colours and RED in colours and GREEN in colours
