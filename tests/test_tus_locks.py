"""One request at a time per tus upload (gateway/tus/_locks.py), the locks alone; through
the running gateway in tests/test_resumable.py and tests/test_cli_upload.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.tus._locks import Hold, UploadInterrupted, UploadLocked, UploadLocks


async def _body(pieces: int, every: float) -> AsyncIterator[bytes]:
    for _ in range(pieces):
        await asyncio.sleep(every)
        yield b"x" * 1024


async def _patch(hold: Hold, body: AsyncIterator[bytes], seen: list[str]) -> None:
    """A PATCH's interruptible part: receive the body (and store it)."""
    try:
        async with hold.interruptible():
            received = 0
            async for piece in hold.feed(body):
                received += len(piece)
            seen.append(f"received {received}")
    except UploadInterrupted:
        seen.append("interrupted")


async def _patching(
    locks: UploadLocks, body: AsyncIterator[bytes], seen: list[str], *, loading: float = 0.0
) -> asyncio.Task[None]:
    """A PATCH holding upload "u" (its task): it spends `loading` seconds loading the state
    after this returns, then receives `body`."""
    holding = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("u") as hold:
            holding.set()
            await asyncio.sleep(loading)
            await _patch(hold, body, seen)

    task = asyncio.create_task(holder())
    await holding.wait()
    return task


def test_a_patch_whose_body_stalled_is_stopped_by_a_newer_request() -> None:
    async def main() -> tuple[list[str], float]:
        locks = UploadLocks(wait=5, stall=0.3)
        seen: list[str] = []
        task = await _patching(locks, _body(1, 60), seen)  # its client went silent
        began = asyncio.get_running_loop().time()
        async with locks.hold("u") as newer:
            waited = asyncio.get_running_loop().time() - began
            assert newer.took_over
        await task
        assert len(locks) == 0
        return seen, waited

    seen, waited = asyncio.run(main())
    assert seen == ["interrupted"]
    assert 0.25 < waited < 2  # once the body had stalled for `stall` seconds


def test_a_patch_that_stalls_after_the_newer_request_came_is_stopped_too() -> None:
    async def main() -> list[str]:
        locks = UploadLocks(wait=5, stall=0.2)
        seen: list[str] = []
        # Loading the state when the newer request comes; then its client goes silent.
        task = await _patching(locks, _body(1, 60), seen, loading=0.1)
        async with locks.hold("u"):
            seen.append("newer")
        await task
        return seen

    assert asyncio.run(main()) == ["interrupted", "newer"]  # not a 423 after `wait`


def test_a_patch_still_receiving_is_waited_for_not_stopped() -> None:
    async def main() -> list[str]:
        locks = UploadLocks(wait=5, stall=0.3)
        seen: list[str] = []
        task = await _patching(locks, _body(10, 0.1), seen)  # 1 s of body, a piece every 0.1 s
        async with locks.hold("u"):  # a HEAD polling the progress
            seen.append("newer")
        await task
        return seen

    assert asyncio.run(main()) == ["received 10240", "newer"]


def test_a_patch_storing_what_it_received_is_waited_for() -> None:
    async def main() -> list[str]:
        locks = UploadLocks(wait=5, stall=0.1)
        seen: list[str] = []
        storing = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("u") as hold:
                async with hold.interruptible():
                    async for _ in hold.feed(_body(1, 0)):
                        pass
                    storing.set()
                    await asyncio.sleep(0.5)  # the store takes its time: not the client's
                seen.append("stored")

        task = asyncio.create_task(holder())
        await storing.wait()
        async with locks.hold("u"):
            seen.append("newer")
        await task
        return seen

    assert asyncio.run(main()) == ["stored", "newer"]


def test_take_over_stops_a_patch_at_once() -> None:
    async def main() -> tuple[list[str], float]:
        locks = UploadLocks(wait=5, stall=10)
        seen: list[str] = []
        task = await _patching(locks, _body(100, 0.05), seen)  # a live body
        began = asyncio.get_running_loop().time()
        async with locks.hold("u", take_over=True):  # DELETE
            waited = asyncio.get_running_loop().time() - began
        await task
        return seen, waited

    seen, waited = asyncio.run(main())
    # At once, not after the lock's 5 s wait (the bound leaves room for a loaded machine).
    assert seen == ["interrupted"] and waited < 2.5


def test_a_release_asked_before_the_interruptible_part_stops_it_at_entry() -> None:
    async def main() -> list[str]:
        locks = UploadLocks(wait=5)
        seen: list[str] = []
        loaded = asyncio.Event()
        go_on = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("u") as hold:
                loaded.set()
                await go_on.wait()  # loading the state when the DELETE comes
                await _patch(hold, _body(1, 0), seen)

        task = asyncio.create_task(holder())
        await loaded.wait()

        async def delete() -> None:
            async with locks.hold("u", take_over=True):
                seen.append("deleted")

        newer = asyncio.create_task(delete())
        await asyncio.sleep(0.05)
        go_on.set()
        await asyncio.gather(task, newer)
        return seen

    assert asyncio.run(main()) == ["interrupted", "deleted"]


def test_a_holder_that_does_not_let_go_in_time_is_423_and_others_proceed() -> None:
    async def main() -> None:
        locks = UploadLocks(wait=0.2)
        release = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("u"):
                await release.wait()

        task = asyncio.create_task(holder())
        await asyncio.sleep(0)
        with pytest.raises(UploadLocked) as refused:
            async with locks.hold("u"):
                pass
        assert refused.value.status == 423 and refused.value.headers["Retry-After"] == "1"
        async with locks.hold("other"):  # another upload is not held up
            pass
        release.set()
        await task
        async with locks.hold("u") as hold:  # and the upload is free again
            assert not hold.took_over

    asyncio.run(main())
