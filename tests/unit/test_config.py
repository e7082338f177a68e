"""The spec loader: every problem reported at once, naming the file and the field."""

from __future__ import annotations

import pytest

from tailrace.config import load_pipeline, parse_pipeline
from tailrace.errors import ConfigError

GOOD = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders, tenant: acme}
spec:
  source: {type: postgres, id: pg1, dsn: "${PG_DSN}", tables: [public.orders, shop.order_%]}
  sinks:
    - {id: r1, type: redis, url: "redis://:secret@127.0.0.1:6379/0"}
  bus: {brokers: "${KAFKA:-127.0.0.1:9092}"}
  batch: {max_bytes: 4MiB}
"""


def test_valid_spec_expands_env_and_fills_defaults():
    spec = parse_pipeline(GOOD, env={"PG_DSN": "postgresql://u:pw@h/db"})
    assert spec.spec.source.dsn.get_secret_value() == "postgresql://u:pw@h/db"
    assert spec.spec.bus.brokers == "127.0.0.1:9092"
    assert spec.spec.batch.max_bytes == 4 * 1024 * 1024
    assert spec.spec.commit_policy == "required"
    assert spec.bus_topic == "tailrace.orders"
    assert "pw" not in repr(spec) and "secret" not in repr(spec)


def test_bad_spec_reports_every_problem_with_its_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("""
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders}
spec:
  source: {type: postgres, id: pg1, dsn: "${UNSET_DSN_FOR_TEST}", tables: [public.orders]}
  sinks:
    - {id: r1, type: redis, url: "redis://127.0.0.1", streem: "x"}
  bus: {brokers: "127.0.0.1:9092", partitions: many}
""")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(path, env={})
    problems = exc.value.problems
    assert len(problems) == 3, problems
    assert all(p.startswith(f"{path}: ") for p in problems)
    assert any("spec.source.dsn: environment variable UNSET_DSN_FOR_TEST is not set" in p
               for p in problems)
    assert any("spec.sinks[0].streem: unknown field (did you mean 'stream'?)" in p
               for p in problems)
    assert any("spec.bus.partitions:" in p and "'many'" in p for p in problems)


def test_unknown_sink_type_and_template_dollar():
    text = GOOD.replace("type: redis", "type: rabbit")
    with pytest.raises(ConfigError, match=r"spec\.sinks\[0\]"):
        parse_pipeline(text, env={"PG_DSN": "x"})
    text = GOOD.replace('url: "redis://:secret@127.0.0.1:6379/0"',
                        'url: "redis://h", stream: "cdc.$table"')
    with pytest.raises(ConfigError, match="without '\\$'"):
        parse_pipeline(text, env={"PG_DSN": "x"})


def test_missing_required_field_and_bad_table_pattern():
    text = GOOD.replace("tables: [public.orders, shop.order_%]", "tables: [orders]")
    with pytest.raises(ConfigError, match=r"spec\.source\.tables.*db\.table"):
        parse_pipeline(text, env={"PG_DSN": "x"})
    text = GOOD.replace('  bus: {brokers: "${KAFKA:-127.0.0.1:9092}"}\n', "")
    with pytest.raises(ConfigError, match=r"spec\.bus: required field is missing"):
        parse_pipeline(text, env={"PG_DSN": "x"})


LISTS = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders}
spec:
  source: {type: postgres, id: pg1, dsn: "postgresql://h/db",
           tables: [public.orders, "public orders", "shop .x"]}
  sinks:
    - {id: r1, type: redis, url: "redis://h"}
    - {id: k1, type: kafka, brokers: "h:9092", exactly_onec: true}
    - {id: p1, type: postgres, dsn: "postgresql://h/db", folow_ddl: true}
  processors:
    - {type: filter, where: "op != 'delete'"}
    - {type: transform, renam: {a: b}}
    - {type: route, too: "x.{table}"}
  bus: {brokers: "h:9092"}
"""


