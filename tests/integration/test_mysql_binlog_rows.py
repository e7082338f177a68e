"""Rows read in C from a rows event's bytes (`_cwire.binlog_rows`) against a real MariaDB: the
same serialized Rows as the binlog library's values through `RowDecoder.row_bytes`, for every
column type it reads, their edges included; the library decodes what it does not read."""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tailrace.devservers import MariaDBServer
from tailrace_services.capture_mysql.gtid import MariadbGtidPosition
from tailrace_services.capture_mysql.reader import BinlogStream, RowChange, row_images
from tailrace_services.capture_mysql.schema import TypeHints, shape_from_table_map
from tailrace_services.capture_mysql.values import MYSQL_LATIN1, RowDecoder

pytestmark = pytest.mark.integration

_COLUMNS = """
    id int PRIMARY KEY,
    ti tinyint, tiu tinyint unsigned, si smallint, siu smallint unsigned,
    mi mediumint, miu mediumint unsigned, i int, iu int unsigned, bi bigint, biu bigint unsigned,
    f float, d double,
    dec1 decimal(12,2), dec2 decimal(30,10), dec3 decimal(10,8), dec4 decimal(4,4),
    dec5 decimal(65,30), dec6 decimal(5,0), dec7 decimal(18,9),
    dt date, dtm datetime, dtm6 datetime(6), dtm3 datetime(3), dtm1 datetime(1),
    ts timestamp(6) NULL DEFAULT NULL, ts0 timestamp NULL DEFAULT NULL,
    tm time, tm6 time(6), tm1 time(1), y year,
    vc varchar(50), vcl varchar(300), ch char(10), lat varchar(20) CHARACTER SET latin1,
    bin binary(8), vb varbinary(20), tx text, mtx mediumtext, bl blob, lbl longblob,
    e enum('a','b','cé'), s set('x','y','z'), b1 bit(1), b10 bit(10), b64 bit(64),
    u uuid, j json
"""
_EDGES: list[dict[str, Any]] = [
    {},  # every column NULL
    {"ti": -128, "tiu": 255, "si": -32768, "siu": 65535, "mi": -8388608, "miu": 16777215,
     "i": -2147483648, "iu": 4294967295, "bi": -2**63, "biu": 2**64 - 1,
     "f": 3.4e38, "d": 1e308, "dec1": "-9999999999.99", "dec2": "-12345678901234567890.0123456789",
     "dec3": "0.00000001", "dec4": "-0.9999", "dec5": "-" + "9" * 35 + "." + "9" * 30,
     "dec6": "-99999", "dec7": "0.000000001",
     "dt": "0000-00-00", "dtm": "0000-00-00 00:00:00", "dtm6": "1000-01-01 00:00:00.000001",
     "dtm3": "9999-12-31 23:59:59.999", "dtm1": "1969-12-31 23:59:59.9",
     "ts": "1970-01-01 00:00:01.000001", "ts0": "2038-01-19 03:14:07",
     "tm": "838:59:59", "tm6": "00:00:00.000001", "tm1": "12:34:56.7", "y": "0000",
     "vc": "", "vcl": "é" * 300, "ch": "a", "lat": "café €", "bin": b"ab", "vb": b"\x00\xff",
     "tx": "💡 text", "mtx": "m" * 70000, "bl": b"", "lbl": bytes(range(256)) * 4,
     "e": "cé", "s": "", "b1": 1, "b10": 0b1010101010, "b64": 2**64 - 1,
     "u": "00000000-0000-0000-0000-000000000000", "j": '{"a": [1, 2.5, "é"], "b": null}'},
    {"ti": 127, "bi": 2**63 - 1, "biu": 2**63, "f": -0.0, "d": -2.5, "dec1": "0", "dec2": "0",
     "dec3": "0", "dec4": "0", "dec5": "0", "dec6": "0", "dec7": "-0.000000010",
     "dt": "1000-01-01", "dtm": "2024-02-29 12:00:00", "dtm6": "2024-05-06 07:08:09",
     "y": "1901", "e": "a", "s": "x,z", "b1": 0, "b10": 0, "b64": 0, "bin": b"12345678",
     "dtm3": "1970-01-01 00:00:00", "lat": "\x81\x8d\x8f\x90\x9d €"},
    {"f": 1.1, "dec3": "0.00000010", "dec1": "0.05", "dtm6": "2024-02-30 10:00:00", "y": "2155",
     "s": "x,y,z", "e": "b", "d": 0.1, "vc": "tab\there"},
]


