"""MkDocs hooks (``hooks:`` in mkdocs.yml): add the generated reference pages (scripts/docs/reference.py) to the
site's files before the build, so no copy of them is kept by hand."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.docs.reference import PAGES  # noqa: E402


def on_files(files, config):
    from mkdocs.structure.files import File

    for uri, make in PAGES.items():
        old = files.get_file_from_path(uri)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, uri, content=make()))
    return files
