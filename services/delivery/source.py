"""The bus as a Spark streaming source (Python Data Source API) whose read delivers.

`initialOffset`, `latestOffset`, `partitions` and `commit` run in Spark's
long-lived planner process: they share nothing with the driver script and
ask the control service. The start is the least advanced sink checkpoint;
the end of each batch is the latest epoch, a cut that never splits a
transaction. One bus partition = one Spark partition = one task. The task is
`read`: it reads its partition's range of the bus itself (a reader its worker keeps),
delivers it to the sinks (`executor.deliver_range`) and yields one row, the outcome
(`handoff.RESULT_SCHEMA`), which the driver collects and commits. So the events never
pass through the JVM, and a task is one Python worker, which keeps its sinks' clients
(a Kafka transactional producer among them) from one batch to the next. Before, `read`
yielded the range and a `mapInArrow` in a second Python worker delivered it: ~80 ms more
per micro-batch, and the two workers took turns (docs/performance.md).

The source class a query reads is made per pipeline (`BusDataSource.for_pipeline`): it
carries the spec (sinks' credentials included) pickled with it, as a function handed to
`mapInArrow` did, never as an option that a plan would show.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from tailrace.bus_generation import offsets_done
from tailrace.config import PipelineSpec
from tailrace.errors import RetryableError
from tailrace_services.delivery.handoff import RESULT_SCHEMA

GENERATION = "generation"  # the offsets' bus generation, beside the partitions' offsets
EPOCH = "epoch"  # the epoch whose markers end the planned ranges (0: none planned)


class BusPartition(InputPartition):
    def __init__(self, partition: int, start: int, end: int, generation: int = 0,
                 epoch_id: int = 0) -> None:
        super().__init__(partition)
        self.partition, self.start, self.end = partition, start, end
        self.generation, self.epoch_id = generation, epoch_id


class BusReplaced(RetryableError):
    """The bus lost its records and capture republished onto a new generation: the query
    starts again from the sinks' checkpoints (`initialOffset`)."""


BUS_PREFIX = "bus."


def bus_options(client_config: dict[str, str]) -> dict[str, str]:
    """The bus's librdkafka settings as options `bus.<setting>`, one each: Spark hides the
    value of an option whose name looks secret (`spark.redaction.regex`: password, secret,
    token) wherever it shows a plan."""
    return {f"{BUS_PREFIX}{k}": v for k, v in client_config.items()}


def control_options(control: Any) -> dict[str, str]:
    """Options that let the planner reach the control service as the driver does (a
    `ControlSpec`): file paths only, never a token. A token from $TAILRACE_SERVICE_TOKEN
    reaches the planner through the environment Spark's Python workers inherit."""
    out: dict[str, str] = {}
    if control.token_file:
        out["control_token_file"] = control.token_file
    if control.tls is not None:
        out["control_tls"] = "on"
        for name in ("ca", "cert", "key"):
            if getattr(control.tls, name):
                out[f"control_tls_{name}"] = getattr(control.tls, name)
    return out


def _control_spec(options: Mapping[str, str]) -> Any:
    from tailrace.config import ControlSpec, TlsSpec

    tls = None
    if options.get("control_tls") == "on":
        tls = TlsSpec(ca=options.get("control_tls_ca"), cert=options.get("control_tls_cert"),
                             key=options.get("control_tls_key"))
    return ControlSpec(address=options["control"], token_file=options.get("control_token_file"),
                       tls=tls)


class BusDataSource(DataSource):
    """Options: brokers, topic, partitions, control, source_id, sink_ids (comma separated);
    control_token_file and control_tls_{ca,cert,key} (see `control_options`); bus.<setting>
    (see `bus_options`). Registered as made by `for_pipeline`."""

    pipeline: PipelineSpec | None = None

    @classmethod
    def for_pipeline(cls, pipeline: PipelineSpec) -> type[BusDataSource]:
        """The source of `pipeline`'s queries. A class of its own, made here: Spark pickles
        it by value (with the spec) for its planner and workers."""

        class PipelineBusSource(cls):  # type: ignore[valid-type,misc]
            pass

        PipelineBusSource.pipeline = pipeline
        return PipelineBusSource

    @classmethod
    def name(cls) -> str:
        return "tailrace_bus"

    def schema(self) -> StructType:
        return RESULT_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.pipeline is None:
            raise TypeError("register BusDataSource.for_pipeline(spec), not BusDataSource: "
                            "its tasks deliver, and need the pipeline's spec")
        return BusStreamReader(self.options, self.pipeline)


