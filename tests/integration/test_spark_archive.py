"""The delivery driver's class-data archive: `make setup` writes it (`tailrace-spark archive`)
and every Spark session delivery starts maps it (docs/performance.md: ~3-4 s less per start).
The driver JVM compiles with C1 only (`job.DRIVER_JIT`), and the archive maps with that too."""

from __future__ import annotations

import pytest

from tailrace_services.delivery.cluster import class_archive, default_archive
from tailrace_services.delivery.job import spark_session

pytestmark = pytest.mark.integration


def test_make_setup_wrote_the_archive_and_delivery_sessions_map_it() -> None:
    archive = class_archive()
    assert archive == default_archive(), "make setup runs tailrace-spark archive"
    spark = spark_session("archive-check", "local[1]")
    try:
        runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        arguments = list(runtime.getInputArguments())
        assert f"-XX:SharedArchiveFile={archive}" in arguments, arguments
        # the JVM's own arguments hold the flag anyway here (JAVA_TOOL_OPTIONS, conftest.py)
        driver_options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
        assert "-XX:TieredStopAtLevel=1" in driver_options.split(), driver_options
        assert "sharing" in spark.sparkContext._jvm.java.lang.System.getProperty("java.vm.info")
    finally:
        spark.stop()
