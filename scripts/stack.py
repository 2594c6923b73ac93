"""The whole stack on loopback: mosquitto (256 KiB packets), SeaweedFS S3, the gateway.

Run through `scripts/up.sh`, which installs everything first. After a self-check (a 20 MiB
message across the 256 KiB broker, byte-exact, while a plain mosquitto_sub sees only a
placeholder) it serves until Ctrl-C; `--check` stops after the self-check. While it serves, a
part that dies is named with its last log lines and started again on its port
(scripts/_stack_watch.py); one that keeps dying stops the stack (exit 1).

Ports: STACK_MQTT_PORT (1883), STACK_S3_PORT (8333), STACK_GATEWAY_PORT (8080),
STACK_PROXY_PORT (1884, offload-proxy: scripts/_stack_proxy.py); 0 picks free ones. State
(data, logs, logins, `env`): STACK_DIR (default `.stack` in the checkout), kept across restarts
as a deployment keeps its store, index and logs (each log's earlier runs as `<log>.1` ...
`.4`); `--clean` erases it first. A second stack on the same STACK_DIR is refused while the
first runs (a lock held for the stack's lifetime).

Protected as a deployment is (scripts/_stack_state.py): a password file and ACL shared by
mosquitto and the gateway (with STACK_AUTH=dynsec, mosquitto's dynamic security plugin and
its file instead: scripts/_stack_dynsec.py), the user `demo` with a password generated for
this stack (in the env file, mode 0600), the gateway on HTTPS with a certificate from the
stack's own CA.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import _stack_dynsec as dynsec  # noqa: E402
from _stack_proxy import proxy_check, start_proxy, stop_proxy  # noqa: E402
from _stack_state import GATEWAY_USER, USER, Files, rotate_logs, write_env  # noqa: E402
from _stack_watch import Part, watch  # noqa: E402

from _servers import (  # noqa: E402
    GRPC_OFFSET,
    START_ATTEMPTS,
    Mosquitto,
    PortInUse,
    SeaweedFS,
    free_port,
    port_answers,
    port_bindable,
    wait_until,
)

MAX_PACKET = 262144
# Direct transfers (OFFLOAD_S3_PUBLIC_URL): clients put and get payload bytes at the store with
# presigned URLs.
DIRECT_TRANSFERS = True
# Ctrl-C is for stopping the demo: in-flight requests get this long (OFFLOAD_SHUTDOWN_TIMEOUT).
GATEWAY_SHUTDOWN = 5


class StackError(Exception):
    """A reason the stack cannot start, printed as one line."""


def requested_port(name: str, default: int, *, grpc: bool = False) -> int:
    """The port `name` asks for (0: a free one), refused at once when it is taken.

    Args:
        name: the environment variable.
        default: its value when unset.
        grpc: SeaweedFS's: it also serves gRPC on the port + 10000, which must be free too.
    """
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise StackError(f"{name}={raw!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise StackError(f"{name}={value} is not a port number (0 picks a free one)")
    again = f"set {name}=0 for a free port or {name}=<port> for another"
    if value and port_answers(value):
        raise StackError(f"port {value} is already in use (another stack or service); {again}")
    if value and grpc and value + GRPC_OFFSET > 65535:
        raise StackError(
            f"{name}={value}: SeaweedFS also serves gRPC on the port + {GRPC_OFFSET}, "
            f"past 65535; {again}"
        )
    if value and grpc and not port_bindable(value + GRPC_OFFSET):
        raise StackError(
            f"port {value + GRPC_OFFSET} is already in use (another stack or service), and "
            f"SeaweedFS serves gRPC on {name} + {GRPC_OFFSET} there; {again}"
        )
    return value


@contextlib.contextmanager
def exclusive(state: Path) -> Iterator[None]:
    """Hold `<state>.lock` for the stack's lifetime; refuse if another stack holds it.

    flock is released by the kernel when the process ends, however it ends, so a crashed
    stack never leaves a stale lock behind.
    """
    lock_path = state.with_name(state.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock: IO[str] = lock_path.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        pid = lock.read().strip() or "?"
        lock.close()
        raise StackError(
            f"another stack (pid {pid}) is running on {state}; stop it first (Ctrl-C in its "
            f"terminal, or kill {pid}), or set STACK_DIR to another directory and the "
            "STACK_*_PORT variables to 0"
        ) from None
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield
    finally:
        lock.close()


def start_gateway(
    files: Files, s3: SeaweedFS, broker: Mosquitto, wanted: int
) -> tuple[subprocess.Popen[bytes], int]:
    """`offload-gateway` on `wanted` (0: a free port, replaced if another program takes it)."""
    state = files.state
    for attempt in range(START_ATTEMPTS if not wanted else 1):
        port = wanted or free_port()
        env = {
            "OFFLOAD_SHUTDOWN_TIMEOUT": str(GATEWAY_SHUTDOWN),
            **os.environ,
            "OFFLOAD_STORAGE_URL": s3.storage_url("offload"),
            "OFFLOAD_S3_ACCESS_KEY": s3.access_key,
            "OFFLOAD_S3_SECRET_KEY": s3.secret_key,
            "OFFLOAD_MQTT_URL": broker.url,
            "OFFLOAD_MQTT_USERNAME": GATEWAY_USER,
            "OFFLOAD_MQTT_PASSWORD": files.made.gateway_password,
            "OFFLOAD_PUBLIC_URL": f"https://127.0.0.1:{port}",
            # The stack's offload-proxy reaches the gateway from 127.0.0.1: its X-Forwarded-For
            # names each device, whose address every per-address rule then counts (the Helm
            # chart's gateway.trustedProxies, docs/settings.md).
            "OFFLOAD_TRUSTED_PROXIES": "127.0.0.1",
            **(
                dynsec.gateway_env(files)
                if dynsec.enabled()
                else {
                    "OFFLOAD_PASSWORD_FILE": str(files.passwd),
                    "OFFLOAD_ACL_FILE": str(files.acl),
                }
            ),
            "OFFLOAD_AUTH_SECRET": files.made.auth_secret,
            "OFFLOAD_TLS_CERT_FILE": str(files.cert),
            "OFFLOAD_TLS_KEY_FILE": str(files.key),
        }
        if DIRECT_TRANSFERS:
            env["OFFLOAD_S3_PUBLIC_URL"] = f"http://{s3.endpoint}"
        log_path = state / "gateway.log"
        proc = subprocess.Popen(
            ["offload-gateway", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log_path.open("wb"),
            stderr=subprocess.STDOUT,
        )
        quiet = env.get("OFFLOAD_LOG_LEVEL", "INFO").upper() not in ("INFO", "DEBUG")
        ready = functools.partial(_gateway_ready, port, log_path, quiet, files.ca)
        try:
            wait_until(ready, f"gateway on port {port}", 30, proc, log_path)
        except PortInUse:
            proc.wait()
            if wanted or attempt == START_ATTEMPTS - 1:
                raise
            continue
        except TimeoutError:  # running, not answering: not left behind
            proc.kill()
            proc.wait()
            raise
        return proc, port
    raise AssertionError("unreachable")


def _gateway_ready(port: int, log: Path, quiet: bool, ca: Path) -> bool:
    """Our gateway holds the port and answers.

    uvicorn logs "running on" only once it holds the port (at INFO, the default level): with
    it, a healthy answer cannot come from another gateway that happens to own the port.
    """
    bound = f"Uvicorn running on https://127.0.0.1:{port}"
    if not quiet and bound not in log.read_text(errors="replace"):
        return False
    return _healthy(port, ca)


def _healthy(port: int, ca: Path) -> bool:
    """The gateway itself answers: /healthz with its own JSON, not just an open port."""
    import httpx

    try:
        tls = ssl.create_default_context(cafile=ca)
        r = httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=2, verify=tls)
        body = r.json()
        return r.status_code == 200 and isinstance(body, dict) and body.get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def wait_ready(url: str, ca: Path, timeout: float = 30) -> dict[str, object]:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(f"{url}/readyz", timeout=5, verify=ssl.create_default_context(cafile=ca))
            if r.status_code == 200 or time.monotonic() > deadline:
                return dict(r.json())
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.3)


def _show(name: str, done: subprocess.CompletedProcess[str]) -> None:
    print(f"    {name}: exit {done.returncode} {done.stdout.strip()}")
    for line in done.stderr.strip().splitlines():  # warnings on their own lines
        print(f"      stderr: {line}")


def self_check(
    files: Files, broker: Mosquitto, gw_url: str, client: dict[str, str], proxy_port: int
) -> bool:
    print("==> self-check: 20 MiB through a broker that takes 256 KiB packets")
    ready = wait_ready(gw_url, files.ca)
    print(f"    gateway /readyz: {ready}")
    mqtt = broker.url
    env = os.environ | client  # as a user's shell after `source <state>/env`
    discover = subprocess.run(
        ["offload", "discover", "--broker", mqtt], capture_output=True, text=True, timeout=30,
        env=env,
    )  # fmt: skip
    _show("offload discover", discover)
    big = files.state / "selfcheck-20MiB.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024))
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    topic = f"selfcheck/{os.getpid()}"
    sub = subprocess.Popen(
        ["offload", "subscribe", "--broker", mqtt, "--topic", topic, "--count", "1",
         "--timeout", "60"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    raw = subprocess.Popen(
        ["mosquitto_sub", "-V", "5", "-p", str(broker.port), "-h", "127.0.0.1", "-t", topic,
         "-u", USER, "-P", files.made.password, "-C", "1", "-W", "60", "-F", "%j"],
        stdout=subprocess.PIPE,
        text=True,
        errors="replace",  # a chunk (not a placeholder) is binary: FAILED, not a traceback
    )  # fmt: skip
    time.sleep(1.0)  # both subscriptions in place before the publish
    t0 = time.monotonic()
    pub = subprocess.run(
        ["offload", "publish", "--broker", mqtt, "--topic", topic, "--file", str(big),
         "--qos", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )  # fmt: skip
    sub_out, _ = sub.communicate(timeout=90)
    raw_out, _ = raw.communicate(timeout=90)
    elapsed = time.monotonic() - t0
    _show("offload publish", pub)
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
        ok = ok and placeholder and int(seen.get("payloadlen", 1 << 30)) < MAX_PACKET
    except (IndexError, ValueError):
        print(f"    mosquitto_sub printed nothing usable: {raw_out!r}")
        ok = False
    big.unlink()
    ok = proxy_check(files.state, proxy_port, USER, files.made.password) and ok
    print("==> self-check " + ("PASSED" if ok else "FAILED"))
    return ok


def _logins(files: Files) -> str:
    """Where the broker's and the gateway's logins come from, in a few words."""
    if dynsec.enabled():
        return f"dynamic security plugin, {dynsec.dynsec_file(files)}"
    return f"password file and ACL in {files.passwd.parent}"


def _administer(broker: Mosquitto) -> str:
    """The banner's line for STACK_AUTH=dynsec: how `demo` changes the logins."""
    if not dynsec.enabled():
        return ""
    return (
        f'\n  mosquitto_ctrl -u {USER} -P "$OFFLOAD_PASSWORD" -p {broker.port} dynsec listClients'
        "   # dynamic security is on: the gateway follows every change"
    )


