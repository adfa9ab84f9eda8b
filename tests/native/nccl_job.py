"""A stand-in job calling the NCCL API through ctypes: ``nccl_job.py DIR LIBNCCL [no-cuda]``.

Loads the stand-in CUDA runtime (unless ``no-cuda``) and the stand-in NCCL
``DIR/LIBNCCL`` into the global scope and calls NCCL where a program's own
calls bind: the first definition in the global scope, which under
``tuiprof run`` is the preloaded hook.  Runs a fixed mix (tests/native/
test_nccl_fallback.py knows it), prints one JSON line with the return codes
and "READY"; then, on a line "stall", enqueues an AllReduce on a stream that
never finishes and prints "STALLED"; exits on end of input.
"""

import ctypes
import json
import sys

DIR, LIBNCCL = sys.argv[1], sys.argv[2]
WITH_CUDA = sys.argv[3:] != ["no-cuda"]
INT8, FP32, FP64, BF16 = 0, 7, 8, 9
SUM = 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


cudart = ctypes.CDLL(f"{DIR}/libcudart.so", mode=ctypes.RTLD_GLOBAL) if WITH_CUDA else None
standin = ctypes.CDLL(f"{DIR}/{LIBNCCL}", mode=ctypes.RTLD_GLOBAL)
api = ctypes.CDLL(None)
P = ctypes.c_void_p
for name, args in {
    "ncclAllReduce": (P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, P, P),
    "ncclAllGather": (P, P, ctypes.c_size_t, ctypes.c_int, P, P),
    "ncclReduceScatter": (P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, P, P),
    "ncclBroadcast": (P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, P, P),
    "ncclReduce": (P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, P),
    "ncclSend": (P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, P, P),
    "ncclRecv": (P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, P, P),
    "ncclCommInitRank": (ctypes.POINTER(P), ctypes.c_int, UniqueId, ctypes.c_int),
}.items():
    getattr(api, name).argtypes = args
if cudart:
    cudart.standin_stream_create.restype = P
    cudart.standin_events_recorded.restype = ctypes.c_long
standin.standin_nccl_calls.restype = ctypes.c_long

stream = cudart.standin_stream_create() if cudart else None
uid = UniqueId()
uid.internal = bytes(range(1, 129))
comm = P()
codes = {"init": api.ncclCommInitRank(ctypes.byref(comm), 4, uid, 1)}
events_before = cudart.standin_events_recorded() if cudart else 0
for _ in range(3):
    api.ncclAllReduce(None, None, 1024, BF16, SUM, comm, stream)
for _ in range(2):
    api.ncclAllGather(None, None, 256, FP32, comm, stream)
api.ncclReduceScatter(None, None, 512, FP32, SUM, comm, stream)
api.ncclBroadcast(None, None, 100, INT8, 0, comm, stream)
api.ncclReduce(None, None, 10, FP64, SUM, 0, comm, stream)
api.ncclGroupStart()  # nested groups: one launch at the outermost end
api.ncclGroupStart()
api.ncclSend(None, 100, INT8, 2, comm, stream)
api.ncclGroupEnd()
api.ncclRecv(None, 100, INT8, 2, comm, stream)
api.ncclGroupEnd()
api.ncclGroupStart()  # coalesced all-reduces
for _ in range(3):
    api.ncclAllReduce(None, None, 64, FP32, SUM, comm, stream)
api.ncclGroupEnd()
api.ncclGroupStart()  # one op in a group, as nccl-tests issues every op
api.ncclBroadcast(None, None, 100, INT8, 0, comm, stream)
api.ncclGroupEnd()
standin.standin_nccl_fail_next(5)
codes["failing_call"] = api.ncclAllReduce(None, None, 1024, BF16, SUM, comm, stream)
api.ncclGroupStart()
api.ncclAllGather(None, None, 256, FP32, comm, stream)
standin.standin_nccl_fail_next(2)
codes["failing_group"] = api.ncclGroupEnd()
codes["null_comm"] = api.ncclAllReduce(None, None, 1024, BF16, SUM, None, stream)
codes["end_without_start"] = api.ncclGroupEnd()
result = {"codes": codes, "standin_calls": standin.standin_nccl_calls(),
          "cuda_events": (cudart.standin_events_recorded() - events_before) if cudart else 0,
          "stream": stream or 0}
print(json.dumps(result), flush=True)
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "stall" and cudart:
        stalled = cudart.standin_stream_create()
        cudart.standin_stream_stall(P(stalled), 1)
        api.ncclAllReduce(None, None, 1024, BF16, SUM, comm, stalled)
        print("STALLED", flush=True)
