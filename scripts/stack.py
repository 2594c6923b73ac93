"""The whole stack on loopback: mosquitto (256 KiB packets), SeaweedFS S3, the gateway.

Run through `scripts/up.sh`, which installs everything first. After a self-check (a 20 MiB
message across the 256 KiB broker, byte-exact, while a plain mosquitto_sub sees only a
placeholder) it serves until Ctrl-C; `--check` stops after the self-check.

Ports: STACK_MQTT_PORT (1883), STACK_S3_PORT (8333), STACK_GATEWAY_PORT (8080).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _servers import Mosquitto, SeaweedFS, free_port, wait_for_port  # noqa: E402


def port(name: str, default: int) -> int:
    value = int(os.environ.get(name, default))
    return value if value else free_port(with_grpc=True)


def start_gateway(
    state: Path, s3: SeaweedFS, broker: Mosquitto, gw_port: int
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OFFLOAD_STORAGE_URL": s3.storage_url("offload"),
        "OFFLOAD_S3_ACCESS_KEY": s3.access_key,
        "OFFLOAD_S3_SECRET_KEY": s3.secret_key,
        "OFFLOAD_MQTT_URL": broker.url,
        "OFFLOAD_PUBLIC_URL": f"http://127.0.0.1:{gw_port}",
        "OFFLOAD_ALLOW_ANONYMOUS": "true",  # a local playground: no credentials, by name
    }
    log = (state / "gateway.log").open("wb")
    proc = subprocess.Popen(
        ["offload-gateway", "--host", "127.0.0.1", "--port", str(gw_port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_for_port(gw_port, 30, proc, state / "gateway.log")
    (state / "env").write_text(
        "".join(f"export {k}={v}\n" for k, v in env.items() if k.startswith("OFFLOAD_"))
    )
    return proc


def wait_ready(url: str, timeout: float = 30) -> dict[str, object]:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(f"{url}/readyz", timeout=5)
            if r.status_code == 200 or time.monotonic() > deadline:
                return dict(r.json())
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.3)


def self_check(state: Path, broker: Mosquitto, gw_url: str) -> bool:
    print("==> self-check: 20 MiB through a broker that takes 256 KiB packets")
    ready = wait_ready(gw_url)
    print(f"    gateway /readyz: {ready}")
    mqtt = broker.url
    discover = subprocess.run(
        ["offload", "discover", "--broker", mqtt], capture_output=True, text=True, timeout=30
    )
    print(f"    discovery record: {discover.stdout.strip() or discover.stderr.strip()}")
    big = state / "selfcheck-20MiB.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024))
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    topic = f"selfcheck/{os.getpid()}"
    sub = subprocess.Popen(
        [
            "offload",
            "subscribe",
            "--broker",
            mqtt,
            "--topic",
            topic,
            "--count",
            "1",
            "--timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    raw = subprocess.Popen(
        [
            "mosquitto_sub",
            "-V",
            "5",
            "-p",
            str(broker.port),
            "-h",
            "127.0.0.1",
            "-t",
            topic,
            "-C",
            "1",
            "-W",
            "60",
            "-F",
            "%j",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # both subscriptions in place before the publish
    t0 = time.monotonic()
    pub = subprocess.run(
        [
            "offload",
            "publish",
            "--broker",
            mqtt,
            "--topic",
            topic,
            "--file",
            str(big),
            "--qos",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    sub_out, _ = sub.communicate(timeout=90)
    raw_out, _ = raw.communicate(timeout=90)
    elapsed = time.monotonic() - t0
    print(f"    offload publish: exit {pub.returncode} {pub.stdout.strip()} {pub.stderr.strip()}")
    ok = pub.returncode == 0
    try:
        line = json.loads(sub_out.strip().splitlines()[-1])
        same = line.get("sha256") == digest and line.get("size") == big.stat().st_size
        print(
            f"    offload subscribe: size={line.get('size')} sha256 match={same} "
            f"({elapsed:.2f} s publish to delivery)"
        )
        ok = ok and same
    except (IndexError, ValueError):
        print(f"    offload subscribe printed nothing usable: {sub_out!r}")
        ok = False
    try:
        seen = json.loads(raw_out.strip().splitlines()[-1])
        props = seen.get("properties", {})
        placeholder = props.get("user-properties", {}).get("_format") == "external"
        print(
            f"    plain mosquitto_sub saw {seen.get('payloadlen')} bytes, "
            f"_format={props.get('user-properties', {}).get('_format')}"
        )
        ok = ok and placeholder and int(seen.get("payloadlen", 1 << 30)) < 262144
    except (IndexError, ValueError):
        print(f"    mosquitto_sub printed nothing usable: {raw_out!r}")
        ok = False
    big.unlink()
    print("==> self-check " + ("PASSED" if ok else "FAILED"))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit after the self-check")
    args = parser.parse_args()
    state = ROOT / ".stack"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir()
    s3 = SeaweedFS(workdir=state / "seaweedfs")
    s3.workdir.mkdir()
    s3_port = port("STACK_S3_PORT", 8333)
    s3._ports = {
        "master": free_port(with_grpc=True),
        "volume": free_port(with_grpc=True),
        "filer": free_port(with_grpc=True),
        "s3": s3_port,
    }
    s3.s3_port = s3_port
    broker = Mosquitto(
        max_packet_size=262144, port=port("STACK_MQTT_PORT", 1883), workdir=state / "mosquitto"
    )
    broker.workdir.mkdir()
    gw_port = port("STACK_GATEWAY_PORT", 8080)
    gateway: subprocess.Popen[bytes] | None = None
    try:
        print(f"==> SeaweedFS S3 on 127.0.0.1:{s3_port}")
        s3.start()
        print(f"==> mosquitto on 127.0.0.1:{broker.port} (max_packet_size 262144)")
        broker.start()
        print(f"==> gateway on http://127.0.0.1:{gw_port}")
        gateway = start_gateway(state, s3, broker, gw_port)
        ok = self_check(state, broker, f"http://127.0.0.1:{gw_port}")
        if args.check or not ok:
            return 0 if ok else 1
        print(f"""
Serving. Try:
  offload subscribe --broker {broker.url} --topic 'demo/#' &
  offload publish --broker {broker.url} --topic demo/big --file /path/to/large.bin
  curl -s http://127.0.0.1:{gw_port}/readyz
Gateway settings: source {state / "env"}   Logs: {state}/   Ctrl-C stops everything.""")
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(30)
        broker.stop()
        s3.stop()


if __name__ == "__main__":
    sys.exit(main())