def banner(files: Files, broker: Mosquitto, gw_port: int, s3: SeaweedFS) -> str:
    """Commands a user can paste into a new shell as they are."""
    bindir = Path(shutil.which("offload") or sys.executable).parent
    activate = bindir / "activate"
    path_line = (
        f"source {activate}" if activate.exists() else f'export PATH="{bindir}:$PATH"'
    ) + "   # puts offload, offload-gateway, offload-spark on PATH"
    gw = f"https://127.0.0.1:{gw_port}"
    login = '--cacert "$OFFLOAD_CA_FILE" -u "$OFFLOAD_USERNAME:$OFFLOAD_PASSWORD"'
    return f"""
Serving. In another shell:
  {path_line}
  source {files.state / "env"}   # this stack: broker, user {USER} and its password, CA, S3
  offload subscribe --topic 'demo/#' &
  offload publish --topic demo/big --file /path/to/large.bin
  curl -s {login} --data-binary @/path/to/file {gw}/publish/demo/curl
  curl -s --cacert "$OFFLOAD_CA_FILE" {gw}/readyz
  mosquitto_pub -p "$STACK_PROXY_PORT" -u "$OFFLOAD_USERNAME" -P "$OFFLOAD_PASSWORD" \
-t demo/any -s < /path/to/large.bin   # any MQTT client, through offload-proxy{_administer(broker)}
S3 for Spark or any S3 tool: endpoint http://{s3.endpoint}  bucket offload  access key \
{s3.access_key}  secret key {s3.secret_key}
API docs: {gw}/docs   Logs: {files.state}/   Ctrl-C stops everything (data and logs are kept)."""


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_all(
    proxy: subprocess.Popen[bytes] | None,
    gateway: subprocess.Popen[bytes] | None,
    broker: Mosquitto,
    s3: SeaweedFS,
) -> str:
    """Stop every server within a bound, whatever state each is in; say how long each took.

    The gateway goes first (it lets in-flight requests finish for GATEWAY_SHUTDOWN seconds,
    then is killed) while it can still reach the broker and the store; then the broker and the
    store are signalled together and waited for side by side (SeaweedFS.stop kills its group
    after a second; mosquitto gets 5 s).
    """
    took: list[str] = []
    t0 = time.monotonic()
    stop_proxy(proxy)  # first: its transfers need the gateway and the broker
    took.append(f"offload-proxy {time.monotonic() - t0:.1f} s")
    t0 = time.monotonic()
    if gateway is not None and gateway.poll() is None:
        gateway.terminate()
        try:
            gateway.wait(GATEWAY_SHUTDOWN + 5)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()
    took.append(f"gateway {time.monotonic() - t0:.1f} s")
    t1 = time.monotonic()
    if broker.proc is not None and broker.proc.poll() is None:
        broker.proc.terminate()  # now, so it stops while SeaweedFS does
    s3.stop()
    took.append(f"SeaweedFS {time.monotonic() - t1:.1f} s")
    if broker.proc is not None:
        try:
            broker.proc.wait(max(0.0, 5 - (time.monotonic() - t1)))
        except subprocess.TimeoutExpired:
            broker.proc.kill()
            broker.proc.wait()
        broker.proc = None
    took.append(f"mosquitto {time.monotonic() - t1:.1f} s")
    return ", ".join(took)


