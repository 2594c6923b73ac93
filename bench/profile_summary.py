"""Sum a py-spy raw profile (`BENCH_PROFILE=...`) per function, idle frames left out.

py-spy samples threads that wait (a pool worker on its queue, a condition, the event loop
in `select`) as if they ran; those leaves are dropped here, so the percentages are shares
of the samples where the gateway did work. Inclusive counts: a function's share includes
what it called.

    BENCH_PROFILE=/tmp/p.txt python bench/concurrency.py
    python bench/profile_summary.py /tmp/p.txt --match 'gateway/|minio/' --top 60
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

# Leaf frames of a thread that waits rather than works.
WAITING = (
    "_worker (concurrent/futures/thread.py:81)",
    "Condition.wait",
    "Runner.run",
    "Connection._recv",
    "poll_wait_for_socket",
    "SocketIO.readinto",
    "select (selectors",
    "_wait_for_tstate_lock",
)


def summarise(path: str) -> tuple[Counter[str], Counter[str], int, int]:
    """(inclusive, self) samples per function, busy samples, waiting samples."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    busy = waiting = 0
    with open(path) as lines:
        for line in lines:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
            if any(frames[-1].startswith(w.split(" (")[0]) for w in WAITING):
                waiting += n
                continue
            busy += n
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    return inclusive, own, busy, waiting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--match", default="", help="regex: only functions matching it")
    parser.add_argument("--top", type=int, default=50)
    args = parser.parse_args()
    inclusive, own, busy, waiting = summarise(args.profile)
    print(f"busy samples {busy}, waiting samples {waiting} (left out)")
    shown = [(f, n) for f, n in inclusive.most_common() if re.search(args.match, f)]
    for frame, n in shown[: args.top]:
        print(f"{n:7d} {100 * n / max(busy, 1):5.1f} %  {frame[:130]}")
    print("-- self")
    for frame, n in own.most_common(20):
        print(f"{n:7d} {100 * n / max(busy, 1):5.1f} %  {frame[:130]}")


if __name__ == "__main__":
    main()
