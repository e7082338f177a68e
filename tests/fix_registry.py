"""Helpers for the Kafka sink's registry formats (imported by their tests, no fixtures): a
PostgreSQL pipeline writing one table to a Kafka topic exactly_once in `format: avro |
json_schema | protobuf`, its schemas in the control service's own registry, and Confluent's
`SchemaRegistryClient` on that registry."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from tailrace.devservers import free_port
from tests.fix_sinks import read_kafka


class RegistryRun:
    """`create`: the table's statements (`orders`, its `big` column stored TOASTed)."""

    def __init__(self, pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any, fmt: str,
                 create: str) -> None:
        self.pg_db, self.kafka = pg_db, noida_kafka
        self.sql(create, "ALTER TABLE orders ALTER COLUMN big SET STORAGE EXTERNAL")
        http_port = free_port()
        self.topic = f"{fmt[:2]}{uuid.uuid4().hex[:6]}.orders"
        self.pipeline = pg_redis_pipeline(
            tables="[public.orders]", control_args=("--http-port", str(http_port)),
            sink=f'{{id: k1, type: kafka, brokers: "{noida_kafka.bootstrap}", '
                 f'topic: "{self.topic}", exactly_once: true, envelope: debezium, '
                 f'format: {fmt}, schema_registry: {{url: "http://127.0.0.1:{http_port}", '
                 'token_file: "@SERVICE_TOKEN_FILE@"}}',
            extra="  journal: {enabled: true}\n")
        self.pipeline.start_all()
        token = self.pipeline.service_token_file.read_text().strip()
        self.conf = {"url": f"http://127.0.0.1:{http_port}",
                     "basic.auth.user.info": f"tailrace:{token}"}
        self.registry = self.client()
        self.subject = f"{self.topic}-value"

    def client(self) -> SchemaRegistryClient:
        """A new one: Confluent's client caches a schema by id whatever format it asked."""
        return SchemaRegistryClient(self.conf)

    def sql(self, *statements: str) -> None:
        with psycopg.connect(self.pg_db, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def received(self) -> list[Any]:
        known = AdminClient({"bootstrap.servers": self.kafka.bootstrap}).list_topics(timeout=10)
        return read_kafka(self.kafka.bootstrap, [self.topic]) if self.topic in known.topics \
            else []

    def wait_for(self, count: int, what: str) -> list[Any]:
        self.pipeline.wait_for(lambda: len(self.received()) >= count, 240, what)
        return self.received()

    def decoded(self, messages: list[Any], keys: Callable[..., Any], values: Callable[..., Any]
                ) -> list[tuple[Any, Any]]:
        """(key, value) of each message by Confluent's deserializers; a tombstone's value
        None."""
        return [(keys(m.key(), SerializationContext(self.topic, MessageField.KEY)),
                 None if m.value() is None else values(
                     m.value(), SerializationContext(self.topic, MessageField.VALUE)))
                for m in messages]

    def refused(self, count: int, versions: list[int]) -> str:
        """Once `count` records are in: the one event in the DLQ, refused by the registry
        (409), the subject still at `versions`, the pipeline running; its reason."""
        self.wait_for(count, "the record after the refused one")
        [dead] = self.pipeline.control_client().dlq_list(self.pipeline.spec_path.stem)
        assert "refused the schema" in dead.reason and "409" in dead.reason, dead.reason
        assert self.registry.get_versions(self.subject) == versions
        self.pipeline.assert_running()
        return str(dead.reason)
