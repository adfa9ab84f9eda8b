"""A stand-in job whose every call takes a duration it is given: ``latency_job.py DIR PHASES_JSON``.

PHASES_JSON is a list of phases, each ``{"nccl": [ns, ...], "sgemm": [ns, ...]}``: one AllReduce
through the stand-in NCCL (its profiler plugin, one channel: kernel time exactly ``ns``) per
entry, then one cublasSgemm_v2 16x16x16 per entry on a stand-in stream, ``ns`` long in all (the
stand-in's modelled 10,081 ns plus the rest as extra time). After each phase it prints
"PHASE <i>" and waits for a line on stdin; it exits after the last.
"""

import ctypes
import json
import pathlib
import sys

DIR, PHASES = sys.argv[1], json.loads(pathlib.Path(sys.argv[2]).read_text())
SGEMM_MODEL_NS = 10_000 + 2 * 16 * 16 * 16 // 100  # standin_kernel_ns(1, 16, 16, 16)

P = ctypes.c_void_p
cudart = ctypes.CDLL(f"{DIR}/libcudart.so", mode=ctypes.RTLD_GLOBAL)
cublas = ctypes.CDLL(f"{DIR}/libcublas.so", mode=ctypes.RTLD_GLOBAL)
nccl = ctypes.CDLL(f"{DIR}/libnccl.so", mode=ctypes.RTLD_GLOBAL)
api = ctypes.CDLL(None)  # the program's own calls bind here: under `tuiprof run`, to the preloaded hook
cudart.standin_stream_create.restype = P
cublas.standin_sgemm_extra_ns.argtypes = [ctypes.c_uint64]
nccl.standin_nccl_init.restype = P
nccl.standin_nccl_init.argtypes = [ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
nccl.standin_nccl_op.argtypes = [P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
api.cublasSetStream_v2.argtypes = [P, P]
api.cublasSgemm_v2.argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, P,
                               ctypes.c_int, P, ctypes.c_int, P, P, ctypes.c_int]

comm = nccl.standin_nccl_init(0x5EED, 2, 0)
handle = P()
api.cublasCreate_v2(ctypes.byref(handle))
api.cublasSetStream_v2(handle, cudart.standin_stream_create())
matrix = (ctypes.c_float * 256)()
one, zero = ctypes.c_float(1), ctypes.c_float(0)
for i, phase in enumerate(PHASES):
    for ns in phase["nccl"]:
        nccl.standin_nccl_op(comm, b"AllReduce", 1 << 20, b"ncclBfloat16", -1, 1, b"RING", b"SIMPLE", ns, 0)
    for ns in phase["sgemm"]:
        cublas.standin_sgemm_extra_ns(ns - SGEMM_MODEL_NS)
        api.cublasSgemm_v2(handle, 0, 0, 16, 16, 16, ctypes.byref(one), matrix, 16, matrix, 16, ctypes.byref(zero),
                           matrix, 16)
    print(f"PHASE {i}", flush=True)
    sys.stdin.readline()
