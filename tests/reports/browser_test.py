#!/usr/bin/python3
"""tests/reports/browser_test.py - renders HTML reports in headless Chromium.

For every report given it
  1. checks the file is self-contained: no <script>, <link>, <img>, <iframe>,
     no src=/href= attributes, no url(...) or @import in CSS, and that every
     inline <svg> is well-formed XML;
  2. opens it in Debian's chromium (--headless --no-sandbox --disable-gpu, a
     fresh --user-data-dir, name resolution disabled) with console logging on
     stderr, and fails on any console message (the report has no scripts, so
     any message, "Uncaught ..." included, is an error);
  3. takes a 1400x3000 screenshot, decodes the PNG (zlib + struct, no PIL)
     and fails when it is blank: too few non-background pixels or too few
     distinct colours.
Before that it proves both detectors work on this machine: a copy of the
first report with an injected `throw` must be caught as a console error, and
an empty page must be judged blank. Exit 77 (CTest: skipped) when chromium is
missing.

usage: browser_test.py [--screenshot-dir DIR] REPORT.html ...
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

SKIP = 77
WINDOW = (1400, 3000)


def find_chromium():
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def check_self_contained(path):
    """Returns a list of problems with the file's self-containment."""
    html = open(path, encoding="utf-8").read()
    problems = []
    for pat, what in [
        (r"<script", "a <script> element"),
        (r"<link", "a <link> element"),
        (r"<img", "an <img> element"),
        (r"<iframe", "an <iframe> element"),
        (r"<object|<embed", "an embedded object"),
        (r"\s(src|href)\s*=", "a src/href attribute"),
        (r"url\(", "a CSS url()"),
        (r"@import", "a CSS @import"),
    ]:
        if re.search(pat, html, re.I):
            problems.append("contains %s" % what)
    svgs = re.findall(r"<svg\b.*?</svg>", html, re.S)
    if not svgs:
        problems.append("no inline <svg> plot")
    for i, svg in enumerate(svgs):
        try:
            ET.fromstring(svg)
        except ET.ParseError as e:
            problems.append("svg #%d is not well-formed XML: %s" % (i, e))
    return problems, len(svgs)


def run_chromium(chromium, html_path, png_path, size=WINDOW):
    """Renders html_path; returns (returncode, console lines, stderr)."""
    with tempfile.TemporaryDirectory(prefix="ampprobe-chromium-") as profile:
        cmd = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu",
            "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars",
            "--no-first-run", "--window-size=%d,%d" % size,
            "--screenshot=" + png_path, "file://" + os.path.abspath(html_path),
        ]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120)
    err = p.stderr.decode("utf-8", "replace")
    console = [l for l in err.splitlines()
               if ":CONSOLE" in l or "Uncaught" in l]
    return p.returncode, console, err


def decode_png(path):
    """Decodes an 8-bit non-interlaced PNG (RGB/RGBA/grey). Returns
    (width, height, channels, rows) with rows a list of bytes."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or interlace != 0 or ctype not in (0, 2, 4, 6):
                raise ValueError("unsupported PNG (depth %d, type %d)" %
                                 (depth, ctype))
            ch = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = w * ch
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        f = raw[i]
        line = bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - ch] if x >= ch else 0
            b = prev[x]
            c = prev[x - ch] if x >= ch else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + ((a + b) >> 1)) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pr) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, ch, rows


def screenshot_stats(path, step=2):
    """(fraction of non-background pixels, distinct colours), sampling every
    `step`-th pixel of every `step`-th row. Background: near-white."""
    w, h, ch, rows = decode_png(path)
    colours, ink, total = set(), 0, 0
    for y in range(0, h, step):
        row = rows[y]
        for x in range(0, w, step):
            px = row[x * ch:x * ch + min(ch, 3)]
            if ch < 3:
                px = bytes([px[0]] * 3)
            colours.add(px)
            total += 1
            if min(px) < 235:
                ink += 1
    return ink / max(total, 1), len(colours)


def not_blank(ink, colours):
    return ink > 0.03 and colours > 24


def main(argv):
    shots = None
    if len(argv) > 2 and argv[1] == "--screenshot-dir":
        shots = argv[2]
        argv = [argv[0]] + argv[3:]
    reports = argv[1:]
    if not reports:
        print(__doc__)
        return 2
    failures = 0
    for r in reports:
        problems, nsvg = check_self_contained(r)
        for p in problems:
            print("FAIL %s: %s" % (r, p))
        failures += len(problems)
        if not problems:
            print("ok   %s: self-contained, %d well-formed inline SVG" %
                  (r, nsvg))

    chromium = find_chromium()
    if not chromium:
        print("SKIP: chromium not found (scripts/install-deps.sh installs it); "
              "static checks %s" % ("failed" if failures else "passed"))
        return 1 if failures else SKIP

    work = tempfile.mkdtemp(prefix="ampprobe-browser-")
    try:
        # negative test 1: an injected error must be caught
        bad = os.path.join(work, "injected.html")
        html = open(reports[0], encoding="utf-8").read()
        html = html.replace("</body>", "<script>throw new Error("
                            "'ampprobe-negative-test')</script></body>", 1)
        open(bad, "w", encoding="utf-8").write(html)
        rc, console, err = run_chromium(chromium, bad,
                                        os.path.join(work, "injected.png"))
        if not any("ampprobe-negative-test" in l for l in console):
            print("FAIL: an injected script error was not caught; the console "
                  "detection does not work with this chromium:\n" + err[-2000:])
            return 1
        print("ok   negative test: injected error caught (%s)" %
              console[0].strip()[-90:])
        # negative test 2: an empty page must be judged blank
        empty = os.path.join(work, "empty.html")
        open(empty, "w").write("<!DOCTYPE html><html><body></body></html>")
        epng = os.path.join(work, "empty.png")
        run_chromium(chromium, empty, epng)
        ink, ncol = screenshot_stats(epng, step=4)
        if not_blank(ink, ncol):
            print("FAIL: an empty page was not judged blank (%.3f ink, %d "
                  "colours)" % (ink, ncol))
            return 1
        print("ok   negative test: empty page judged blank (%.4f ink, %d "
              "colours)" % (ink, ncol))

        for r in reports:
            png = os.path.join(shots or work,
                               os.path.splitext(os.path.basename(r))[0] + ".png")
            rc, console, err = run_chromium(chromium, r, png)
            if rc != 0 or not os.path.exists(png):
                print("FAIL %s: chromium exit %d, no screenshot:\n%s" %
                      (r, rc, err[-2000:]))
                failures += 1
                continue
            for l in console:
                print("FAIL %s: console: %s" % (r, l.strip()))
            failures += len(console)
            ink, ncol = screenshot_stats(png)
            ok = not_blank(ink, ncol)
            print("%s %s: %d console messages; screenshot %s: %.1f%% ink, %d "
                  "colours" % ("ok  " if ok and not console else "FAIL", r,
                               len(console), png, 100 * ink, ncol))
            failures += 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
