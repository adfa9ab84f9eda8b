/* LD_PRELOAD interposers for the cuBLAS / cuBLASLt GEMM entry points PyTorch
 * calls.  Each call: look up the caller's stream, decide whether this call
 * of its shape is timed (sampling, below), take a pooled CUDA event pair
 * around the real call when it is, and hand the launch to the writer thread,
 * which times it when the stop event completes.  Every call is counted (the
 * ones not timed without a record: gemm_sampling.c).
 * FLOPs = 2*b*m*n*k. */
#include <stdio.h>
#include <string.h>

#include "hook_internal.h"

#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_STATUS_NOT_INITIALIZED 1
#define CUBLAS_OP_N 0

typedef int (*get_stream_fn)(void *handle, void **stream);

static _Atomic uint64_t g_gemm_launches;

const char *tp_cuda_dtype_name(int t, char *buf, size_t cap)
{
    switch (t) {
    case -1: return "unknown";
    case 0: return "fp32";
    case 1: return "fp64";
    case 2: return "fp16";
    case 3: return "int8";
    case 4: return "c64";
    case 5: return "c128";
    case 10: return "int32";
    case 14: return "bf16";
    case 28: return "fp8e4m3";
    case 29: return "fp8e5m2";
    default: snprintf(buf, cap, "cuda%d", t); return buf;
    }
}

void tp_gemm_shape_record(tp_record *r, const char *op, int dtype, int64_t b, int64_t m, int64_t n, int64_t k)
{
    char buf[TP_DTYPE_LEN];
    memset(r, 0, sizeof(*r));
    tp_copy_name(r->op, sizeof(r->op), op);
    tp_copy_name(r->dtype, sizeof(r->dtype), tp_cuda_dtype_name(dtype, buf, sizeof(buf)));
    r->b = b, r->m = m, r->n = n, r->k = k;
    r->flops = 2ULL * (uint64_t)b * (uint64_t)m * (uint64_t)n * (uint64_t)k;
}

int tp_gemm_begin(tp_gemm_call *c, const char *op, int dtype, int64_t b, int64_t m, int64_t n, int64_t k)
{
    c->active = 1;
    c->timed = 0;
    c->shape = tp_gemm_shape(op, dtype, b, m, n, k);
    uint32_t period;
    uint32_t weight = tp_gemm_timing_weight(c->shape, &period);
    c->due = weight != 0;
    if (!c->due) return 0; /* counted only: no record, no clock read, no events */
    tp_gemm_shape_record(&c->rec, op, dtype, b, m, n, k);
    c->rec.first_call = tp_gemm_first_call(c->shape);
    c->rec.weight = weight;
    c->rec.period = period;
    c->rec.shape = c->shape;
    c->rec.shape_key = tp_gemm_shape_key(c->shape);
    return 1;
}

void tp_gemm_time(tp_gemm_call *c, void *stream)
{
    c->rec.stream = (uint64_t)(uintptr_t)stream;
    c->stream = stream;
    c->rec.launched_ns = tp_now_ns();
    c->timed = tp_timer_acquire(stream, &c->timer);
}

void tp_gemm_end(tp_gemm_call *c, int status)
{
    if (!c->active) return;
    if (status != CUBLAS_STATUS_SUCCESS) { /* nothing ran: not an op */
        if (c->timed) tp_timer_abandon(c->timer);
        return;
    }
    uint64_t seq = atomic_fetch_add_explicit(&g_gemm_launches, 1, memory_order_relaxed) + 1;
    if (!c->due) {
        tp_gemm_ran(c->shape, TP_GEMM_COUNTED);
        return;
    }
    c->rec.op_seq = seq;
    if (c->timed) {
        tp_timer_stop(c->timer, c->stream);
        tp_gemm_ran(c->shape, TP_GEMM_TIMED);
        c->rec.type = TP_REC_GEMM_LAUNCH;
        c->rec.timer = c->timer;
    } else {
        tp_gemm_ran(c->shape, TP_GEMM_DUE_UNTIMED);
        c->rec.type = TP_REC_GEMM_UNTIMED;
        c->rec.dur_ns = UINT64_MAX;
    }
    tp_submit(&c->rec);
}