def test_a_typo_in_a_later_list_item_names_that_item_and_its_fields():
    with pytest.raises(ConfigError) as exc:
        parse_pipeline(LISTS, source="s.yaml", env={})
    problems = exc.value.problems
    print("\n".join(problems))
    expected = {
        "spec.sinks[1].exactly_onec": "did you mean 'exactly_once'?",
        "spec.sinks[2].folow_ddl": "did you mean 'follow_ddl'?",
        "spec.processors[1].renam": "did you mean 'rename'?",
        "spec.processors[2].too": "did you mean 'to'?",
        "spec.processors[2].to": "required field is missing",
        "spec.source.tables[1]": "'public orders' is not a table pattern",
        "spec.source.tables[2]": "'shop .x' is not a table pattern",
    }
    for field, hint in expected.items():
        assert any(p.startswith(f"s.yaml: {field}: ") and hint in p for p in problems), field
    # each item's allowed fields are its own model's, not the first item's
    kafka = next(p for p in problems if "exactly_onec" in p)
    assert "brokers" in kafka and "stream" not in kafka
    route = next(p for p in problems if ".too:" in p)
    assert "allowed: to, type" in route
    assert len(problems) == len(expected), problems


# -- everything the spec accepts is checked at load, and nothing is accepted to be ignored ---

BASE = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders}
spec:
  source: {type: postgres, id: pg1, dsn: "postgresql://h/db", tables: [public.orders]}
  sinks:
    - {id: r1, type: redis, url: "redis://h"}
  bus: {brokers: "h:9092"}
"""


def problems_of(extra: str, sinks: str = "") -> list[str]:
    text = BASE.replace('    - {id: r1, type: redis, url: "redis://h"}\n',
                        '    - {id: r1, type: redis, url: "redis://h"}\n' + sinks) + extra
    with pytest.raises(ConfigError) as exc:
        parse_pipeline(text, source="s.yaml", env={})
    print("\n".join(exc.value.problems))
    return exc.value.problems


def test_a_bad_processor_expression_and_a_bad_ttl_are_refused_naming_file_and_field(tmp_path):
    path = tmp_path / "orders.yaml"
    path.write_text(BASE + """\
  processors:
    - {type: filter, where: "op != 'delete'"}
    - {type: filter, where: "amount >>> AND"}
    - {type: transform, set: {total: "price * qty", day: "date_format(ts, 'yyyy-MM-dd')"}}
  journal: {enabled: true, ttl: 7 days}
""")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(path, env={})
    problems = exc.value.problems
    assert len(problems) == 3, problems
    where, day, ttl = problems
    assert where.startswith(f"{path}: spec.processors[1].where: not a valid Spark SQL "
                            "expression 'amount >>> AND': Required keyword: 'expression'")
    assert day.startswith(f"{path}: spec.processors[2].set.day: not supported by the processor "
                          "evaluator (sqlglot's Python executor has no TIMETOSTR): DATE_FORMAT(")
    assert ttl.startswith(f"{path}: spec.journal.ttl: '7 days' is not a duration; use a number "
                          "and a unit: 30m, 12h, 7d")


@pytest.mark.parametrize(("expression", "why"), [
    ("sum(amount) > 10", "aggregate and window functions are not allowed"),
    ("row_number() OVER (ORDER BY id) = 1", "aggregate and window functions are not allowed"),
    ("id IN (SELECT 1)", "subqueries are not allowed"),
    ("SELECT 1", "is a statement; write an expression"),
    ("a > 1; b > 2", "holds more than one expression"),
    ("orders.amount > 10", "could not be resolved for table: 'orders'"),
    ("CAST(amount AS INT) > 10", "not supported by the processor evaluator"),
])
def test_what_the_evaluator_cannot_run_on_any_row_is_refused(expression: str, why: str) -> None:
    (problem,) = problems_of(f'  processors: [{{type: filter, where: "{expression}"}}]\n')
    assert problem.startswith("s.yaml: spec.processors[0].where: ") and why in problem


def test_expressions_that_fail_only_on_some_values_load():
    """`amount / 1` fails on a text amount: that event fails alone, the spec is fine."""
    spec = parse_pipeline(BASE + """\
  processors:
    - {type: filter, where: "amount / 1 > 0 AND lower(name) LIKE 'a%' AND op != 'delete'"}
    - {type: transform, set: {label: "CASE WHEN amount > 100 THEN 'big' ELSE 'small' END"}}
