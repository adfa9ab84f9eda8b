"""A torch CPU "rank" under `tuiprof run` that trains two optimizer steps (so the startup hook has
published PyTorch's caching allocator figures, or why there are none), then, as argv[1] says:
  live  prints "ready" and waits for a line on stdin
  oom   raises torch.cuda.OutOfMemoryError from ``grow_activations`` (uncaught: the crash report)
"""

import sys

import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()


def grow_activations():
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


if sys.argv[1] == "oom":
    grow_activations()
print("ready", flush=True)
sys.stdin.readline()
