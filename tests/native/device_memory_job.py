"""A job that allocates and copies device memory through a CUDA runtime, counting what it did itself.

    python device_memory_job.py LIBCUDART

Run under ``tuiprof run`` with the stand-in runtime (tests/native/standins/cudart.c). The runtime is
loaded into the global scope and its functions called through it, as PyTorch's libraries call them:
the preloaded hook's interposers come first there. One allocation is made straight through the
runtime's own handle (which the hook does not see) and freed through the global scope: a free of
unknown size. Prints the job's own counts as one JSON line, then "READY" once the hook has written
everything into the segment, and waits for a line on stdin.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

SUCCESS = 0
HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT = range(5)
DIRECTIONS = {HOST_TO_HOST: "host_to_host", HOST_TO_DEVICE: "host_to_device", DEVICE_TO_HOST: "device_to_host",
              DEVICE_TO_DEVICE: "device_to_device", DEFAULT: "default"}
NOT_A_KIND = 9  # refused by the runtime: not a copy


def main(cudart_path: str) -> None:
    ctypes.CDLL(cudart_path, mode=ctypes.RTLD_GLOBAL)
    runtime = ctypes.CDLL(None)  # the global scope: the hook's cudaMalloc, ... first
    own = ctypes.CDLL(cudart_path)  # the runtime's own functions
    for lib in (runtime, own):
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    runtime.cudaFree.argtypes = [ctypes.c_void_p]
    runtime.cudaMallocAsync.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]
    runtime.cudaFreeAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    runtime.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    runtime.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_void_p]
    counts: dict = {"malloc": [0, 0, 0, 0, 0], "malloc_async": [0, 0, 0, 0, 0], "copies": {}}

    def malloc(api: str, size: int) -> int:
        p = ctypes.c_void_p()
        status = runtime.cudaMalloc(ctypes.byref(p), size) if api == "malloc" else \
            runtime.cudaMallocAsync(ctypes.byref(p), size, None)
        assert status == SUCCESS, status
        counts[api][0] += 1
        counts[api][1] += size
        return p.value

    def free(api: str, p: int | None, size: int | None) -> None:
        status = runtime.cudaFree(p) if api == "malloc" else runtime.cudaFreeAsync(p, None)
        assert status == SUCCESS, status
        if p is None:
            return  # frees nothing
        counts[api][2] += 1
        if size is None:
            counts[api][4] += 1
        else:
            counts[api][3] += size

    def copy(kind: int, size: int, asynchronous: bool) -> None:
        source, target = ctypes.create_string_buffer(size), ctypes.create_string_buffer(size)
        status = (runtime.cudaMemcpyAsync(target, source, size, kind, None) if asynchronous
                  else runtime.cudaMemcpy(target, source, size, kind))
        if status != SUCCESS:
            return
        calls, moved = counts["copies"].get(DIRECTIONS[kind], (0, 0))
        counts["copies"][DIRECTIONS[kind]] = (calls + 1, moved + size)

    sizes = [1000, 4096, 1 << 20, 333, 65536]
    blocks = [(malloc("malloc", size), size) for size in sizes]
    for p, size in blocks[:4]:  # the last one stays allocated
        free("malloc", p, size)
    free("malloc", None, None)
    unseen = ctypes.c_void_p()
    assert own.cudaMalloc(ctypes.byref(unseen), 777) == SUCCESS
    free("malloc", unseen.value, None)
    pooled = [(malloc("malloc_async", size), size) for size in (2048, 512)]
    free("malloc_async", *pooled[0])
    for _ in range(40):  # past the 32 copies of a direction that are all timed: then one in 16
        copy(HOST_TO_DEVICE, 1024, asynchronous=True)
    for _ in range(3):
        copy(DEVICE_TO_HOST, 4096, asynchronous=False)
    for _ in range(2):
        copy(DEVICE_TO_DEVICE, 65536, asynchronous=True)
    copy(DEFAULT, 100, asynchronous=True)
    copy(HOST_TO_HOST, 10, asynchronous=False)
    copy(NOT_A_KIND, 64, asynchronous=True)
    hook = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    hook.tuiprof_flush.argtypes = [ctypes.c_int]
    assert hook.tuiprof_flush(5000) == 1, "the hook's writer did not drain its records"
    print(json.dumps(counts), flush=True)
    print("READY", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main(sys.argv[1])
