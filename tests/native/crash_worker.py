"""A torch CPU "rank" that trains two optimizer steps (so the hook has its
segment), then ends the way argv[1] says:
  raise   an uncaught RuntimeError from ``load_batch``, with a custom
          sys.excepthook installed before torch (it must still run)
  abort   os.abort() (SIGABRT)
  segv    a read of address 0 (SIGSEGV)
  exit3   sys.exit(3)
  early   an uncaught exception before any training step (no segment: not a rank yet)
  term    has its own SIGTERM handler (installed before the hook starts); prints "ready",
          waits for SIGTERM, says so and exits 0
  thread  a thread named "prefetcher" dies of a ValueError; the process lives on
"""

import sys


def custom_hook(exc_type, exc, tb):
    print(f"custom hook saw {exc_type.__name__}", file=sys.stderr, flush=True)
    sys.__excepthook__(exc_type, exc, tb)


MODE = sys.argv[1]
if MODE == "raise":
    sys.excepthook = custom_hook

import ctypes  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402


def load_batch():
    raise RuntimeError("boom while loading batch 7")


def prefetch():
    raise ValueError("bad sample in prefetcher")


if MODE == "early":
    load_batch()
terminated = threading.Event()
if MODE == "term":
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.set())
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()

if MODE == "raise":
    load_batch()
elif MODE == "abort":
    os.abort()
elif MODE == "segv":
    ctypes.string_at(0)
elif MODE == "exit3":
    sys.exit(3)
elif MODE == "thread":
    worker = threading.Thread(target=prefetch, name="prefetcher")
    worker.start()
    worker.join()
    print("alive", flush=True)
    time.sleep(120)
elif MODE == "term":
    print("ready", flush=True)
    while not terminated.wait(0.05):
        pass
    print("SIGTERM handled, exiting cleanly", flush=True)
