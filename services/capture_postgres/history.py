"""Is the WAL we re-read the history we published? Checked transaction by transaction.

On every (re)connect the slot sends again what follows its `confirmed_flush_lsn`,
which capture keeps at the checkpoint transaction's last change
(`position.confirm_point`): the checkpoint's own transaction comes again first,
then everything published after it. Transactions at or below the checkpoint are
skipped by their LSN — safe only while the WAL is the one we read before. Another
copy of the cluster (a backup restored without a new timeline, a disk snapshot, a
split brain on the same timeline number) passes every identity and slot check and
reuses our LSNs for its own transactions. So, while re-reading, `HistoryCheck`
compares the transactions we can name (`TxMark`: xid and commit time at an end
LSN) with what the server sends, before anything is published:

- a transaction that ends where one of ours ended must be ours (same xid and
  commit time);
- no transaction may span the end of ours or of our resume position (commit
  starting before, ending after): WAL records do not overlap in one history;
- a transaction the slot must send again (`Expected.required`: the slot is
  confirmed before its last change, as capture confirms it, and it is in this
  server's timeline history) must come before any transaction ending later, and
  before the server reports its WAL sent past it.

Any mismatch raises `PositionLostError` naming both transactions. The checkpoint's
transaction is verified before the first transaction is published; the latest
published one (past the checkpoint) when the re-read reaches it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tailrace.errors import PositionLostError
from tailrace.logs import get_logger
from tailrace_services.capture_postgres.connection import ServerFacts, SystemIdentity, lsn_to_str
from tailrace_services.capture_postgres.position import Resume, TxMark, commit_time

__all__ = ["Expected", "HistoryCheck", "expected_transactions"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Expected:
    """A transaction of ours the re-read may (or, when `required`, must) show again."""

    mark: TxMark
    what: str  # "our checkpoint's transaction", ...
    required: bool


def expected_transactions(resume: Resume, facts: ServerFacts | None, system: SystemIdentity
                          ) -> list[Expected]:
    """What the re-read after `resume` must show. `facts` are the checked slot and timeline
    history; None when that check failed, and then the slot is taken to be confirmed as
    capture confirms it (before the checkpoint's last change), so a slot that was recreated
    meanwhile still fails here, before anything is published."""
    candidates = []
    if resume.checkpoint is not None:
        candidates.append((resume.checkpoint, "our checkpoint's transaction"))
    if resume.latest is not None and resume.latest.end_lsn > resume.lsn:
        candidates.append((resume.latest, "the latest transaction we published"))
    ends = dict(facts.history) if facts is not None else {}
    out: list[Expected] = []
    for mark, what in candidates:
        if mark.timeline == system.timeline:
            on_this_history = True
        elif facts is not None:  # an ancestor timeline: ours up to where it ended here
            on_this_history = mark.end_lsn <= ends.get(mark.timeline, -1)
        else:  # unknown history: continuing at all means the checkpoint is in it
            on_this_history = mark is resume.checkpoint
        if not on_this_history:
            continue  # published past a switch point: lost in the failover, not to be found
        required = mark.last_change_lsn > 0 and (
            facts is None or facts.slot.confirmed_flush_lsn <= mark.last_change_lsn)
        out.append(Expected(mark, what, required))
    return out


class HistoryCheck:
    """Compares re-read transactions with `expected` ones; `resume_lsn` must not be spanned."""

    def __init__(self, resume_lsn: int, expected: list[Expected]) -> None:
        self.resume_lsn = resume_lsn
        self._pending = deque(sorted(expected, key=lambda e: e.mark.end_lsn))

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def on_commit(self, xid: int, final_lsn: int, end_lsn: int, commit_ts_us: int) -> None:
        """A transaction the server sent: its commit record starts at `final_lsn`, ends at
        `end_lsn`. Raises PositionLostError when it is not in our history."""
        theirs = (f"xid {xid} committed at {commit_time(commit_ts_us)}, its commit record "
                  f"from {lsn_to_str(final_lsn)} to {lsn_to_str(end_lsn)}")
        if final_lsn < self.resume_lsn < end_lsn:
            raise PositionLostError(
                f"this server's transaction {theirs} spans our resume position "
                f"{lsn_to_str(self.resume_lsn)}, where one of our transactions ended: its WAL "
                "is not the history we streamed from (another copy of the cluster)")
        while self._pending:
            expected = self._pending[0]
            mark = expected.mark
            if end_lsn < mark.end_lsn:
                return
            ours = f"{expected.what} ({mark.describe()})"
            if end_lsn == mark.end_lsn:
                if (xid, commit_ts_us) != (mark.xid, mark.commit_ts_us):
                    raise PositionLostError(
                        f"this server's transaction ending at {lsn_to_str(end_lsn)} is {theirs}"
                        f", not {ours}: its WAL is not the history we streamed from (another "
                        "copy of the cluster that wrote other transactions at our LSNs)")
                log.info("re-read transaction verified", what=expected.what,
                         transaction=mark.describe())
                self._pending.popleft()
                return
            if final_lsn < mark.end_lsn:
                raise PositionLostError(
                    f"this server's transaction {theirs} spans the end of {ours}: its WAL is "
                    "not the history we streamed from (another copy of the cluster)")
            self._passed(expected, f"the next transaction it sent is {theirs}")

    def on_wal_end(self, sent_lsn: int) -> None:
        """The server reports its WAL decoded and sent up to `sent_lsn` (after every message
        before that point was handled)."""
        while self._pending and self._pending[0].mark.end_lsn <= sent_lsn:
            self._passed(self._pending[0],
                         f"it has sent its WAL up to {lsn_to_str(sent_lsn)} without it")

    def _passed(self, expected: Expected, evidence: str) -> None:
        ours = f"{expected.what} ({expected.mark.describe()})"
        if expected.required:
            raise PositionLostError(
                f"{ours} was not sent again: {evidence}; the slot was recreated or advanced "
                "past it, or this server's WAL is not the history we streamed from (another "
                "copy of the cluster)")
        log.warning("could not verify a re-read transaction: the slot was not confirmed "
                    "before it, or the position check failed", what=expected.what,
                    transaction=expected.mark.describe(), evidence=evidence)
        self._pending.popleft()
