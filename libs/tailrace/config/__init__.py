"""The pipeline spec: YAML, `${ENV}` expanded at load time, validated before anything starts.

Every spec class product code uses is here; `_model` and the other modules are private.
"""

from tailrace.config._dsn import config_error_of
from tailrace.config._expressions import compile_expression, evaluation_query
from tailrace.config._loader import load_pipeline, parse_pipeline
from tailrace.config._model import (
    MIN_BATCH_MS,
    BatchSpec,
    BusSpec,
    ControlSpec,
    Envelope,
    FilterProcessor,
    JournalSpec,
    KafkaSinkSpec,
    Metadata,
    MysqlSourceSpec,
    NatsSinkSpec,
    OutboxProcessor,
    PipelineSpec,
    PostgresSinkSpec,
    PostgresSourceSpec,
    ProcessorSpec,
    QuorumPolicy,
    RedisSinkSpec,
    RouteProcessor,
    SinkSpec,
    SnapshotSpec,
    SourceSpec,
    Spec,
    TlsSpec,
    TransformProcessor,
    control_addresses,
)
from tailrace.config._units import parse_duration, parse_size

__all__ = [
    "control_addresses",
    "MIN_BATCH_MS",
    "BatchSpec",
    "BusSpec",
    "ControlSpec",
    "Envelope",
    "FilterProcessor",
    "JournalSpec",
    "KafkaSinkSpec",
    "Metadata",
    "MysqlSourceSpec",
    "NatsSinkSpec",
    "OutboxProcessor",
    "PipelineSpec",
    "PostgresSinkSpec",
    "PostgresSourceSpec",
    "ProcessorSpec",
    "QuorumPolicy",
    "RedisSinkSpec",
    "RouteProcessor",
    "SinkSpec",
    "SnapshotSpec",
    "SourceSpec",
    "Spec",
    "TlsSpec",
    "TransformProcessor",
    "config_error_of",
    "compile_expression",
    "evaluation_query",
    "load_pipeline",
    "parse_duration",
    "parse_pipeline",
    "parse_size",
]