def _random_row(rng: random.Random) -> dict[str, Any]:
    def decimal(precision: int, scale: int) -> str:
        whole = rng.randrange(10 ** (precision - scale)) if precision > scale else 0
        frac = f"{rng.randrange(10 ** scale):0{scale}d}" if scale else ""
        return f"{rng.choice(['', '-'])}{whole}" + (f".{frac}" if frac else "")

    row: dict[str, Any] = {
        "ti": rng.randint(-128, 127), "tiu": rng.randint(0, 255), "si": rng.randint(-32768, 32767),
        "mi": rng.randint(-8388608, 8388607), "miu": rng.randint(0, 16777215),
        "i": rng.randint(-2**31, 2**31 - 1), "iu": rng.randint(0, 2**32 - 1),
        "bi": rng.randint(-2**63, 2**63 - 1), "biu": rng.randint(0, 2**64 - 1),
        "f": rng.uniform(-1e6, 1e6), "d": rng.uniform(-1e12, 1e12),
        "dec1": decimal(12, 2), "dec2": decimal(30, 10), "dec3": decimal(10, 8),
        "dec4": decimal(4, 4), "dec5": decimal(65, 30), "dec6": decimal(5, 0),
        "dec7": decimal(18, 9),
        "dt": f"{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "dtm6": f"{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
                f".{rng.randrange(10**6):06d}",
        "dtm3": f"2001-02-03 04:05:06.{rng.randrange(1000):03d}",
        "ts": f"{rng.randint(1971, 2037)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
              f"01:02:03.{rng.randrange(10**6):06d}",
        "tm6": f"{rng.randint(0, 838)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
               f".{rng.randrange(10**6):06d}",
        "y": rng.randint(1901, 2155),
        "vc": "".join(rng.choice("aé€💡z ") for _ in range(rng.randint(0, 50))),
        "ch": "".join(rng.choice("abc") for _ in range(rng.randint(0, 10))),
        "lat": "".join(rng.choice("aéü") for _ in range(rng.randint(0, 20))),
        "bin": rng.randbytes(rng.randint(0, 8)), "vb": rng.randbytes(rng.randint(0, 20)),
        "tx": "t" * rng.randint(0, 300), "bl": rng.randbytes(rng.randint(0, 300)),
        "e": rng.choice(["a", "b", "cé"]), "s": ",".join(rng.sample("xyz", rng.randint(0, 3))),
        "b1": rng.randint(0, 1), "b10": rng.randint(0, 1023), "b64": rng.randint(0, 2**64 - 1),
        "u": str(uuid.UUID(int=rng.getrandbits(128))),
        "j": f'{{"n": {rng.randint(0, 99)}}}',
    }
    for name in rng.sample(sorted(row), 5):
        row[name] = None
    return row


_LAX = "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'"  # zero and invalid dates, truncation


def _insert(server: MariaDBServer, db: str, table: str, rows: list[dict[str, Any]],
            first: int = 0) -> None:
    conn = server.connect(db)
    with conn.cursor() as cur:
        cur.execute(_LAX)
        for index, row in enumerate(rows, first):
            names = ["id", *row]
            values = [index, *row.values()]
            cur.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES "
                        f"({', '.join(['%s'] * len(names))})", values)
    conn.close()


def _rows_events(server: MariaDBServer, start: MariadbGtidPosition) -> Iterator[Any]:
    stream = BinlogStream(server.connect_kwargs(), replica_server_id=4343, start=start,
                          blocking=False)
    try:
        for item in stream.items():
            if isinstance(item, RowChange):
                yield item.event
    finally:
        stream.close()


@functools.cache
def _hints(server: MariaDBServer, database: str, table: str) -> dict[str, str]:
    """The table's catalog hints, read once per table (as capture keeps them)."""
    conn = server.connect(database)
    try:
        return TypeHints("mariadb").get(conn, database, table)
    finally:
        conn.close()


def _decoder(server: MariaDBServer, event: Any) -> RowDecoder:
    hints = _hints(server, event.schema, event.table)
    shape = shape_from_table_map(event.schema, event.table, event.columns, hints)
    return RowDecoder(shape, event.columns)


@pytest.fixture
def db(mariadb_server: MariaDBServer) -> str:
    name = f"r_{uuid.uuid4().hex[:10]}"
    mariadb_server.create_database(name)
    return name


def _start(server: MariaDBServer) -> MariadbGtidPosition:
    return MariadbGtidPosition.parse(server.execute("SELECT @@gtid_binlog_pos")[0][0])


