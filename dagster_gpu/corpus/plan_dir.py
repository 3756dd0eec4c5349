"""A plan directory: small JSON files that save the step workers work (shard plans, file group plans).

The directory is a local path or an fsspec URL (``s3://bucket/prefix``). What it holds is only a saving, never a
source of truth: a file that is absent, unreadable or not JSON reads as None and the caller does the work again.
Writes replace a file whole: a temp file and a rename on a local disk, one PUT (fsspec ``pipe_file``) on an
object store, so a reader sees the old content or the new one, never a part.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any, Mapping

from dagster_gpu.core.jsonfile import write_atomic


class PlanDir:
    """The plan directory at ``url`` (a local path, or an fsspec URL read and written with ``storage_options``)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self._fs = None

    @property
    def local(self) -> bool:
        """Whether the directory is a local path (no ``://``)."""
        return "://" not in self.url

    def _remote(self):
        """(fsspec filesystem, root path) of a URL directory, made once."""
        if self._fs is None:
            import fsspec

            fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._fs = (fs, root.rstrip("/"))
        return self._fs

    def read(self, name: str) -> Any | None:
        """The parsed JSON of file ``name``, or None when it is absent, unreadable or not JSON (never raises for
        those: OSError, ValueError; a store's own errors, e.g. botocore's, as well)."""
        try:
            if self.local:
                return json.loads(Path(self.url, name).read_text())
            fs, root = self._remote()
            return json.loads(fs.cat_file(posixpath.join(root, name)))
        except Exception:  # noqa: BLE001 - absent, unreadable or not ours: the caller does the work again
            return None

    def write(self, name: str, doc: Any) -> None:
        """Replace file ``name`` with ``doc`` as JSON, atomically (see the module doc). Raises TypeError/ValueError
        for a ``doc`` JSON cannot hold, OSError (or the store's own error) when the directory cannot be written."""
        data = json.dumps(doc, separators=(",", ":"))
        if self.local:
            write_atomic(Path(self.url, name), data, 0o644)
            return
        fs, root = self._remote()
        fs.pipe_file(posixpath.join(root, name), data.encode())  # one PUT: whole or absent

    def delete(self, name: str) -> None:
        """Remove file ``name`` (one unlink, one DELETE); an absent file is not an error. Raises OSError (or the
        store's own error) when it cannot be removed."""
        if self.local:
            Path(self.url, name).unlink(missing_ok=True)
            return
        fs, root = self._remote()
        try:
            fs.rm_file(posixpath.join(root, name))
        except FileNotFoundError:
            pass


__all__ = ["PlanDir"]