def _offsets(d: dict[str, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in d.items() if k not in (GENERATION, EPOCH)}


def _generation(d: dict[str, Any]) -> int:
    return int(d.get(GENERATION, 0))


class BusStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str], pipeline: PipelineSpec) -> None:
        from tailrace.logs import setup_from_env

        setup_from_env("delivery")  # Spark's planner or a worker process: log as the service
        self.pipeline = pipeline
        self.brokers = options["brokers"]
        self.topic = options["topic"]
        self.num_partitions = int(options.get("partitions", "1"))
        self.control_address = options["control"]
        self.control_spec = _control_spec(options)
        self.bus_client_config = {k[len(BUS_PREFIX):]: v for k, v in options.items()
                                  if k.startswith(BUS_PREFIX)}
        self.source_id = options["source_id"]
        self.sink_ids = [s for s in options.get("sink_ids", "").split(",") if s]
        self.max_events = int(options.get("max_events", "0")) or None
        self._control: Any = None
        self._cursor = 0  # an epoch id at or before the planned start

    def _client(self) -> Any:
        if self._control is None:
            from tailrace.control_access import service_client

            self._control = service_client(self.control_spec)
        return self._control

    def initialOffset(self) -> dict[str, int]:
        """The least advanced checkpoint's offsets, on the latest epoch's bus generation
        (`tailrace.bus_generation`)."""
        client = self._client()
        cp = client.minimum_checkpoint(self.source_id, self.sink_ids)
        latest = client.latest_epoch(self.source_id)
        start = {p: 0 for p in range(self.num_partitions)}
        start.update(offsets_done(cp, latest))
        return {**{str(p): o for p, o in start.items()},
                GENERATION: latest.bus_generation if latest is not None else 0}

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None
                     ) -> dict[str, int]:
        """The furthest epoch past `start` that keeps the batch within `max_events`
        (at least one epoch, however large: a transaction is never split)."""
        start = start or self.initialOffset()
        begin, generation = _offsets(start), _generation(start)
        end, epoch_id = self._plan(begin, generation)
        # Never behind the start: an epoch older than a sink checkpoint plans nothing.
        return {**{str(p): max(end.get(p, 0), begin.get(p, 0))
                   for p in range(self.num_partitions)},
                GENERATION: generation, EPOCH: epoch_id}

    def _plan(self, begin: dict[int, int], generation: int) -> tuple[dict[int, int], int]:
        """The planned end, and the epoch whose markers end it (0: nothing planned)."""
        client = self._client()
        latest = client.latest_epoch(self.source_id)
        if latest is None:
            return begin, 0
        self._same_bus(latest, generation)  # before a backlog hides the newer generation
        if self.max_events is None:
            return _offsets(dict(latest.end_offsets)), latest.epoch_id
        chosen: tuple[dict[int, int], int] | None = None
        after = self._cursor
        while True:
            page = client.epoch_range(self.source_id, after, 0, 1000)
            for epoch in page:
                if epoch.bus_generation != generation:
                    continue  # an older generation's: offsets on a bus that is gone
                end = _offsets(dict(epoch.end_offsets))
                if all(end.get(p, 0) <= o for p, o in begin.items()):
                    self._cursor = epoch.epoch_id  # at or before the start
                    continue
                size = sum(max(end.get(p, 0) - begin.get(p, 0), 0) for p in begin)
                if chosen is not None and size > self.max_events:
                    return chosen
                chosen = end, epoch.epoch_id
            if len(page) < 1000:
                return chosen if chosen is not None else (begin, 0)
            after = page[-1].epoch_id

    def _same_bus(self, epoch: Any, generation: int) -> None:
        if epoch.bus_generation > generation:
            raise BusReplaced(
                f"bus {self.topic} was replaced: capture republished onto bus generation "
                f"{epoch.bus_generation} after the bus lost its records (this query read "
                f"generation {generation}); starting again from the sinks' checkpoints")

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        s, e, generation = _offsets(start), _offsets(end), _generation(end)
        epoch_id = int(end.get(EPOCH, 0))
        return [BusPartition(p, s.get(p, 0), e.get(p, 0), generation, epoch_id)
                for p in range(self.num_partitions) if e.get(p, 0) > s.get(p, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The task: deliver the partition's range against what the driver handed to this
        batch (`handoff.handed_batch`), and yield the outcome (module docstring)."""
        # Imported here: the planner process, which never reads, need not load the sinks.
        from tailrace.logs import setup_from_env
        from tailrace_services.delivery.executor import deliver_range
        from tailrace_services.delivery.handoff import handed_batch

        assert isinstance(partition, BusPartition)
        setup_from_env("delivery")  # a Spark Python worker: log as the service does
        yield deliver_range(self.pipeline, handed_batch(), partition.partition,
                            partition.start, partition.end, partition.generation,
                            partition.epoch_id)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: sink checkpoints are committed by the job after the sinks acked."""

