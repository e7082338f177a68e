"""The outbox event router (issue 18 item 2) through the whole pipeline: an application writes
business rows and outbox rows in one transaction — some outbox rows deleted again in the
same transaction (Debezium's pattern: the insert is the event, the table stays small),
some updated later — and delivery, killed -9 once
midway, writes to Kafka `exactly_once`. A read_committed consumer of `outbox.event.*` sees
exactly the outbox inserts: each once, keyed by its aggregate id, its payload as written,
its id and type in headers, in order per aggregate.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from tests.fix_sinks import read_kafka

pytestmark = pytest.mark.integration

AGGREGATES = {"Order": 4, "Customer": 2}  # aggregate type: how many aggregates of it
TRANSACTIONS = 300


def write(dsn: str, first: int, count: int) -> list[dict[str, Any]]:
    """Transactions `first`.. of the application: an order row and its outbox row, which
    every fifth deletes again before it commits. The outbox inserts, in order."""
    sent = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in range(first, first + count):
            kind = "Order" if t % 3 else "Customer"
            aggregate = f"{kind.lower()}-{t % AGGREGATES[kind]}"
            event = {"id": str(uuid.uuid4()), "kind": kind, "aggregate": aggregate,
                     "payload": {"t": t, "aggregate": aggregate}}
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (%s, %s)", (t, t * 10))
                conn.execute("INSERT INTO outbox VALUES (%s, %s, %s, %s, %s)",
                             (event["id"], kind, aggregate, f"{kind}Changed",
                              json.dumps(event["payload"])))
                if t % 5 == 0:
                    conn.execute("DELETE FROM outbox WHERE id = %s", (event["id"],))
            sent.append(event)
            if t % 7 and t % 5:  # a later update of an outbox row is no event to send
                conn.execute("UPDATE outbox SET type = 'Edited' WHERE id = %s", (event["id"],))
    return sent


def outbox_pipeline(pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any, prefix: str,
                    options: str) -> Any:
    """The application's tables and a pipeline of them into Kafka exactly_once, its outbox
    processor routing to `{prefix}.outbox.event.*` with more `options`."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL)")
        conn.execute("CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, "
                     "aggregateid text NOT NULL, type text NOT NULL, payload jsonb)")
    return pg_redis_pipeline(
        tables="[public.orders, public.outbox]",
        sink=f'{{id: k1, type: kafka, brokers: "{noida_kafka.bootstrap}", '
             f'topic: "{prefix}.{{table}}", exactly_once: true}}',
        extra="  processors:\n"
              "    - {type: outbox, table: public.outbox, "
              f"route: '{prefix}.outbox.event.{{routedByValue}}', {options}}}\n")


def outbox_messages(brokers: str, prefix: str) -> list[Any]:
    """Every message of the `{prefix}.outbox.event.*` topics, read committed ([] until the
    sink made them all)."""
    topics = [f"{prefix}.outbox.event.{kind}" for kind in AGGREGATES]
    if not set(topics) <= set(AdminClient({"bootstrap.servers": brokers}).list_topics(
            timeout=10).topics):
        return []
    return read_kafka(brokers, topics)


def test_the_consumer_sees_exactly_the_outbox_inserts_once_in_order_per_aggregate(
        pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any) -> None:
    prefix = f"ob{uuid.uuid4().hex[:6]}"
    pipeline = outbox_pipeline(pg_db, pg_redis_pipeline, noida_kafka, prefix,
                               "additional_fields: {type: eventType}")
    pipeline.start_all()

    def received() -> list[Any]:
        return outbox_messages(noida_kafka.bootstrap, prefix)

    sent = write(pg_db, 0, TRANSACTIONS // 2)
    pipeline.wait_for(lambda: len(received()) >= TRANSACTIONS // 4, 240,
                      "the first outbox messages")
    pipeline.kill("delivery")  # mid-stream: the rest of the first half is yet to come
    pipeline.start("delivery")
    sent += write(pg_db, TRANSACTIONS // 2, TRANSACTIONS - TRANSACTIONS // 2)
    pipeline.wait_for(lambda: len(received()) >= len(sent), 300, "every outbox message")

    messages = received()
    ids = [dict(m.headers())["id"].decode() for m in messages]
    assert sorted(ids) == sorted(e["id"] for e in sent), "exactly the outbox inserts, once each"
    by_id = {e["id"]: e for e in sent}
    per_aggregate: dict[str, list[int]] = defaultdict(list)
    for message, event_id in zip(messages, ids, strict=True):
        event = by_id[event_id]
        headers = dict(message.headers())
        assert message.topic() == f"{prefix}.outbox.event.{event['kind']}"
        assert message.key().decode() == event["aggregate"]
        assert json.loads(message.value()) == event["payload"]
        assert headers["eventType"].decode() == f"{event['kind']}Changed"
        per_aggregate[event["aggregate"]].append(event["payload"]["t"])
    assert all(ts == sorted(ts) for ts in per_aggregate.values()), "in order per aggregate"
    business = read_kafka(noida_kafka.bootstrap, [f"{prefix}.orders"])
    assert len(business) == TRANSACTIONS, "other tables' events go on as they were"
    pipeline.assert_running()
    print(f"\n{len(sent)} outbox events in {len(per_aggregate)} aggregates ({TRANSACTIONS // 5} "
          "deleted in their own transaction), delivery killed -9 once: each once in Kafka, in "
          "order per aggregate; the later updates of outbox rows sent nothing")


def test_delivered_outbox_rows_are_deleted_from_the_source_and_only_once_delivered(
        pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any) -> None:
    """`delete_delivered: true`: delivery deletes each outbox row once Kafka (exactly_once)
    acknowledged its message. Checked while rows flow — every row gone from the table that
    the application did not delete itself has its message in Kafka, read committed — and at
    the end: the table is empty, each message once."""
    prefix = f"od{uuid.uuid4().hex[:6]}"
    pipeline = outbox_pipeline(pg_db, pg_redis_pipeline, noida_kafka, prefix,
                               "delete_delivered: true")
    pipeline.start_all()

    def received() -> list[str]:
        return [dict(m.headers())["id"].decode()
                for m in outbox_messages(noida_kafka.bootstrap, prefix)]

    def left() -> set[str]:
        with psycopg.connect(pg_db) as conn:
            return {str(r[0]) for r in conn.execute("SELECT id FROM outbox")}

    sent = write(pg_db, 0, 40)
    kept_by_app = [e["id"] for t, e in enumerate(sent) if t % 5]  # the others it deleted
    pipeline.wait_for(lambda: len(kept_by_app) - len(left()) >= 10, 240,
                      "delivery deleting the first delivered rows")
    gone = set(kept_by_app) - left()
    assert gone <= set(received()), "a row is deleted only once its message is in Kafka"
    sent += write(pg_db, 40, 40)
    pipeline.wait_for(lambda: len(received()) >= len(sent), 300, "every outbox message")
    pipeline.wait_for(lambda: not left(), 120, "every delivered outbox row deleted")
    ids = received()
    assert sorted(ids) == sorted(e["id"] for e in sent), "each outbox insert once"
    assert pipeline.log_count("delivery", "delivered outbox rows not deleted") == 0
    pipeline.assert_running()
    print(f"\n{len(sent)} outbox events: each once in Kafka; {len(gone)} rows checked deleted "
          "only after their message was there; the outbox table empty at the end")
