"""Headless Chromium from the command line, for the job view's browser tests.

Debian's `chromium-headless-shell` (installed by scripts/test.sh) renders a page with
`--dump-dom` (the DOM after load, as HTML) or `--screenshot` (a PNG). With
`--enable-logging=stderr --v=0` it logs every console message as `CONSOLE(...)` on stderr,
which is how the tests see console errors without a driver. `png_pixels` decodes its PNGs
with zlib (no Pillow).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from html.parser import HTMLParser
from pathlib import Path

BINARY = os.environ.get("CHROMIUM", "/usr/bin/chromium-headless-shell")
FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
"""Where the browser tests keep their screenshots (git-ignored; CI uploads them)."""


def available() -> bool:
    return shutil.which(BINARY) is not None or Path(BINARY).exists()


def _run(url: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run(
            [BINARY, *FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def console_errors(stderr: str) -> list[str]:
    """Console messages and failed loads that Chromium logged (any level: a clean page
    logs none)."""
    return [
        line
        for line in stderr.splitlines()
        if "CONSOLE" in line or "Failed to load resource" in line or "Uncaught" in line
    ]


def dump_dom(url: str) -> tuple[str, list[str]]:
    """(the DOM after load, console errors)."""
    proc = _run(url, "--dump-dom", "--virtual-time-budget=2000")
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout, console_errors(proc.stderr)


def screenshot(url: str, path: Path, width: int = 1200, height: int = 1400) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = _run(url, f"--screenshot={path}", f"--window-size={width},{height}")
    if proc.returncode != 0 or not path.exists():
        raise RuntimeError(f"chromium screenshot failed: {proc.stderr[-2000:]}")
    return path


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        rows.append(
            bytes(line) if channels == 3 else bytes(line[j] for j in range(stride) if j % 4 != 3)
        )
        prev = line
    return width, height, rows


def colour_stats(rows: list[bytes]) -> tuple[float, dict[tuple[int, int, int], int]]:
    """(variance of the grey level, pixel count per RGB colour) of decoded rows."""
    counts: dict[tuple[int, int, int], int] = {}
    total = total_sq = n = 0
    for row in rows:
        for i in range(0, len(row), 3):
            rgb = (row[i], row[i + 1], row[i + 2])
            counts[rgb] = counts.get(rgb, 0) + 1
    for (r, g, b), k in counts.items():
        grey = (r + g + b) / 3
        total += grey * k
        total_sq += grey * grey * k
        n += k
    mean = total / n
    return total_sq / n - mean * mean, counts


def near(counts: dict[tuple[int, int, int], int], hex_colour: str, tol: int = 6) -> int:
    """Pixels within `tol` of a #RRGGBB colour."""
    want = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return sum(k for rgb, k in counts.items() if all(abs(x - y) <= tol for x, y in zip(rgb, want)))


class Elements(HTMLParser):
    """Every start tag as (tag, attrs, index of the enclosing <g class="bar">, or -1)."""

    def __init__(self, html: str):
        super().__init__()
        self.items: list[tuple[str, dict[str, str], int]] = []
        self.text: list[str] = []
        self._bar = -1
        self._bars = 0
        self._depth: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "g" and "bar" in a.get("class", "").split():
            self._bar = self._bars
            self._bars += 1
        self.items.append((tag, a, self._bar))
        if tag == "g":
            self._depth.append("bar" if "bar" in a.get("class", "") else "g")

    def handle_endtag(self, tag):
        if tag == "g" and self._depth and self._depth.pop() == "bar":
            self._bar = -1

    def handle_data(self, data):
        self.text.append(data)

    def find(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [
            a
            for t, a, _ in self.items
            if t == tag and (cls is None or cls in a.get("class", "").split())
        ]
