"""proxy/_handoff.py: the bounded channels between the event loop and a transfer's worker
thread. Each side must give up when the other does (a thread blocked on a full channel
whose reader left would hold a worker forever; a loop side waiting for room from a thread
that ended would hang the client's connection)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from proxy._handoff import FromLoop, Stopped, ToLoop


async def _in_thread(fn: object) -> object:
    return await asyncio.get_running_loop().run_in_executor(None, fn)  # type: ignore[arg-type]


def test_to_loop_holds_at_most_depth_and_the_thread_waits_for_room() -> None:
    async def main() -> None:
        channel: ToLoop[int] = ToLoop(asyncio.get_running_loop(), depth=2)
        handed: list[int] = []

        def producer() -> None:
            for i in range(5):
                channel.put(i)
                handed.append(i)

        job = asyncio.ensure_future(_in_thread(producer))
        while len(handed) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert handed == [0, 1]  # the third waits: nobody has read
        got = [await channel.get() for _ in range(5)]
        await job
        assert got == [0, 1, 2, 3, 4]

    asyncio.run(main())


def test_to_loop_a_thread_waiting_for_room_gives_up_when_the_loop_side_stops() -> None:
    async def main() -> None:
        channel: ToLoop[int] = ToLoop(asyncio.get_running_loop(), depth=1)
        outcome: list[str] = []

        def producer() -> None:
            channel.put(0)
            try:
                channel.put(1)  # full: waits
            except Stopped:
                outcome.append("stopped")

        job = asyncio.ensure_future(_in_thread(producer))
        await asyncio.sleep(0.1)
        channel.stop()
        await asyncio.wait_for(job, 5)
        assert outcome == ["stopped"]

    asyncio.run(main())


def test_from_loop_the_loop_waits_for_room_and_the_thread_gets_in_order() -> None:
    async def main() -> None:
        channel: FromLoop[bytes] = FromLoop(asyncio.get_running_loop(), depth=2)
        await channel.put(b"a")
        await channel.put(b"b")
        third = asyncio.ensure_future(channel.put(b"c"))
        await asyncio.sleep(0.1)
        assert not third.done()  # full until the thread takes one
        got = await _in_thread(lambda: channel.get(5))
        await asyncio.wait_for(third, 5)
        rest = await _in_thread(lambda: [channel.get(5), channel.get(5)])
        assert [got, *rest] == [b"a", b"b", b"c"]  # type: ignore[list-item]

    asyncio.run(main())


def test_from_loop_a_loop_side_waiting_for_room_gives_up_when_the_thread_is_gone() -> None:
    async def main() -> None:
        channel: FromLoop[bytes] = FromLoop(asyncio.get_running_loop(), depth=1)
        await channel.put(b"a")
        blocked = asyncio.ensure_future(channel.put(b"b"))
        await asyncio.sleep(0.05)
        threading.Thread(target=channel.gone).start()  # the upload ended (a refusal, say)
        with pytest.raises(Stopped):
            await asyncio.wait_for(blocked, 5)
        with pytest.raises(Stopped):
            await channel.put(b"c")  # and every later piece too

    asyncio.run(main())


def test_from_loop_abort_and_silence_end_the_threads_wait() -> None:
    async def main() -> None:
        channel: FromLoop[bytes] = FromLoop(asyncio.get_running_loop(), depth=2)
        with pytest.raises(TimeoutError):
            await _in_thread(lambda: channel.get(0.1))  # the client went quiet
        channel.abort()
        with pytest.raises(Stopped):
            await _in_thread(lambda: channel.get(5))  # the loop side gave up

    asyncio.run(main())