def run(args: argparse.Namespace) -> int:
    state = Path(os.environ.get("STACK_DIR") or ROOT / ".stack").resolve()
    with exclusive(state):
        s3_port = requested_port("STACK_S3_PORT", 8333, grpc=True)
        mqtt_port = requested_port("STACK_MQTT_PORT", 1883)
        gw_wanted = requested_port("STACK_GATEWAY_PORT", 8080)
        proxy_wanted = requested_port("STACK_PROXY_PORT", 1884)
        if args.clean:
            print(f"==> --clean: erasing {state}")
            shutil.rmtree(state, ignore_errors=True)  # ours alone: the lock is held
        elif state.exists():
            print(f"==> keeping the data and logs in {state} (--clean starts afresh)")
        state.mkdir(parents=True, exist_ok=True)
        rotate_logs(state)
        files = Files.make(state)
        s3 = SeaweedFS(workdir=state / "seaweedfs", s3_port=s3_port)
        s3.workdir.mkdir(exist_ok=True)
        broker = Mosquitto(
            max_packet_size=MAX_PACKET,
            port=mqtt_port,
            workdir=state / "mosquitto",
            extra_config=dynsec.broker_config(files) if dynsec.enabled() else files.broker_config(),
        )
        broker.workdir.mkdir(exist_ok=True)
        gateway: subprocess.Popen[bytes] | None = None
        proxy: subprocess.Popen[bytes] | None = None
        parts: list[Part] = []
        try:
            print(f"==> SeaweedFS S3 on 127.0.0.1:{s3_port or '<free port>'}")
            s3.start()
            print(f"==> mosquitto on 127.0.0.1:{broker.port or '<free port>'} "
                  f"(max_packet_size {MAX_PACKET}; {_logins(files)})")  # fmt: skip
            broker.start()
            gateway, gw_port = start_gateway(files, s3, broker, gw_wanted)
            gw_url = f"https://127.0.0.1:{gw_port}"
            direct = "on" if DIRECT_TRANSFERS else "off"
            print(f"==> gateway on {gw_url}  (S3 {s3.endpoint}, MQTT {broker.url}, "
                  f"direct transfers {direct})")  # fmt: skip
            proxy, proxy_port = start_proxy(state, broker, gw_url, files.ca, proxy_wanted)
            print(f"==> offload-proxy on mqtt://127.0.0.1:{proxy_port} (any MQTT client, any size)")
            client = files.client_env(broker, gw_url, s3) | {"STACK_PROXY_PORT": str(proxy_port)}
            write_env(state / "env", client)
            ok = self_check(files, broker, gw_url, client, proxy_port)
            if args.check or not ok:
                return 0 if ok else 1
            print(banner(files, broker, gw_port, s3), flush=True)
            parts = _parts(files, s3, broker, gateway, gw_port, proxy, proxy_port)
            reason = watch(parts)  # until Ctrl-C, or a part that cannot be kept running
            print(f"==> stopping the stack: {reason}", flush=True)
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            if parts:
                gateway, proxy = parts[0].proc, parts[1].proc
            t0 = time.monotonic()
            took = stop_all(proxy, gateway, broker, s3)
            print(f"==> stopped in {time.monotonic() - t0:.1f} s ({took})", flush=True)


