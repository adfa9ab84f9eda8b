"""How long a machine takes to touch memory a process left idle for a second: a pass over 160 of 200,000 small
objects (their attributes read into a dict, as the ranks collector's first pass over its ranks does), timed after
a one-second sleep and again at once.

On the 2-vCPU VM these benches run on the first pass takes 40-50 ms and the second 0.3-2 ms, asleep or busy in
between, with no page fault in the guest: memory left alone a second is slow to reach again there, and every
figure of ranks_cost.py (CPU time, which that waiting counts as) carries it. A machine where both passes take
well under a millisecond does not.
"""

from __future__ import annotations

import platform
import random
import statistics
import time

OBJECTS, TOUCHED, ROUNDS = 200_000, 160, 6


class Holder:
    def __init__(self, i: int) -> None:
        self.candidate = object()
        self.padding = [i] * 50  # objects spread over memory as a collector's state is


def main() -> None:
    objects = {str(i): Holder(i) for i in range(OBJECTS)}
    touched = {key: objects[key] for key in random.Random(1).sample(list(objects), TOUCHED)}
    first, again = [], []
    for _ in range(ROUNDS):
        time.sleep(1.0)
        for passes in (first, again):
            began = time.perf_counter()
            _ = {path: holder.candidate for path, holder in touched.items()}
            passes.append((time.perf_counter() - began) * 1e3)
    print(f"idle memory on {platform.node()}: a pass over {TOUCHED} objects after 1 s asleep "
          f"{statistics.median(first):.3f} ms (median of {ROUNDS}), at once again {statistics.median(again):.3f} ms")


if __name__ == "__main__":
    main()
