import pytest

pytest_plugins = ["tests.fix_servers", "tests.fix_sinks", "tests.fix_pipeline",
                  "tests.fix_delivery", "tests.fix_capture", "tests.fix_mysql", "tests.fix_tls",
                  "tests.fix_matrix", "tests.fix_spark"]


@pytest.fixture(autouse=True)
def _no_links_left_failing() -> None:
    """`tailrace.links` is process-wide: what one test's clients found cut is not the next's."""
    from tailrace.links import LINKS

    LINKS.clear()
