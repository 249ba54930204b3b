"""The batches' state on disk under `--batch-dir`/batches, which a restarted server resumes.

Per batch, two entries:
- `<id>.json`: its `BatchObject` (status, timestamps, file ids), rewritten whole and atomically
  (`write_atomic`) at each change of status;
- `<id>.done.jsonl`: append-only, one `OutputLine` per finished input line, written as the line
  finishes and before the runner counts it.

Invariant: a line is in `done.jsonl` at most once, and is never run again once it is there: a
restarted runner skips every custom_id it finds (a crash mid-append leaves a torn last line,
which is dropped, so that line runs again, once). The request counts are derived from the
done lines, not stored, so they cannot disagree with them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from trio_llm.http.batch.files import write_atomic
from trio_llm.http.batch.protocol import BatchObject, OutputLine

log = logging.getLogger(__name__)

_decode_line = msgspec.json.Decoder(OutputLine).decode


class BatchStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "batches"
        self.root.mkdir(parents=True, exist_ok=True)
        self._batches: dict[str, BatchObject] = {}
        for path in self.root.glob("batch_*.json"):
            batch = msgspec.json.decode(path.read_bytes(), type=BatchObject)
            self._batches[batch.id] = batch

    def save(self, batch: BatchObject) -> None:
        """Record `batch` (new, or changed) in memory and on disk."""
        self._batches[batch.id] = batch
        write_atomic(self.root / f"{batch.id}.json", msgspec.json.encode(batch))

    def get(self, batch_id: str) -> BatchObject | None:
        return self._batches.get(batch_id)

    def list(self) -> list[BatchObject]:
        """Newest first, as OpenAI lists them (ids sort by creation: `sortable_id`)."""
        return sorted(self._batches.values(), key=lambda b: b.id, reverse=True)

    def oldest_first(self) -> list[BatchObject]:
        return self.list()[::-1]

    def append_done(self, batch_id: str, line: OutputLine) -> None:
        """Record one finished line (flushed, so a killed process keeps it)."""
        with open(self._done(batch_id), "ab") as f:
            f.write(msgspec.json.encode(line) + b"\n")

    def done(self, batch_id: str) -> dict[str, OutputLine]:
        """The finished lines by custom_id, in the order they finished."""
        try:
            raw = self._done(batch_id).read_bytes()
        except FileNotFoundError:
            return {}
        if raw and not raw.endswith(b"\n"):  # torn by a crash mid-append: cut it off, so
            cut = raw.rfind(b"\n") + 1  # the next append starts a line of its own
            log.warning("batch %s: dropping a torn finished line (it runs again)", batch_id)
            with open(self._done(batch_id), "r+b") as f:
                f.truncate(cut)
            raw = raw[:cut]
        lines: dict[str, OutputLine] = {}
        for text in raw.splitlines():
            try:
                line = _decode_line(text)
            except msgspec.DecodeError:
                log.warning("batch %s: dropping an unreadable finished line", batch_id)
                continue
            lines.setdefault(line.custom_id, line)
        return lines

    def _done(self, batch_id: str) -> Path:
        return self.root / f"{batch_id}.done.jsonl"
