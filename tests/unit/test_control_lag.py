"""Sink lag against the latest epoch: bus records, source seconds, WAL bytes (PostgreSQL) or
transactions (MySQL/MariaDB)."""

from __future__ import annotations

from tailrace.proto import control_pb2 as pb
from tailrace_services.control.lag import SinkLag, sink_lag


def pg_epoch(epoch_id: int, lsn: int, offset: int, ts_ms: int, source_ms: int = 0) -> pb.Epoch:
    e = pb.Epoch(source_id="s", epoch_id=epoch_id, ts_unix_ms=ts_ms, source_ts_unix_ms=source_ms)
    e.position.tx_seq = (1 << 48) | lsn
    e.position.postgres.commit_lsn = lsn
    e.end_offsets[0] = offset
    return e


def checkpoint_at(epoch: pb.Epoch) -> pb.Checkpoint:
    cp = pb.Checkpoint(sink_id="k", version=1)
    cp.position.CopyFrom(epoch.position)
    cp.bus_offsets.update(epoch.end_offsets)
    return cp


HISTORY = [pg_epoch(1, 0x1000, 10, 1_000, 900), pg_epoch(2, 0x3000, 20, 31_000, 30_900),
           pg_epoch(3, 0x9000, 35, 61_000, 60_950)]


def test_postgres_lag_is_wal_bytes_and_source_seconds():
    lag = sink_lag(checkpoint_at(HISTORY[0]), HISTORY[-1], HISTORY, "postgres")
    assert lag == SinkLag(offsets=25, seconds=60.05, bytes=0x8000, transactions=None)


def test_caught_up_is_zero_in_every_unit():
    assert sink_lag(checkpoint_at(HISTORY[-1]), HISTORY[-1], HISTORY, "postgres") == \
        SinkLag(bytes=0)
    assert sink_lag(None, None, [], "postgres") == SinkLag()


def test_a_sink_without_checkpoint_lags_at_least_from_the_oldest_epoch():
    lag = sink_lag(None, HISTORY[-1], HISTORY, "postgres")
    assert (lag.offsets, lag.bytes, lag.seconds) == (35, 0x8000, 60.05)
    reset = pb.Checkpoint(sink_id="k", version=4, rewind=1)  # `tailrace rewind --reset`
    assert sink_lag(reset, HISTORY[-1], HISTORY, "postgres") == lag


def test_capture_time_when_the_source_time_is_unknown():
    old = [pg_epoch(1, 0x10, 1, 5_000), pg_epoch(2, 0x20, 2, 12_500)]
    assert sink_lag(checkpoint_at(old[0]), old[1], old, "postgres").seconds == 7.5


def test_mysql_lag_counts_transactions():
    def epoch(epoch_id: int, tx_seq: int, offset: int) -> pb.Epoch:
        e = pb.Epoch(source_id="m", epoch_id=epoch_id, ts_unix_ms=epoch_id * 1000)
        e.position.tx_seq = tx_seq
        e.position.mysql.gtid_set = f"0-1-{tx_seq}"
        e.end_offsets[0] = offset
        return e

    history = [epoch(1, 5, 10), epoch(2, 12, 30)]
    lag = sink_lag(checkpoint_at(history[0]), history[1], history, "mysql")
    assert lag == SinkLag(offsets=20, seconds=1.0, bytes=None, transactions=7)
    assert sink_lag(None, history[1], history, "mysql").transactions == 12
