"""Fail early, and by name, when the executors' Python cannot run this source.

Spark starts its Python workers with `spark.pyspark.python`, else PYSPARK_PYTHON, else
`python3` from PATH. When that interpreter lacks pyarrow (or this package), the first query
dies with only "Python worker exited unexpectedly (crashed)". With a local master the
workers run on this machine with this environment, so `register` can try the imports in
that interpreter first and name the variable to fix. On a cluster the executors' machines
are not reachable from here and nothing is checked.
"""

from __future__ import annotations

import functools
import os
import subprocess
from typing import Any

from ..core._exceptions import ConfigError

# What a worker imports to plan and read: Arrow batches, the S3 client, this package.
WORKER_IMPORTS = ("pyarrow", "minio", "client.spark._read")
CHECK_TIMEOUT_S = 120


def worker_python(spark: Any) -> tuple[str, str]:
    """(the interpreter Spark's workers run, where that choice came from)."""
    try:
        configured = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # Spark Connect may refuse to read some confs
        configured = None
    if configured:
        return configured, "spark.pyspark.python"
    from_env = os.environ.get("PYSPARK_PYTHON")
    if from_env:
        return from_env, "PYSPARK_PYTHON"
    return "python3", "PYSPARK_PYTHON unset: python3 on PATH"


@functools.cache
def missing_import(python: str, pythonpath: str) -> str | None:
    """Why `python` cannot import WORKER_IMPORTS (None: it can). Cached per interpreter."""
    script = "; ".join(f"import {name}" for name in WORKER_IMPORTS)
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    try:
        done = subprocess.run(
            [python, "-c", script],
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            env=env,
            check=False,
        )
    except OSError as exc:
        return f"cannot run it: {exc}"
    except subprocess.TimeoutExpired:
        return None  # slow, not broken: let Spark try
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def check_worker_python(spark: Any) -> None:
    """Raise ConfigError naming PYSPARK_PYTHON when local workers could not import the source.

    Args:
        spark: the SparkSession `register` was given.
    """
    try:
        master = str(spark.sparkContext.master)
    except Exception:  # Spark Connect: no SparkContext, workers are elsewhere
        return
    if not master.startswith("local"):
        return
    python, origin = worker_python(spark)
    problem = missing_import(python, os.environ.get("PYTHONPATH", ""))
    if problem is not None:
        raise ConfigError(
            f"Spark's Python workers would run {python!r} ({origin}), which cannot import "
            f"what the offload source needs ({', '.join(WORKER_IMPORTS)}): {problem}. "
            "Set PYSPARK_PYTHON (or spark.pyspark.python) to an interpreter with the spark "
            "extra installed (pip install 'mqtt-offload[spark]') before starting the session."
        )
