"""One local Spark session for every Spark test module (a JVM start costs seconds per module).

`getOrCreate` hands back the running session, so modules share it; nothing stops it before
the interpreter exits (pyspark stops the JVM then).
"""

from __future__ import annotations

from typing import Any


def local_spark() -> Any:
    """The tests' `local[2]` session, created on first use."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("offload-tests")
        # Loopback only: left alone, Spark binds the host's first non-loopback address.
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.minBatchesToRetain", "100")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
