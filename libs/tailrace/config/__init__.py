"""The pipeline spec: YAML, `${ENV}` expanded at load time, validated before anything starts."""

from tailrace.config._loader import load_pipeline, parse_pipeline
from tailrace.config._model import (
    BatchSpec,
    BusSpec,
    ControlSpec,
    MysqlSourceSpec,
    PipelineSpec,
    PostgresSourceSpec,
    RedisSinkSpec,
    SinkSpec,
    SourceSpec,
)

__all__ = [
    "BatchSpec",
    "BusSpec",
    "ControlSpec",
    "MysqlSourceSpec",
    "PipelineSpec",
    "PostgresSourceSpec",
    "RedisSinkSpec",
    "SinkSpec",
    "SourceSpec",
    "load_pipeline",
    "parse_pipeline",
]