def test_rows_read_in_c_are_the_library_rows_for_every_type_it_reads(
        mariadb_server: MariaDBServer, db: str) -> None:
    mariadb_server.execute(f"CREATE TABLE {db}.allt ({_COLUMNS})")
    start = _start(mariadb_server)
    rng = random.Random(20261130)
    rows = _EDGES + [_random_row(rng) for _ in range(300)]
    _insert(mariadb_server, db, "allt", rows)
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:  # multi-row events: before and after images, deletes
        cur.execute(_LAX)
        cur.execute("UPDATE allt SET vc = CONCAT(COALESCE(vc, ''), 'é'), dec1 = -dec1, "
                    "s = 'y', biu = 2 WHERE id % 3 = 0")
        cur.execute("DELETE FROM allt WHERE id % 4 = 1")
    conn.close()

    read_in_c = compared = 0
    for event in _rows_events(mariadb_server, start):
        if event.schema != db:
            continue
        decoder = _decoder(mariadb_server, event)
        assert decoder.plan is not None, "every column of this table is one C reads"
        where = row_images(event)
        assert where is not None
        images = decoder.images(*where)
        expected = decoder.library_images(event)  # the reference
        compared += len(expected)
        if images is None:
            continue
        read_in_c += len(images)
        for got, want in zip(images, expected, strict=True):
            assert got == want
    assert compared == len(rows) + 2 * len(range(0, len(rows), 3)) + len(range(1, len(rows), 4))
    assert read_in_c == compared, "no value of these rows needs the library"


def test_set_members_and_charsets_python_has_no_codec_for(
        mariadb_server: MariaDBServer, db: str) -> None:
    """The library names a SET label it cannot read '' and keeps members in a Python set;
    it hands '' (text) for an empty value of a charset without a Python codec, else bytes."""
    mariadb_server.execute(f"CREATE TABLE {db}.s (id int PRIMARY KEY, a set('','a'), "
                           "b set('é','a') CHARACTER SET latin1)")
    mariadb_server.execute(f"CREATE TABLE {db}.d (id int PRIMARY KEY, "
                           "c set('é','ü','a') CHARACTER SET latin1)")
    mariadb_server.execute(f"CREATE TABLE {db}.u (id int PRIMARY KEY, "
                           "u varchar(10) CHARACTER SET ucs2)")
    start = _start(mariadb_server)
    _insert(mariadb_server, db, "s", [{"a": ",a", "b": "é,a"}, {"a": "", "b": "a"}])
    _insert(mariadb_server, db, "d", [{"c": "é,ü,a"}])
    _insert(mariadb_server, db, "u", [{"u": ""}, {"u": "x"}])
    by_table: dict[str, list[Any]] = {}
    for event in _rows_events(mariadb_server, start):
        if event.schema == db:
            by_table.setdefault(event.table, []).append(event)
    for event in by_table["s"]:
        decoder = _decoder(mariadb_server, event)
        where = row_images(event)
        assert where is not None
        assert decoder.images(*where) == decoder.library_images(event)
    assert _decoder(mariadb_server, by_table["d"][0]).plan is None  # labels '' twice
    assert _decoder(mariadb_server, by_table["u"][0]).plan is None  # no ucs2 codec


def test_latin1_text_is_read_as_the_server_converts_it(mariadb_server: MariaDBServer) -> None:
    """MySQL's latin1 is not Python's cp1252: its five undefined bytes are C1 controls."""
    every = bytes(range(256))
    (text,) = mariadb_server.execute(
        "SELECT CONVERT(CAST(UNHEX(%s) AS CHAR CHARACTER SET latin1) USING utf8mb4)",
        (every.hex(),))[0]
    assert every.decode(MYSQL_LATIN1) == text


def test_what_c_does_not_read_is_left_to_the_library(
        mariadb_server: MariaDBServer, db: str) -> None:
    """A negative TIME, a DATE the library refuses and an INET6 column: C declines (None)."""
    mariadb_server.execute(f"CREATE TABLE {db}.t (id int PRIMARY KEY, tm time(3), dt date)")
    mariadb_server.execute(f"CREATE TABLE {db}.n (id int PRIMARY KEY, a inet6)")
    start = _start(mariadb_server)
    _insert(mariadb_server, db, "t", [{"tm": "-01:02:03.5"}])
    _insert(mariadb_server, db, "t", [{"dt": "2024-02-30"}], first=1)
    mariadb_server.execute(f"INSERT INTO {db}.n VALUES (1, '::1')")
    events = [e for e in _rows_events(mariadb_server, start) if e.schema == db]
    assert [e.table for e in events] == ["t", "t", "n"]
    negative, invalid, inet = events
    decoder = _decoder(mariadb_server, negative)
    assert decoder.plan is not None
    for event in (negative, invalid):
        where = row_images(event)
        assert where is not None
        assert decoder.images(*where) is None
    assert str(negative.rows[0]["values"]["tm"]) == "-1 day, 22:57:56.500000"  # the library's
    assert _decoder(mariadb_server, inet).plan is None
