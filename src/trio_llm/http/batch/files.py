"""The uploaded and produced files of the Batch API, on disk under `--batch-dir`/files.

Each file is two entries: `<id>.data` (its bytes as given) and `<id>.json` (its `FileObject`).
The data is written first and the metadata last, each through a temporary name and
`os.replace`, so a file is listed only once its bytes are complete, and a crash leaves at worst
an orphan `.data` that nothing lists.

Every call is synchronous disk I/O: the endpoint runs them on a worker thread.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import msgspec

from trio_llm.http.batch.protocol import FileObject
from trio_llm.http.ids import now

PURPOSES = ("batch", "batch_output")
"""What this server stores files for: batch inputs, and the batches' outputs and errors."""


def sortable_id(prefix: str) -> str:
    """A new id that sorts after every id made before it in this process and earlier ones
    (microseconds, then randomness): lists page by id, newest first, as OpenAI's do."""
    return f"{prefix}{time.time_ns() // 1000:014x}{uuid.uuid4().hex[:18]}"


def write_atomic(path: Path, data: bytes) -> None:
    """`path` holds `data` or its previous content, never a part: a crash mid-write leaves the
    old file (what the store's state and the files' metadata rely on)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "files"
        self.root.mkdir(parents=True, exist_ok=True)

    def create(self, filename: str, purpose: str, data: bytes) -> FileObject:
        file = FileObject(
            id=sortable_id("file-"),
            bytes=len(data),
            created_at=now(),
            filename=filename,
            purpose=purpose,
        )
        write_atomic(self._data(file.id), data)
        write_atomic(self._meta(file.id), msgspec.json.encode(file))
        return file

    def get(self, file_id: str) -> FileObject | None:
        if not _valid_id(file_id):
            return None
        try:
            return msgspec.json.decode(self._meta(file_id).read_bytes(), type=FileObject)
        except FileNotFoundError:
            return None

    def content(self, file_id: str) -> bytes | None:
        if self.get(file_id) is None:
            return None
        return self._data(file_id).read_bytes()

    def list(self, purpose: str | None = None) -> list[FileObject]:
        """Newest first, as OpenAI lists them."""
        files = []
        for meta in self.root.glob("file-*.json"):
            try:
                files.append(msgspec.json.decode(meta.read_bytes(), type=FileObject))
            except FileNotFoundError:  # deleted while listed
                continue
        files.sort(key=lambda f: f.id, reverse=True)
        return [f for f in files if purpose is None or f.purpose == purpose]

    def delete(self, file_id: str) -> bool:
        if self.get(file_id) is None:
            return False
        self._meta(file_id).unlink(missing_ok=True)  # first: unlisted before its bytes go
        self._data(file_id).unlink(missing_ok=True)
        return True

    def _meta(self, file_id: str) -> Path:
        return self.root / f"{file_id}.json"

    def _data(self, file_id: str) -> Path:
        return self.root / f"{file_id}.data"


def _valid_id(file_id: str) -> bool:
    """Ids name files on disk: only the ones this store makes (no path separators)."""
    return file_id.startswith("file-") and file_id[5:].isalnum()