def _parts(
    files: Files,
    s3: SeaweedFS,
    broker: Mosquitto,
    gateway: subprocess.Popen[bytes],
    gw_port: int,
    proxy: subprocess.Popen[bytes],
    proxy_port: int,
) -> list[Part]:
    """The processes the watch looks after (scripts/_stack_watch.py), each with how it is
    started again where it was: the gateway and the proxy first, as stop_all wants them."""
    gw_url = f"https://127.0.0.1:{gw_port}"

    def store() -> subprocess.Popen[bytes] | None:
        s3.start()  # its four ports are fixed now: the same ones
        return s3.proc

    def mosquitto() -> subprocess.Popen[bytes] | None:
        broker.start()  # its port is fixed now: the same one
        return broker.proc

    return [
        Part("gateway", gw_url, files.state / "gateway.log", gateway,
             lambda: start_gateway(files, s3, broker, gw_port)[0]),
        Part("offload-proxy", f"mqtt://127.0.0.1:{proxy_port}", files.state / "proxy.log",
             proxy, lambda: start_proxy(files.state, broker, gw_url, files.ca, proxy_port)[0]),
        Part("mosquitto", broker.url, broker.workdir / "mosquitto.log", broker.proc, mosquitto),
        Part("SeaweedFS", f"http://{s3.endpoint}", s3.workdir / "weed.log", s3.proc, store),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit after the self-check")
    parser.add_argument(
        "--clean", action="store_true", help="erase the state directory (data, logs, logins) first"
    )
    args = parser.parse_args()
    # Ctrl-C, `kill` and a closed terminal all stop as cleanly. SIGINT is set explicitly: a
    # process started in the background by a non-interactive shell (`up.sh &` in a script, a
    # CI job) inherits SIGINT ignored, and Python then leaves it so: Ctrl-C did nothing.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    try:
        return run(args)
    except (StackError, PortInUse) as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
