"""What one thread wakeup costs in CPU on this machine (issue 14: the console's threads wake
several times a second; on a VM each wakeup of an idle vCPU can cost far more than the work).

Three patterns, each for --seconds, the process's CPU (user + system, /proc) per wakeup:
- ``sleep``: one thread sleeping 10 ms in a loop (a timer wakes it: 100 wakeups a second);
- ``handoff``: two threads passing a turn through threading.Event, every 10 ms (a wakeup of
  another thread, as a collector hands a sample over);
- ``asyncio``: an asyncio loop woken every 10 ms from another thread by call_soon_threadsafe
  (a snapshot handed to the console's loop).

    python3 bench/console/wakeup_cost.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time


def cpu() -> float:
    times = os.times()
    return times.user + times.system


def sleeping(seconds: float) -> int:
    wakeups, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
        wakeups += 1
    return wakeups


def handoff(seconds: float) -> int:
    ping, pong = threading.Event(), threading.Event()
    count = [0]

    def other() -> None:
        while ping.wait():
            ping.clear()
            count[0] += 1
            pong.set()
            if count[0] < 0:
                return

    threading.Thread(target=other, daemon=True).start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
        ping.set()
        pong.wait()
        pong.clear()
    return 2 * count[0]  # the other thread woken, and this one woken by the answer (besides its sleep)


def through_asyncio(seconds: float) -> int:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        count = [0]

        def tick() -> None:
            count[0] += 1

        def feeder() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(0.01)
                loop.call_soon_threadsafe(tick)
            loop.call_soon_threadsafe(done.set)

        threading.Thread(target=feeder, daemon=True).start()
        await done.wait()
        return count[0]
    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    result: dict[str, object] = {"cpus": os.cpu_count()}
    for name, pattern in (("sleep", sleeping), ("handoff", handoff), ("asyncio", through_asyncio)):
        start = cpu()
        wakeups = pattern(args.seconds)
        used = cpu() - start
        result[name] = {"wakeups": wakeups, "cpu_us_per_wakeup": round(used / max(wakeups, 1) * 1e6, 1),
                        "cpu_ms_per_s": round(used / args.seconds * 1000, 2)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
