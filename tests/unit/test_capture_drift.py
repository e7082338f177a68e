"""Schema drift on a changed server, for both sources: the catalog against the registry."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tailrace.errors import RetryableError
from tailrace_services.capture.drift import find_drift


class Registry:
    """`list_schemas` of a control service holding `versions[(database, table)]` fingerprints."""

    def __init__(self, versions: dict[tuple[str, str], list[str]]) -> None:
        self.versions = versions

    def list_schemas(self, tenant: str, database: str, table: str) -> list[Any]:
        assert tenant == "acme"
        return [SimpleNamespace(version=i + 1, fingerprint=fp)
                for i, fp in enumerate(self.versions.get((database, table), []))]


def test_a_table_differs_from_its_latest_registered_version() -> None:
    control: Any = Registry({("shop", "a"): ["1"], ("shop", "b"): ["1", "2"],
                             ("shop", "public.c"): ["3"]})
    now = {("shop", "a"): "1", ("shop", "b"): "1", ("shop", "public.c"): "4",
           ("shop", "d"): "5"}  # d: never registered, nothing captured to differ from
    assert find_drift(control, "acme", lambda: now, server="s", strict=True) == [
        "shop.b: structure differs from schema version 2",
        "shop.public.c: structure differs from schema version 1"]


class CatalogDown(Exception):
    pass


def test_a_comparison_that_fails_is_no_answer() -> None:
    control: Any = Registry({})

    def broken() -> dict[tuple[str, str], str]:
        raise CatalogDown("lost connection")

    with pytest.raises(RetryableError, match="it is not adopted until they are compared"):
        find_drift(control, "acme", broken, server="the server", strict=True,
                   errors=(CatalogDown,))
    notes = find_drift(control, "acme", broken, server="the server", strict=False,
                       errors=(CatalogDown,))
    assert notes == ["cannot compare the tables of the server, whose identity changed, with "
                     "their registered schemas: lost connection"]