""", env={})
    assert len(spec.spec.processors) == 2


@pytest.mark.parametrize(("ttl", "seconds"), [
    ("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("45s", 45), ("2w", 14 * 86400),
    (3600, 3600), ("1.5h", 5400),
])
def test_journal_ttl_is_parsed_at_load(ttl: object, seconds: float) -> None:
    spec = parse_pipeline(BASE + f"  journal: {{ttl: {ttl}}}\n", env={})
    assert spec.spec.journal.ttl.total_seconds() == seconds


@pytest.mark.parametrize("ttl", ["0s", "-1d", "7 days", "d", "7y"])
def test_a_bad_ttl_is_named(ttl: str) -> None:
    (problem,) = problems_of(f"  journal: {{ttl: {ttl}}}\n")
    assert problem.startswith("s.yaml: spec.journal.ttl: ") and "duration" in problem


def test_max_inflight_other_than_one_is_refused_as_not_supported_yet():
    assert parse_pipeline(BASE + "  batch: {max_inflight: 1}\n", env={}).spec.batch.max_inflight == 1
    (problem,) = problems_of("  batch: {max_inflight: 4}\n")
    assert problem.startswith("s.yaml: spec.batch.max_inflight: 4 is not supported yet: "
                              "delivery keeps one batch in flight per pipeline")


def test_a_micro_batch_interval_below_the_floor_is_refused():
    (problem,) = problems_of("  batch: {max_ms: 20}\n")
    assert problem.startswith("s.yaml: spec.batch.max_ms: 20 ms is shorter than the shortest "
                              "micro-batch interval delivery runs; use 100 or more")


@pytest.mark.parametrize(("sink", "field", "why"), [
    ('{id: p1, type: postgres, dsn: "postgresql://h/db", envelope: native}',
     "spec.sinks[1].envelope", "the postgres sink writes rows into tables, not envelopes"),
    ('{id: k1, type: kafka, brokers: "h:1", checkpoint_topic: cps}',
     "spec.sinks[1].checkpoint_topic", "applies to exactly_once: true only"),
    ('{id: k1, type: kafka, brokers: "h:1", client_config: {acks: "1"}}',
     "spec.sinks[1].client_config", "acks is set by Tailrace (all, for no loss); remove it"),
    ('{id: k1, type: kafka, brokers: "h:1", client_config: {bootstrap.servers: "x:1"}}',
     "spec.sinks[1].client_config", "bootstrap.servers is set by Tailrace (from the sink's "
                                    "brokers)"),
    ('{id: k1, type: kafka, brokers: "h:1", exactly_once: true, '
     'client_config: {transactional.id: t}}',
     "spec.sinks[1].client_config", "transactional.id is set by Tailrace"),
    ('{id: r2, type: redis, url: "redis://h", stream: "cdc.{table"}',
     "spec.sinks[1].stream", "is not a routing template: expected '}'"),
    ('{id: r2, type: redis, url: "redis://h", stream: "cdc.{table:>9}"}',
     "spec.sinks[1].stream", "{table} takes no format or conversion"),
    ('{id: r2, type: redis, url: "redis://h", stream: "cdc.{pipeline}.{table}"}',
     "spec.sinks[1].stream", "unknown template field {pipeline}"),
])
def test_a_sink_setting_that_would_be_ignored_is_refused(sink: str, field: str, why: str) -> None:
    (problem,) = problems_of("", sinks=f"    - {sink}\n")
    assert problem.startswith(f"s.yaml: {field}: ") and why in problem


def test_the_bus_brokers_are_not_overridden_by_client_config():
    text = BASE.replace('bus: {brokers: "h:9092"}',
                        'bus: {brokers: "h:9092", client_config: {bootstrap.servers: "x:1"}}')
    with pytest.raises(ConfigError, match=r"spec\.bus\.client_config: bootstrap\.servers is set "
                                          r"by Tailrace \(from bus\.brokers\)"):
        parse_pipeline(text, env={})


def test_client_config_numbers_and_booleans_reach_librdkafka_as_text():
    spec = parse_pipeline(BASE.replace(
        'bus: {brokers: "h:9092"}',
        'bus: {brokers: "h:9092", client_config: {linger.ms: 20, enable.ssl.certificate'
        '.verification: false}}'), env={})
    assert dict(spec.spec.bus.client_config) == {
        "linger.ms": "20", "enable.ssl.certificate.verification": "false"}


@pytest.mark.parametrize("policy", ["all", "{quorum: 1}"])
def test_required_false_is_refused_where_every_sink_counts(policy: str) -> None:
    problems = problems_of(f"  commit_policy: {policy}\n",
                           sinks="    - {id: r2, type: redis, url: \"redis://h\", "
                                 "required: false}\n")
    assert len(problems) == 1 and problems[0].startswith(
        "s.yaml: spec.sinks[1].required: required: false has no effect under commit_policy ")


def test_a_quorum_no_set_of_sinks_can_meet_is_refused():
    (problem,) = problems_of("  commit_policy: {quorum: 3}\n")
    assert problem == ("s.yaml: spec.commit_policy.quorum: 3 can never be met by 1 sink(s); "
                       "set it between 1 and 1")


def test_snapshot_settings_are_checked_and_what_is_not_built_is_refused():
    """Every snapshot setting the loader accepts is used (tests/integration/test_pg_snapshot.py,
    test_mysql_snapshot.py); what is not built yet is refused with a message, never accepted
    and ignored."""
    pg = GOOD.replace("tables: [public.orders, shop.order_%]}",
                      "tables: [public.orders], snapshot: {mode: initial_only, chunk_size: 500}}")
    snapshot = parse_pipeline(pg, env={"PG_DSN": "postgresql://h/db"}).spec.source.snapshot
    assert (snapshot.mode, snapshot.chunk_size, snapshot.parallelism) == ("initial_only", 500, 2)
    when_needed = parse_pipeline(pg.replace("initial_only", "when_needed").replace(
        "chunk_size: 500", "key_columns: {public.orders: [region, n]}"),
        env={"PG_DSN": "postgresql://h/db"}).spec.source.snapshot
    assert when_needed.mode == "when_needed"
    assert when_needed.key_columns == {"public.orders": ["region", "n"]}
    for bad, match in [("mode: sometimes", r"snapshot\.mode"),
                       ("chunk_size: 0", r"snapshot\.chunk_size"),
                       ("parallelism: 0", r"snapshot\.parallelism"),
                       ("parallelism: 17", r"snapshot\.parallelism"),
                       ("key_columns: {public.other: [id]}", "does not select"),
                       ("key_columns: {public.orders: []}", r"snapshot\.key_columns"),
                       ("key_columns: {public.orders: [a, a]}", "each column once"),
                       ("key_columns: {public.ord%: [a]}", "no wildcards"),
                       ("signal_table: tailrace.signal", "mysql sources only")]:
        text = GOOD.replace("tables: [public.orders, shop.order_%]}",
                            f"tables: [public.orders], snapshot: {{{bad}}}}}")
        with pytest.raises(ConfigError, match=match):
            parse_pipeline(text, env={"PG_DSN": "postgresql://h/db"})

    def mysql(snapshot: str) -> str:
        return GOOD.replace("type: postgres", "type: mysql").replace(
            "tables: [public.orders, shop.order_%]}", f"tables: [shop.orders], snapshot: {snapshot}}}")

    env = {"PG_DSN": "mysql://u@h:3306/shop"}
    for mode in ("initial", "initial_only", "when_needed"):
        spec = parse_pipeline(mysql(f"{{mode: {mode}, signal_table: ops.cdc_signal}}"), env=env)
        assert spec.spec.source.snapshot.mode == mode
        assert spec.spec.source.snapshot.signal_table == "ops.cdc_signal"
        assert spec.spec.source.snapshot.parallelism == 2
    assert parse_pipeline(mysql("{mode: initial}"), env=env).spec.source.snapshot.signal_table \
        is None  # the default, tailrace.snapshot_signal (capture_mysql/signal_table.py)
    keyed = parse_pipeline(mysql("{key_columns: {shop.orders: [region, n]}}"), env=env)
    assert keyed.spec.source.snapshot.key_columns == {"shop.orders": ["region", "n"]}
    for bad, match in [("{mode: sometimes}", r"snapshot\.mode"),
                       ("{parallelism: 0}", r"snapshot\.parallelism"),
                       ("{key_columns: {shop.other: [id]}}", "does not select"),
                       ("{key_columns: {shop.orders: []}}", r"snapshot\.key_columns"),
                       ("{signal_table: nodot}", r"snapshot\.signal_table")]:
        with pytest.raises(ConfigError, match=match):
            parse_pipeline(mysql(bad), env=env)


def test_heartbeat_ms_is_read_for_both_sources_and_a_negative_one_is_refused():
    """Used by capture (tests/integration/test_pg_heartbeat.py, test_mysql_heartbeat.py)."""
    env = {"PG_DSN": "postgresql://h/db"}
    assert parse_pipeline(GOOD, env=env).spec.source.heartbeat_ms == 0, "off by default"
    pg = GOOD.replace("tables: [public.orders, shop.order_%]}",
                      "tables: [public.orders], heartbeat_ms: 10000}")
    assert parse_pipeline(pg, env=env).spec.source.heartbeat_ms == 10_000
    mysql = pg.replace("type: postgres", "type: mysql").replace("public.orders", "shop.orders")
    assert parse_pipeline(mysql, env={"PG_DSN": "mysql://u@h/shop"}
                          ).spec.source.heartbeat_ms == 10_000
    with pytest.raises(ConfigError, match=r"heartbeat_ms"):
        parse_pipeline(pg.replace("heartbeat_ms: 10000", "heartbeat_ms: -1"), env=env)


def test_stream_transactions_over_is_a_size_or_null_for_postgres_only():
    """Used by capture-postgres as its walsender's logical_decoding_work_mem, with pgoutput
    streaming (tests/integration/test_pg_capture_stream.py)."""
    env = {"PG_DSN": "postgresql://h/db"}
    assert parse_pipeline(GOOD, env=env).spec.source.stream_transactions_over == 4 * 2**20
    pg = GOOD.replace("tables: [public.orders, shop.order_%]}",
                      "tables: [public.orders], stream_transactions_over: 64KiB}")
    assert parse_pipeline(pg, env=env).spec.source.stream_transactions_over == 64 * 1024
    off = pg.replace("64KiB", "null")
    assert parse_pipeline(off, env=env).spec.source.stream_transactions_over is None
    with pytest.raises(ConfigError, match=r"stream_transactions_over"):
        parse_pipeline(pg.replace("64KiB", "32KiB"), env=env)  # PostgreSQL's floor: 64kB
    with pytest.raises(ConfigError, match=r"stream_transactions_over"):
        parse_pipeline(pg.replace("64KiB", "lots"), env=env)
    mysql = pg.replace("type: postgres", "type: mysql").replace("public.orders", "shop.orders")
    with pytest.raises(ConfigError, match=r"stream_transactions_over"):
        parse_pipeline(mysql, env={"PG_DSN": "mysql://u@h/shop"})


def test_control_replicas_are_named_as_a_list_or_comma_separated_and_checked():
    env = {"PG_DSN": "postgresql://h/db"}
    for control in ('control: {address: "a:1, b:2"}\n', "control: {address: [a:1, b:2]}\n"):
        spec = parse_pipeline(GOOD.replace("  batch:", f"  {control}  batch:"), env=env).spec
        assert (spec.control.address, spec.control.addresses) == ("a:1,b:2", ["a:1", "b:2"])
    with pytest.raises(ConfigError, match=r"spec\.control\.address.*control address 'b' is not "
                                          r"host:port"):
        parse_pipeline(GOOD.replace("  batch:", '  control: {address: "a:1,b"}\n  batch:'),
                       env=env)


def test_an_outbox_processor_is_refused_where_it_could_not_do_what_it_says():
    problems = problems_of("  processors:\n    - {type: outbox, table: public.outbox}\n",
                           sinks="    - {id: k1, type: kafka, brokers: 'h:9092'}\n")
    assert any("spec.sinks[0].type" in p and "cannot write outbox messages" in p
               for p in problems), "a redis sink has no key, payload and headers to write"
    text = BASE.replace('{id: r1, type: redis, url: "redis://h"}',
                        '{id: k1, type: kafka, brokers: "h:9092"}').replace(
        'bus: {brokers: "h:9092"}', 'bus: {brokers: "h:9092", partitions: 2}')
    with pytest.raises(ConfigError, match=r"spec\.bus\.partitions.*outbox"):
        parse_pipeline(text + "  processors:\n    - {type: outbox, table: public.outbox}\n",
                       env={})
    with pytest.raises(ConfigError, match=r"unknown route field \{aggregatetype\}"):
        parse_pipeline(text.replace("partitions: 2", "partitions: 1") +
                       "  processors:\n    - {type: outbox, table: public.outbox, "
                       "route: 'events.{aggregatetype}'}\n", env={})
    for shaped in ("{routedByValue!r}", "{routedByValue:>10}"):
        with pytest.raises(ConfigError, match=r"takes no format or conversion"):
            parse_pipeline(text.replace("partitions: 2", "partitions: 1") +
                           "  processors:\n    - {type: outbox, table: public.outbox, "
                           f"route: 'events.{shaped}'}}\n", env={})
    spec = parse_pipeline(text.replace("partitions: 2", "partitions: 1") +
                          "  processors:\n    - {type: outbox, table: public.outbox}\n", env={})
    assert spec.spec.processors[0].route == "outbox.event.{routedByValue}"
    deleting = "  processors:\n    - {type: outbox, table: public.outbox, delete_delivered: true}\n"
    assert parse_pipeline(text.replace("partitions: 2", "partitions: 1") + deleting,
                          env={}).spec.processors[0].delete_delivered
    mysql = text.replace("partitions: 2", "partitions: 1").replace(
        "{type: postgres, id: pg1, dsn: \"postgresql://h/db\", tables: [public.orders]}",
        "{type: mysql, id: my1, dsn: \"mysql://h/db\", tables: [db.orders]}")
    with pytest.raises(ConfigError, match=r"spec\.processors\[0\]\.delete_delivered.*built "
                                          r"for PostgreSQL sources, not mysql"):
        parse_pipeline(mysql + deleting.replace("public.outbox", "db.outbox"), env={})


@pytest.mark.parametrize(("sink", "problem"), [
    ("{id: k, type: kafka, brokers: b, format: protobuf, envelope: debezium}",
     "format protobuf needs schema_registry"),
    ("{id: k, type: kafka, brokers: b, format: json_schema, schema_registry: {url: 'http://r:1'}}",
     "format json_schema writes Debezium's change event: set envelope: debezium"),
    ("{id: k, type: kafka, brokers: b, format: avro, schema_registry: {url: 'http://r:1'}}",
     "set envelope: debezium"),
    ("{id: k, type: kafka, brokers: b, format: avro, envelope: debezium}",
     "format avro needs schema_registry"),
    ("{id: k, type: kafka, brokers: b, format: avro, envelope: debezium, schemas_enable: true, "
     "schema_registry: {url: 'http://r:1'}}", "schemas_enable is for format json"),
    ("{id: k, type: kafka, brokers: b, schema_registry: {url: 'http://r:1'}}",
     "schema_registry is for format avro"),
    ("{id: k, type: kafka, brokers: b, format: avro, envelope: debezium, schema_registry: "
     "{url: 'http://r:1', token_file: t, basic_auth_user_info: 'u:p'}}", "not both"),
    ("{id: k, type: kafka, brokers: b, format: avro, envelope: debezium, schema_registry: "
     "{url: 'r:1'}}", "schema_registry.url"),
])
def test_a_kafka_format_that_could_not_work_is_refused_naming_the_field(sink, problem) -> None:
    problems = problems_of("", sinks=f"    - {sink}\n")
    assert any(problem in p and "spec.sinks[1]" in p for p in problems), problems


@pytest.mark.parametrize("registry_format", ["avro", "json_schema", "protobuf"])
def test_a_registry_format_with_a_registry_loads(registry_format: str) -> None:
    text = BASE.replace('{id: r1, type: redis, url: "redis://h"}',
                        f"{{id: k, type: kafka, brokers: b, format: {registry_format}, "
                        "envelope: debezium, schema_registry: {url: 'http://control:8081', "
                        "token_file: /t}}")
    [sink] = parse_pipeline(text, env={}).spec.sinks
    assert (sink.format, sink.schema_registry.url) == (registry_format, "http://control:8081")


def test_where_a_sink_starts_is_earliest_unless_its_spec_says_now_or_snapshot() -> None:
    sinks = ("    - {id: k, type: kafka, brokers: b, start: now}\n"
             "    - {id: n, type: nats, url: 'nats://h', start: snapshot}\n"
             "    - {id: p, type: postgres, dsn: 'postgresql://h/db', start: earliest}\n")
    text = BASE.replace('    - {id: r1, type: redis, url: "redis://h"}\n',
                        '    - {id: r1, type: redis, url: "redis://h"}\n' + sinks)
    starts = {s.id: s.start for s in parse_pipeline(text, env={}).spec.sinks}
    assert starts == {"r1": "earliest", "k": "now", "n": "snapshot", "p": "earliest"}


@pytest.mark.parametrize(("start", "hint"), [
    ("latest", "(did you mean now?)"), ("beginning", "(did you mean earliest?)"),
    ("yesterday", "; use earliest"), ("true", "; use earliest"), ("3", "; use earliest")])
def test_a_start_that_is_no_place_to_start_is_refused_naming_the_field(start: str,
                                                                      hint: str) -> None:
    (problem,) = problems_of("", sinks=f"    - {{id: r2, type: redis, url: 'redis://h', "
                                       f"start: {start}}}\n")
    assert problem.startswith("s.yaml: spec.sinks[1].start: ") and hint in problem, problem
    assert "is not where a sink starts" in problem and "now (changes committed" in problem


def test_start_snapshot_is_refused_where_a_filter_drops_the_snapshots_reads() -> None:
    (problem,) = problems_of("  processors:\n    - {type: filter, ops: [insert, update]}\n",
                             sinks="    - {id: r2, type: redis, url: 'redis://h', "
                                   "start: snapshot}\n")
    assert problem == ("s.yaml: spec.sinks[1].start: start: snapshot reads the tables for this "
                       "sink, but spec.processors[0] keeps only ops insert, update and drops "
                       "the snapshot's read events; add read to its ops, or use start: now")
    parse_pipeline(BASE.replace('url: "redis://h"}', 'url: "redis://h", start: snapshot}') +
                   "  processors:\n    - {type: filter, ops: [insert, read]}\n", env={})
