"""docs/spec-reference.md says what the pipeline spec's model says (`tools/gen_spec_reference.py`),
and every example in it is a value the model accepts."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import TypeAdapter

from tools import gen_spec_reference as ref


def test_the_spec_reference_in_the_docs_is_up_to_date() -> None:
    assert ref.DOC.read_text() == ref.render(), (
        "docs/spec-reference.md is out of date: run .venv/bin/python tools/gen_spec_reference.py")


def _fields() -> list[tuple[str, Any, Any]]:
    rows = []
    for section in ref.sections():
        for name, info in section.model.model_fields.items():
            key = f"{section.model.__name__}.{name}"
            if key in ref.REFUSED_ONLY:
                continue
            example = ref.example_of(section.model, name, info)
            if example is not None:
                annotation = (Annotated[(info.annotation, *info.metadata)] if info.metadata
                              else info.annotation)
                rows.append((key, annotation, example))
    return rows


@pytest.mark.parametrize(("key", "annotation", "example"), _fields(), ids=lambda v: str(v)[:40])
def test_every_example_is_a_value_the_field_accepts(key: str, annotation: Any, example: Any) -> None:
    TypeAdapter(annotation).validate_python(example)


def test_every_field_of_every_model_is_in_the_reference() -> None:
    text = ref.DOC.read_text()
    for section in ref.sections():
        heading = f'<a id="{ref._anchor(section.model)}"></a>'
        assert heading in text, section.model.__name__
        part = text.split(heading, 1)[1].split("\n## ", 1)[0]
        for name in section.model.model_fields:
            if f"{section.model.__name__}.{name}" not in ref.REFUSED_ONLY:
                assert f"| `{name}` |" in part, f"{section.model.__name__}.{name}"


def test_a_field_with_nothing_said_of_it_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ref._comments()
    real["BusSpec"] = {k: v for k, v in real["BusSpec"].items() if k != "brokers"}
    monkeypatch.setattr(ref, "_comments", lambda: real)
    with pytest.raises(SystemExit, match="BusSpec.brokers says nothing"):
        ref.render()