static void *blas_stream(void *handle)
{
    get_stream_fn get_stream = TP_REAL(get_stream_fn, "cublasGetStream_v2");
    void *stream = NULL;
    if (get_stream && get_stream(handle, &stream) != CUBLAS_STATUS_SUCCESS) stream = NULL;
    return stream;
}

/* One interposer: resolve the real function, time the call around it. */
#define GEMM_HOOK(NAME, PARAMS, ARGS, DTYPE, B, M, N, K)                                 \
    typedef int (*NAME##_fn) PARAMS;                                                      \
    TP_EXPORT int NAME PARAMS                                                             \
    {                                                                                     \
        NAME##_fn real = TP_REAL(NAME##_fn, #NAME);                                       \
        if (TP_UNLIKELY(!real)) return CUBLAS_STATUS_NOT_INITIALIZED;                     \
        tp_gemm_call c;                                                                   \
        c.active = 0;                                                                     \
        /* inert, or only counted: no stream look-up */                                   \
        if (tp_ensure_started() && tp_gemm_begin(&c, #NAME, DTYPE, B, M, N, K))          \
            tp_gemm_time(&c, blas_stream(handle));                                        \
        int status = real ARGS;                                                           \
        tp_gemm_end(&c, status);                                                          \
        return status;                                                                    \
    }

GEMM_HOOK(cublasGemmEx,
          (void *handle, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
           const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo),
          (handle, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo), at, 1, m, n, k)

GEMM_HOOK(cublasGemmEx_64,
          (void *handle, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *alpha, const void *A, int at,
           int64_t lda, const void *B, int bt, int64_t ldb, const void *beta, void *C, int ct, int64_t ldc,
           int compute, int algo),
          (handle, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo), at, 1, m, n, k)

GEMM_HOOK(cublasGemmStridedBatchedEx,
          (void *handle, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
           long long sa, const void *B, int bt, int ldb, long long sb, const void *beta, void *C, int ct, int ldc,
           long long sc, int batch, int compute, int algo),
          (handle, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute,
           algo),
          at, batch, m, n, k)

GEMM_HOOK(cublasGemmStridedBatchedEx_64,
          (void *handle, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *alpha, const void *A, int at,
           int64_t lda, long long sa, const void *B, int bt, int64_t ldb, long long sb, const void *beta, void *C,
           int ct, int64_t ldc, long long sc, int64_t batch, int compute, int algo),
          (handle, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute,
           algo),
          at, batch, m, n, k)

GEMM_HOOK(cublasGemmBatchedEx,
          (void *handle, int ta, int tb, int m, int n, int k, const void *alpha, const void *const A[], int at,
           int lda, const void *const B[], int bt, int ldb, const void *beta, void *const C[], int ct, int ldc,
           int batch, int compute, int algo),
          (handle, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, batch, compute, algo), at,
          batch, m, n, k)

GEMM_HOOK(cublasSgemm_v2,
          (void *handle, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
           const float *B, int ldb, const float *beta, float *C, int ldc),
          (handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc), 0, 1, m, n, k)

GEMM_HOOK(cublasSgemm_v2_64,
          (void *handle, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *alpha, const float *A,
           int64_t lda, const float *B, int64_t ldb, const float *beta, float *C, int64_t ldc),
          (handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc), 0, 1, m, n, k)

GEMM_HOOK(cublasSgemmStridedBatched,
          (void *handle, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
           long long sa, const float *B, int ldb, long long sb, const float *beta, float *C, int ldc, long long sc,
           int batch),
          (handle, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch), 0, batch, m, n, k)
