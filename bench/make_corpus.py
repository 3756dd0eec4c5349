"""Generate an N-file corpus from the Debian fortune records (about R records a file).

    .venv/bin/python bench/make_corpus.py DIR [--files 1000] [--records 20]

Records are taken in order from every fortune data file (``%``-separated), cycling when N × R exceeds them;
file names are ``f00000.txt`` … so partition keys equal file names. Prints the number of files and records.
"""

from __future__ import annotations

import argparse
from pathlib import Path

FORTUNES = Path("/usr/share/games/fortunes")


def fortune_records() -> list[str]:
    """Every non-blank record of the fortune data files (not the ``.dat`` indexes or ``.u8`` links), in name order."""
    recs: list[str] = []
    for p in sorted(FORTUNES.iterdir()):
        if p.is_symlink() or not p.is_file() or p.suffix in (".dat", ".u8"):
            continue
        text = p.read_bytes().decode("utf-8", errors="replace")
        recs += [r.strip("\n") for r in text.split("\n%\n") if r.strip()]
    return recs


def make_corpus(dest: Path, files: int = 1000, records: int = 20) -> tuple[int, int]:
    """Write ``files`` files of ``records`` records each under ``dest``; returns (files, records)."""
    recs = fortune_records()
    if not recs:
        raise FileNotFoundError(f"no fortune records under {FORTUNES}: apt-get install fortunes")
    dest.mkdir(parents=True, exist_ok=True)
    width = max(5, len(str(files - 1)))
    for i in range(files):
        chunk = [recs[(i * records + j) % len(recs)] for j in range(records)]
        (dest / f"f{i:0{width}d}.txt").write_text("\n%\n".join(chunk) + "\n", encoding="utf-8")
    return files, files * records


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--records", type=int, default=20)
    a = ap.parse_args()
    n, r = make_corpus(a.dest, a.files, a.records)
    print(f"{n} files, {r} records under {a.dest}")
