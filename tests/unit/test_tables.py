"""The one table-pattern matcher: capture-mysql, capture-postgres and delivery's filters."""

from __future__ import annotations

import pytest

from tailrace.tables import TableMatcher


def test_a_pattern_matches_the_last_names_of_a_qualified_name() -> None:
    m = TableMatcher(["public.orders", "shop.audit.%", "%.log_*"])
    assert m.matches("db", "public", "orders")  # schema.table in any database
    assert m.matches("shop", "audit", "x") and not m.matches("other", "audit", "x")
    assert m.matches("db", "s", "log_1") and m.matches("s", "log_1")
    assert not m.matches("db", "public", "Orders")  # case-sensitive
    assert not m.matches("orders")  # a pattern longer than the name


def test_a_wildcard_stays_within_one_name() -> None:
    m = TableMatcher(["shop.*", "a%.b"])
    assert m.matches("shop", "orders") and not m.matches("shop", "public", "orders")
    assert m.matches("ab", "b") and not m.matches("a", "x", "b")


def test_system_databases_never_match_a_wildcard_database() -> None:
    m = TableMatcher(["%.audit", "mysql.user"], system_databases={"mysql"})
    assert m.matches("shop", "audit") and not m.matches("mysql", "audit")
    assert m.matches("mysql", "user")  # named, not matched by a wildcard


@pytest.mark.parametrize("bad", ["orders", "a.b.c.d", "a..b", ".b"])
def test_a_malformed_pattern_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="table pattern"):
        TableMatcher([bad])
