"""One request at a time per tus upload (gateway/_upload_locks.py), the locks alone; through
the running gateway in tests/test_resumable.py (`..._takes_over_...`)."""

from __future__ import annotations

import asyncio

import pytest

from gateway._upload_locks import UploadInterrupted, UploadLocked, UploadLocks


def test_a_newer_request_interrupts_a_holder_receiving() -> None:
    async def main() -> list[str]:
        locks = UploadLocks(wait=5)
        seen: list[str] = []
        receiving = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("u") as hold:
                try:
                    async with hold.interruptible():
                        receiving.set()
                        await asyncio.sleep(60)  # a body that is slow to come
                except UploadInterrupted:
                    seen.append("interrupted")

        task = asyncio.create_task(holder())
        await receiving.wait()
        began = asyncio.get_running_loop().time()
        async with locks.hold("u"):
            seen.append(f"newer after {asyncio.get_running_loop().time() - began:.1f}")
        await task
        assert len(locks) == 0
        return seen

    assert asyncio.run(main()) == ["interrupted", "newer after 0.0"]


def test_a_holder_past_its_interruptible_part_is_waited_for() -> None:
    async def main() -> list[str]:
        locks = UploadLocks(wait=5)
        seen: list[str] = []
        saving = asyncio.Event()

        async def holder() -> None:
            async with locks.hold("u") as hold:
                async with hold.interruptible():
                    pass  # received and stored
                saving.set()
                await asyncio.sleep(0.3)  # saving the state: not interrupted
                seen.append("saved")

        task = asyncio.create_task(holder())
        await saving.wait()
        async with locks.hold("u"):
            seen.append("newer")
        await task
        return seen

    assert asyncio.run(main()) == ["saved", "newer"]


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
        async with locks.hold("u"):  # and the upload is free again
            pass

    asyncio.run(main())


def test_a_release_asked_before_the_interruptible_part_stops_it_at_once() -> None:
    async def main() -> None:
        locks = UploadLocks(wait=5)
        loaded = asyncio.Event()
        go_on = asyncio.Event()
        outcome: list[str] = []

        async def holder() -> None:
            async with locks.hold("u") as hold:
                loaded.set()
                await go_on.wait()  # loading the state when the newer request comes
                try:
                    async with hold.interruptible():
                        outcome.append("received")
                except UploadInterrupted:
                    outcome.append("interrupted")

        task = asyncio.create_task(holder())
        await loaded.wait()
        newer = asyncio.create_task(_hold_briefly(locks))
        await asyncio.sleep(0.05)
        go_on.set()
        await asyncio.gather(task, newer)
        assert outcome == ["interrupted"]

    asyncio.run(main())


async def _hold_briefly(locks: UploadLocks) -> None:
    async with locks.hold("u"):
        pass
