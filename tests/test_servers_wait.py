"""tests/_servers.py's wait for a server process: a slow start on a loaded machine is waited
for, and a hang is told at once (`stall`: the process and its children use no CPU), so a
generous timeout hides nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from _servers import free_port, wait_for_port, wait_until

# A supervisor that sleeps while its child works, as uvicorn's parent does while its workers
# import the gateway: the child computes for 4 s (longer than the stall below), then listens.
SUPERVISOR = """
import subprocess, sys
child = '''
import socket, sys, time
end = time.process_time() + 4
while time.process_time() < end:
    pass
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
time.sleep(60)
'''
subprocess.run([sys.executable, "-c", child, sys.argv[1]])
"""


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_process_that_uses_no_cpu_is_a_hang_told_within_the_stall(
    started: list[subprocess.Popen[bytes]],
) -> None:
    started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="has used no CPU for 2s: a hang"):
        wait_until(lambda: False, "a sleeper", 60, started[0], stall=2)
    assert time.monotonic() - start < 10  # not the 60 s timeout


def test_a_start_that_keeps_a_child_busy_is_waited_for_past_the_stall(
    started: list[subprocess.Popen[bytes]],
) -> None:
    port = free_port()
    started.append(subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(port)]))
    wait_for_port(port, 60, started[0], stall=2)  # 4 s of CPU (longer on a loaded machine)
