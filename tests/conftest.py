import os

import pytest

# Every JVM the tests start compiles with C1 alone: half of a delivery start's JVM CPU
# (18.9 -> 9.8 s in tests/integration/test_pg_to_redis.py), which a 2-core machine running
# two tests at once pays in wall time; what the JVMs run is the same. Delivery's driver has
# it from the product itself (`job.DRIVER_JIT`); this covers the others: spark-submit's
# launcher, a Spark cluster's master, worker and executors. The JVM says "Picked up
# JAVA_TOOL_OPTIONS" on stderr (a warning line in delivery's log).
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")

pytest_plugins = ["tests.fix_servers", "tests.fix_sinks", "tests.fix_pipeline",
                  "tests.fix_delivery", "tests.fix_capture", "tests.fix_mysql", "tests.fix_tls",
                  "tests.fix_matrix", "tests.fix_spark"]


@pytest.fixture(autouse=True)
def _no_links_left_failing() -> None:
    """`tailrace.links` is process-wide: what one test's clients found cut is not the next's."""
    from tailrace.links import LINKS

    LINKS.clear()
