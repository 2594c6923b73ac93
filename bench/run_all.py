"""Run every benchmark one after the other and print one table.

Each benchmark runs as its own process (they start their own SeaweedFS, mosquitto and
gateway) and prints a `RESULT <json>` line (bench/_harness.py), or, for the older scripts
(chunking.py, small_messages.py, spark_read.py), its usual text, which is
parsed here. Nothing else may run on the machine meanwhile: the numbers are ratios against
baselines taken in the same run, but 2 cores are easily disturbed.

    python bench/run_all.py                    # about 9 minutes on 2 cores
    python bench/run_all.py --quick            # fewer runs, smaller memory test
    python bench/run_all.py --only 1 6         # benchmarks by number (or name: startup)
    python bench/run_all.py --spark            # also bench/spark_read.py (needs pyspark)
    python bench/run_all.py --only huge        # opt-in: 10 GiB through the CLI (bench/huge.py,
                                               # ~20 GiB of free disk, several minutes)
    python bench/run_all.py --only clients     # MinIO SDK vs obstore (obstore in /tmp/obstore_pkg)
    python bench/run_all.py --only proxy       # offload-proxy (bench/proxy.py, issue 28)
    python bench/run_all.py --only tracing     # 1 KB and 64 MiB: tracing absent, off, on
                                               # (bench/tracing.py, issue 46)
    python bench/run_all.py --only relay       # small messages: straight, HAProxy, offload-proxy
                                               # (bench/proxy_relay.py, issue 44; needs haproxy)
    python bench/run_all.py --only fleet       # HAProxy + PROXY v2 to 1 or 2 proxies, --workers 2
    python bench/run_all.py --only storm       # 5,000 devices reconnecting: straight, offload-proxy
                                               # (bench/proxy_storm.py, issue 50)
    python bench/run_all.py --only encryption spark-encrypted   # issue 30's three rows
    python bench/run_all.py --only 1 mixed     # issue 31's table: gateway / nginx both ways,
                                               # RSS per transfer, the chart's maxTransfers
    python bench/run_all.py --only small       # 256 KiB transfers at once: the fixed cost
    python bench/run_all.py --markdown         # the table as Markdown (for RESULTS.md)
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MiB = 1 << 20


def _cmd(name: str, quick: bool) -> list[str]:
    args = {
        "1": ["gateway_vs_s3.py", "--runs", "4" if quick else "8"],
        "2": ["end_to_end.py", "--runs", "1" if quick else "3"],
        "3": ["small_messages.py", "--blocks", "3" if quick else "5"],
        "4": ["chunking.py", "--runs", "20" if quick else "50"],
        "5": ["memory.py", "--size", str((256 if quick else 1024) * MiB)],
        "6": ["concurrency.py", "--requests", "15" if quick else "30"],
        "7": [
            "load.py",
            "--concurrency",
            *(["8"] if quick else ["8", "32"]),
            "--size-mib",
            "16" if quick else "32",
        ],
        "8": ["hol.py", "--runs", "1" if quick else "3"],
        "mixed": ["load.py", "--mixed-only"],
        "telemetry": ["telemetry_latency.py", "--blocks", "2" if quick else "3"],
        "qos0": ["qos0_rate.py", "--blocks", "2" if quick else "3"],
        "receive": ["receive_rate.py", "--blocks", "2" if quick else "5"],
        "protocol": ["http_protocol.py", "--rounds", "6" if quick else "12"],
        "direct": ["direct.py", "--runs", "4" if quick else "8"],
        "startup": ["startup.py", "--runs", "10" if quick else "20"],
        "spark": ["spark_read.py", "--store", "both", "--objects", "16" if quick else "64"],
        "huge": ["huge.py", "--size-gib", "1" if quick else "10"],
        "clients": ["store_clients.py", "--runs", "3" if quick else "6"],
        "small": ["small_transfers.py", "--seconds", "5" if quick else "10"],
        "proxy": [
            "proxy.py",
            "--rounds",
            "1" if quick else "3",
            "--concurrent",
            "8" if quick else "16",
        ],
        "relay": ["proxy_relay.py", "--rounds", "1" if quick else "3"],
        "fleet": ["proxy_relay.py", "--only-fleet", "--rounds", "1" if quick else "3"],
        "storm": ["proxy_storm.py", "--rounds", "1" if quick else "3"],
        "encryption": ["encryption.py", "--runs", "2" if quick else "3"],
        "spark-encrypted": ["spark_read.py", "--encrypted", "--objects", "16"],
        "tracing": [
            "tracing.py",
            "--blocks",
            "2" if quick else "10",
            "--messages",
            "1000" if quick else "2000",
            "--large",
            "1" if quick else "3",
        ],
    }[name]
    return [sys.executable, str(HERE / args[0]), *args[1:]]


def _rows_from_text(name: str, out: str) -> list[dict[str, object]]:
    """Rows for the scripts that print prose rather than RESULT lines."""
    rows: list[dict[str, object]] = []
    if name == "3":
        m = re.search(r"paho (\d+) msg/s, Client.publish (\d+) msg/s, ratio ([\d.]+)", out)
        if m:
            base, cand, ratio = float(m[1]), float(m[2]), float(m[3])
            rows.append(_row("3 small messages", "1 KiB QoS 1 rate", base, cand, "msg/s", ratio,
                             ">= 0.9", ratio >= 0.9))  # fmt: skip
    elif name == "4":
        pattern = (
            r"QoS (\d): chunked median ([\d.]+) ms p90 [\d.]+ ms \| single-message baseline "
            r"median ([\d.]+) ms"
        )
        for qos, cand, base in re.findall(pattern, out):
            c = float(cand)
            rows.append(_row("4 chunking", f"1 MiB via 64 KiB, QoS {qos}, median", float(base),
                             c, "ms", c / float(base), "< 50 ms", c < 50))  # fmt: skip
    elif name == "spark":
        for line in out.splitlines():
            if "MiB/s" in line:
                print(f"  spark: {line.strip()}")
    return rows


def _row(
    bench: str,
    metric: str,
    base: float | None,
    cand: float,
    unit: str,
    ratio: float | None,
    target: str,
    met: bool | None,
) -> dict[str, object]:
    return {"bench": bench, "metric": metric, "baseline": base, "candidate": cand,
            "unit": unit, "ratio": ratio, "target": target, "met": met}  # fmt: skip


def run(name: str, quick: bool) -> list[dict[str, object]]:
    cmd = _cmd(name, quick)
    print(f"# {' '.join(Path(c).name if c.endswith('.py') else c for c in cmd[1:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if not line.startswith("RESULT "):
            print(f"  {line}")
    print(f"  ({time.monotonic() - t0:.0f} s, exit {proc.returncode})", flush=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        print("  " + "\n  ".join(tail))
        return [_row(name, "FAILED", None, float("nan"), "", None, "", False)]
    results = [
        json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")
    ]
    return [r for rs in results for r in rs] or _rows_from_text(name, proc.stdout)


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(rows: list[dict[str, object]], markdown: bool) -> str:
    head = ["benchmark", "metric", "baseline", "candidate", "unit", "ratio", "target", "met"]
    body = [
        [str(r["bench"]), str(r["metric"]), _fmt(r["baseline"]), _fmt(r["candidate"]),
         str(r["unit"]), _fmt(r["ratio"], 2), str(r["target"]),
         {True: "yes", False: "NO", None: "-"}[r["met"]]]  # type: ignore[index]
        for r in rows
    ]  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*cells) for cells in body])  # fmt: skip


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", cpuinfo)
    cores = cpuinfo.count("processor\t:")
    mem = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
    ram = f"{int(mem[1]) / 2**20:.0f} GiB" if mem else "?"
    cpu = model[1] if model else "?"
    system = f"{platform.system()} {platform.release()}"
    return f"{cores} x {cpu}, {ram} RAM, {system}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[
            "1",
            "2",
            "3",
            "4",
            "5",
            "6",
            "7",
            "8",
            "mixed",
            "telemetry",
            "qos0",
            "receive",
            "protocol",
            "direct",
            "startup",
            "spark",
            "huge",
            "clients",
            "small",
            "proxy",
            "relay",
            "fleet",
            "storm",
            "encryption",
            "spark-encrypted",
            "tracing",
        ],
    )
    parser.add_argument("--spark", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    names = args.only or [
        "1", "2", "3", "4", "5", "6", "7", "8", "telemetry", "qos0", "receive",
        "protocol", "direct", "startup", "small", "proxy", "relay", "encryption", "tracing",
        *(["spark", "spark-encrypted"] if args.spark else []),
    ]  # fmt: skip
    print(f"machine: {machine()}")
    rows: list[dict[str, object]] = []
    for name in names:
        rows.extend(run(name, args.quick))
    print()
    print(table(rows, args.markdown))


if __name__ == "__main__":
    main()
