"""The `spark` fixture: a Spark standalone cluster on the `cluster` fixture's hosts for the whole session
(scripts/spark_testbed.py: the master in h1, a worker of 2 cores in h2 and h3, each in its host's namespaces),
for this folder's tests only (package scope: the other cluster tests count the hosts' processes), stopped after them with a check that no Spark JVM, pyspark worker or trainrun process is left in any host.
Skips with the reason when Java or pyspark is missing. The drivers run in the root namespace (10.241.0.1)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("trainrun_spark_testbed",
                                               Path(__file__).parents[3] / "scripts/spark_testbed.py")
spark_testbed = sys.modules["trainrun_spark_testbed"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spark_testbed)


@pytest.fixture(scope="package")
def spark(cluster):
    """(master URL, testbed) of a running cluster; tests that stop a worker start it again (restart_worker)."""
    reason = spark_testbed.missing_requirement()
    if reason:
        pytest.skip(f"spark tests: {reason}")
    url = spark_testbed.up(cluster)
    try:
        yield url, cluster
    finally:
        left = spark_testbed.down_spark()
        assert not left, f"spark testbed teardown left {left}"
