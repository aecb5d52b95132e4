#!/usr/bin/env python3
"""Make a synthetic sky survey for the Montage mosaic workflow: overlapping FITS tiles.

Usage: make-tiles.py OUTDIR [--grid 4] [--size 256] [--overlap 0.2] [--seed 1]

Writes OUTDIR/raw/tile_R_C.fits: a GRID x GRID grid of SIZE x SIZE float32 images with TAN
world coordinates (1 arcsec pixels) that overlap their neighbours by OVERLAP of their width.
The sky holds point sources at fixed sky positions, so overlaps agree; each tile adds its own
background plane and noise, so Montage's background matching has real work to do.
Standard library only (no numpy), so it runs anywhere Python 3 does.
"""

import argparse
import math
import os
import random
import struct

PIX_DEG = 1.0 / 3600.0
RA0, DEC0 = 180.0, 30.0


def card(key, value=None, comment=""):
    if value is None:
        text = f"{key:<80}"
    else:
        if isinstance(value, str):
            v = f"'{value:<8}'"
            text = f"{key:<8}= {v:<20}"
        elif isinstance(value, bool):
            text = f"{key:<8}= {('T' if value else 'F'):>20}"
        elif isinstance(value, int):
            text = f"{key:<8}= {value:>20d}"
        else:
            text = f"{key:<8}= {value:>20.12G}"
        if comment:
            text += f" / {comment}"
    return text[:80].ljust(80)


def write_fits(path, size, crval1, crval2, pixels):
    cards = [
        card("SIMPLE", True),
        card("BITPIX", -32),
        card("NAXIS", 2),
        card("NAXIS1", size),
        card("NAXIS2", size),
        card("CTYPE1", "RA---TAN"),
        card("CTYPE2", "DEC--TAN"),
        card("CRVAL1", crval1),
        card("CRVAL2", crval2),
        card("CRPIX1", (size + 1) / 2.0),
        card("CRPIX2", (size + 1) / 2.0),
        card("CDELT1", -PIX_DEG),
        card("CDELT2", PIX_DEG),
        card("CROTA2", 0.0),
        card("EQUINOX", 2000.0),
        card("BUNIT", "DN"),
        card("END"),
    ]
    header = "".join(cards)
    header += " " * (-len(header) % 2880)
    data = struct.pack(f">{len(pixels)}f", *pixels)
    data += b"\0" * (-len(data) % 2880)
    with open(path, "wb") as f:
        f.write(header.encode("ascii"))
        f.write(data)


def tan_project(ra, dec, ra0, dec0):
    """Gnomonic projection of (ra, dec) about (ra0, dec0), in degrees on the tangent plane."""
    r, d, r0, d0 = map(math.radians, (ra, dec, ra0, dec0))
    cosc = math.sin(d0) * math.sin(d) + math.cos(d0) * math.cos(d) * math.cos(r - r0)
    x = math.cos(d) * math.sin(r - r0) / cosc
    y = (math.cos(d0) * math.sin(d) - math.sin(d0) * math.cos(d) * math.cos(r - r0)) / cosc
    return math.degrees(x), math.degrees(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--grid", type=int, default=4)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--overlap", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    step_deg = a.size * (1 - a.overlap) * PIX_DEG
    span = step_deg * (a.grid - 1) + a.size * PIX_DEG
    n_stars = int(40 * a.grid * a.grid * (a.size / 256) ** 2)
    stars = [
        (
            RA0 + (rng.random() - 0.5) * span / math.cos(math.radians(DEC0)),
            DEC0 + (rng.random() - 0.5) * span,
            rng.uniform(200, 5000),
        )
        for _ in range(n_stars)
    ]
    raw = os.path.join(a.outdir, "raw")
    os.makedirs(raw, exist_ok=True)
    sigma = 1.5
    for row in range(a.grid):
        for col in range(a.grid):
            dec_c = DEC0 + (row - (a.grid - 1) / 2) * step_deg
            ra_c = RA0 + (col - (a.grid - 1) / 2) * step_deg / math.cos(math.radians(dec_c))
            bg0, gx, gy = rng.uniform(50, 150), rng.uniform(-0.05, 0.05), rng.uniform(-0.05, 0.05)
            n = a.size
            pix = [bg0 + gx * (i % n) + gy * (i // n) + rng.gauss(0, 3) for i in range(n * n)]
            c = (n + 1) / 2.0
            for ra, dec, flux in stars:
                x, y = tan_project(ra, dec, ra_c, dec_c)
                px, py = c - x / PIX_DEG - 1, c + y / PIX_DEG - 1  # 0-based pixel (RA grows left)
                if -5 < px < n + 5 and -5 < py < n + 5:
                    for yy in range(max(0, int(py) - 5), min(n, int(py) + 6)):
                        for xx in range(max(0, int(px) - 5), min(n, int(px) + 6)):
                            r2 = (xx - px) ** 2 + (yy - py) ** 2
                            pix[yy * n + xx] += flux * math.exp(-r2 / (2 * sigma * sigma))
            write_fits(os.path.join(raw, f"tile_{row}_{col}.fits"), n, ra_c, dec_c, pix)
    print(f"{a.grid * a.grid} tiles of {a.size}x{a.size} in {raw}")


if __name__ == "__main__":
    main()
