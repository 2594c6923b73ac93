"""The chart's admission fits its memory limit: `gateway.maxTransfers` uploads at once.

The gateway runs as its own process with the memory settings the chart renders (transfers
admitted, part size, parts in flight, the part-memory budget, the per-client cap); that
many 16 MiB uploads at once, from several loopback addresses, must all complete with the
process's peak RSS (VmHWM) under the chart's memory limit. Slow: about 1 GiB through
SeaweedFS on the test machine.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from test_load import GatewayProcess, client, start_gateway, upload_bson, upload_raw

pytestmark = [pytest.mark.servers, pytest.mark.slow]

__all__ = ["start_gateway"]  # the fixture, used by name below

CHART = Path(__file__).resolve().parents[1] / "helm" / "mqtt-offload"
MiB = 1024 * 1024


def chart_values() -> dict[str, object]:
    values: dict[str, object] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def memory_limit(values: dict[str, object]) -> int:
    limit = str(values["resources"]["limits"]["memory"])  # type: ignore[index]
    units = {"Mi": MiB, "Gi": 1024 * MiB}
    return int(limit[:-2]) * units[limit[-2:]]


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmHWM")


def test_the_charts_max_transfers_of_16_mib_uploads_fit_its_memory_limit(
    start_gateway: Callable[..., GatewayProcess], unique_topic: Callable[[str], str]
) -> None:
    values = chart_values()
    gateway, storage = values["gateway"], values["storage"]
    assert isinstance(gateway, dict) and isinstance(storage, dict)
    transfers = int(gateway["maxTransfers"])
    per_client = int(gateway["maxUploadsPerClient"])
    assert transfers >= 72  # issue 31: three times the 24 of before, in the same 1 GiB
    gw = start_gateway(
        max_transfers=transfers,
        max_uploads_per_client=per_client,
        s3_part_size=storage["partSize"],
        s3_parallel_uploads=storage["parallelUploads"],
        s3_part_memory=storage["partMemory"],
        # The store's pace on 2 shared cores is not what is measured: no 503 for it.
        s3_timeout=120,
    )
    topic = unique_topic("capacity")
    addresses = [f"127.0.0.{i}" for i in range(2, 2 + math.ceil(transfers / per_client))]

    async def scenario() -> list[str]:
        clients = [client(a, timeout=300) for a in addresses]
        try:
            return await asyncio.gather(
                *(
                    (upload_raw if i % 2 else upload_bson)(
                        clients[i % len(clients)], gw.url, topic, 16 * MiB
                    )
                    for i in range(transfers)
                )
            )
        finally:
            for http in clients:
                await http.aclose()

    ids = asyncio.run(scenario())  # each upload checked: 201 and its SHA-256
    assert len(set(ids)) == transfers
    peak = peak_rss(gw.proc.pid)
    print(f"gateway peak RSS {peak / MiB:.0f} MiB with {transfers} uploads at once")
    assert peak < memory_limit(values), f"peak RSS {peak / MiB:.0f} MiB"
    assert gw.wait_idle()["transfers"]["active"] == 0
