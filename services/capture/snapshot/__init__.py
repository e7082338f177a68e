"""Snapshots: a table's current rows in key-ordered chunks, merged into the change stream
with no gap and no duplicate (docs/snapshots.md; DBLog's watermarks).

Two halves meet here:

- `SnapshotWorker` (a thread beside the stream) takes the tables to read from the
  control service's snapshot record, and per chunk: announces it to the merger
  (`SnapshotMerger.open`), has the source write a low watermark into its own log and
  read the chunk (`ChunkSource.read_chunk`), hands the rows over (`fill`), has the
  source write the high watermark, then waits for the chunk's outcome and, once the
  read transaction is in a recorded epoch (on the bus), stores the table's cursor.
- `SnapshotMerger.items` wraps a source's feed. Between a chunk's low and high
  watermark, every committed change of the chunk's table removes its key(s) from the
  chunk: the log event is at least as new as the row the chunk read. At the high
  watermark the rows left become one read transaction (`op = OP_SNAPSHOT_READ`) at
  the watermark's position, and travel like any other transaction.

A source whose commit order and visibility order can differ (PostgreSQL) also says, per
chunk, which transactions were not visible to the read (`ChunkRows.hidden`): the keys of
those the stream saw commit before the low watermark are removed as well; when such a
transaction was streamed before the merger began recording the table (its keys are not
known), the chunk is discarded and read again.

The parts: `chunks` (what a chunk and a watermark are; the source's `ChunkSource`),
`merger` (the stream side), `worker` (the reading side), `recovery` (after a restart,
which chunks made it to the bus), `progress` (the control service's snapshot record).
A connector implements `ChunkSource` in its `snapshot.py`.
"""

from tailrace_services.capture.snapshot.chunks import (
    WATERMARK_PREFIX,
    ChunkRows,
    ChunkSource,
    Key,
    ReadRow,
    TablePlan,
    Watermark,
    chunk_rows,
    key_of,
    parse_watermark,
    watermark_content,
)
from tailrace_services.capture.snapshot.merger import SnapshotMerger
from tailrace_services.capture.snapshot.progress import SnapshotProgress
from tailrace_services.capture.snapshot.worker import SnapshotWorker

__all__ = ["WATERMARK_PREFIX", "ChunkRows", "ChunkSource", "Key", "ReadRow", "SnapshotMerger",
           "SnapshotProgress", "SnapshotWorker", "TablePlan", "Watermark", "chunk_rows", "key_of",
           "parse_watermark", "watermark_content"]
