/* The stand-in "training job": a fixed, known mix of GEMMs and NCCL ops whose
 * counts, shapes, FLOPs and bytes the tests know in advance.  It lives in a
 * shared library that the driver dlopens RTLD_LOCAL (as PyTorch loads its
 * CUDA libraries), so cuBLAS is not in the global scope. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cublasCreate_v2(void **h);
int cublasSetStream_v2(void *h, void *stream);
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo);
int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,
                               int at, int lda, long long sa, const void *B, int bt, int ldb, long long sb,
                               const void *beta, void *C, int ct, int ldc, long long sc, int batch, int compute,
                               int algo);
int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc);
int cublasLtCreate(void **h);
int cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld);
int cublasLtMatrixLayoutDestroy(void *l);
int cublasLtMatrixLayoutSetAttribute(void *l, int attr, const void *buf, size_t size);
int cublasLtMatmulDescCreate(void **d, int compute, int scale);
int cublasLtMatmulDescDestroy(void *d);
int cublasLtMatmulDescSetAttribute(void *d, int attr, const void *buf, size_t size);
int cublasLtMatmul(void *h, void *dd, const void *alpha, const void *A, void *Ad, const void *B, void *Bd,
                   const void *beta, const void *C, void *Cd, void *D, void *Dd, const void *algo, void *ws,
                   size_t wss, void *stream);
long standin_lt_getattr_calls(void);
void *standin_stream_create(void);
uint64_t standin_stream_wait(void *s, uint64_t ns);
uint64_t standin_kernel_ns(int64_t b, int64_t m, int64_t n, int64_t k);
void standin_stream_stall(void *s, int on);
void standin_stream_capture(void *s, int on);
long standin_events_recorded(void);
void *standin_nccl_init(uint64_t comm_hash, int nranks, int rank);
int standin_nccl_op(void *handle, const char *func, size_t count, const char *dtype, int peer, int channels,
                    const char *algo, const char *proto, uint64_t gpu_dur_ns, int hang);
long standin_nccl_unexpected_handles(void);

static float *matrix(int64_t elems, float seed)
{
    float *p = malloc(sizeof(float) * (size_t)elems);
    for (int64_t i = 0; i < elems; i++) p[i] = (float)((i * 7 + (int64_t)seed) % 13) - 6.0f;
    return p;
}

/* Reference C = A*B (column-major, no transpose) computed here, not by the library. */
static double max_error(int64_t m, int64_t n, int64_t k, const float *A, const float *B, const float *C)
{
    double worst = 0;
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            double acc = 0;
            for (int64_t p = 0; p < k; p++) acc += (double)A[i + p * m] * B[p + j * k];
            double e = fabs(acc - C[i + j * m]);
            if (e > worst) worst = e;
        }
    return worst;
}

int run_workload(FILE *out)
{
    const float one = 1, zero = 0;
    void *h, *lt, *s1 = standin_stream_create(), *s2 = standin_stream_create();
    cublasCreate_v2(&h);
    cublasSetStream_v2(h, s1);
    cublasLtCreate(&lt);
    double worst = 0;

    /* 5 x GemmEx bf16 64x32x16 */
    float *A = matrix(64 * 16, 1), *B = matrix(16 * 32, 2), *C = matrix(64 * 32, 0);
    for (int i = 0; i < 5; i++) {
        cublasGemmEx(h, 0, 0, 64, 32, 16, &one, A, 14, 64, B, 14, 16, &zero, C, 14, 64, 68, -1);
        double e = max_error(64, 32, 16, A, B, C);
        if (e > worst) worst = e;
    }
    /* 3 x StridedBatchedEx fp16 batch 4, 8x8x8 */
    float *BA = matrix(4 * 64, 3), *BB = matrix(4 * 64, 4), *BC = matrix(4 * 64, 0);
    for (int i = 0; i < 3; i++) {
        cublasGemmStridedBatchedEx(h, 0, 0, 8, 8, 8, &one, BA, 2, 8, 64, BB, 2, 8, 64, &zero, BC, 2, 8, 64, 4, 68, -1);
        for (int b = 0; b < 4; b++) {
            double e = max_error(8, 8, 8, BA + b * 64, BB + b * 64, BC + b * 64);
            if (e > worst) worst = e;
        }
    }
    /* 2 x Sgemm 16x16x16 */
    float *SA = matrix(256, 5), *SB = matrix(256, 6), *SC = matrix(256, 0);
    for (int i = 0; i < 2; i++) {
        cublasSgemm_v2(h, 0, 0, 16, 16, 16, &one, SA, 16, SB, 16, &zero, SC, 16);
        double e = max_error(16, 16, 16, SA, SB, SC);
        if (e > worst) worst = e;
    }
    /* 4 x LtMatmul bf16 32x16x8 with the same descriptors (shape read once) */
    void *d, *la, *lb, *lc;
    cublasLtMatmulDescCreate(&d, 68, 0);
    cublasLtMatrixLayoutCreate(&la, 14, 32, 8, 32);
    cublasLtMatrixLayoutCreate(&lb, 14, 8, 16, 8);
    cublasLtMatrixLayoutCreate(&lc, 14, 32, 16, 32);
    float *LA = matrix(32 * 8, 7), *LB = matrix(8 * 16, 8), *LC = matrix(32 * 16, 0);
    long getattr_before = standin_lt_getattr_calls();
    for (int i = 0; i < 4; i++) {
        cublasLtMatmul(lt, d, &one, LA, la, LB, lb, &zero, LC, lc, LC, lc, NULL, NULL, 0, s1);
        double e = max_error(32, 16, 8, LA, LB, LC);
        if (e > worst) worst = e;
    }
    long getattr_same = standin_lt_getattr_calls() - getattr_before;
    /* 2 x LtMatmul with fresh descriptors at (likely) the same addresses: batch 2, A transposed, 16x8x4 */
    cublasLtMatmulDescDestroy(d);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
    for (int i = 0; i < 2; i++) {
        int32_t t = 1, batch = 2;
        int64_t stride_a = 64, stride_b = 32, stride_c = 128;
        cublasLtMatmulDescCreate(&d, 68, 0);
        cublasLtMatmulDescSetAttribute(d, 3, &t, sizeof(t));
        cublasLtMatrixLayoutCreate(&la, 0, 4, 16, 4);
        cublasLtMatrixLayoutCreate(&lb, 0, 4, 8, 4);
        cublasLtMatrixLayoutCreate(&lc, 0, 16, 8, 16);
        cublasLtMatrixLayoutSetAttribute(la, 5, &batch, sizeof(batch));
        cublasLtMatrixLayoutSetAttribute(lb, 5, &batch, sizeof(batch));
        cublasLtMatrixLayoutSetAttribute(lc, 5, &batch, sizeof(batch));
        cublasLtMatrixLayoutSetAttribute(la, 6, &stride_a, sizeof(stride_a));
        cublasLtMatrixLayoutSetAttribute(lb, 6, &stride_b, sizeof(stride_b));
        cublasLtMatrixLayoutSetAttribute(lc, 6, &stride_c, sizeof(stride_c));
        float *TA = matrix(128, 9), *TB = matrix(64, 10), *TC = matrix(256, 0);
        cublasLtMatmul(lt, d, &one, TA, la, TB, lb, &zero, TC, lc, TC, lc, NULL, NULL, 0, s1);
        cublasLtMatmulDescDestroy(d);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        free(TA), free(TB), free(TC);
    }
    long events_before_nccl = standin_events_recorded();

    /* NCCL: communicator of 4 ranks, we are rank 1 */
    void *comm = standin_nccl_init(0xabcdef12345ULL, 4, 1);
    for (int i = 0; i < 3; i++) standin_nccl_op(comm, "AllReduce", 1024, "ncclBfloat16", -1, 2, "RING", "SIMPLE", 50000, 0);
    for (int i = 0; i < 2; i++) standin_nccl_op(comm, "AllGather", 256, "ncclFloat32", -1, 4, "RING", "LL", 20000, 0);
    standin_nccl_op(comm, "ReduceScatter", 512, "ncclFloat32", -1, 1, "RING", "LL128", 30000, 0);
    for (int i = 0; i < 2; i++) standin_nccl_op(comm, "Send", 100, "ncclInt8", 2, 1, NULL, NULL, 5000, 0);
    long nccl_events = standin_events_recorded() - events_before_nccl;

    /* Work that never finishes: a GEMM on a stalled stream, a collective whose kernel never ends. */
    cublasSetStream_v2(h, s2);
    standin_stream_stall(s2, 1);
    cublasGemmEx(h, 0, 0, 64, 32, 16, &one, A, 14, 64, B, 14, 16, &zero, C, 14, 64, 68, -1);
    standin_nccl_op(comm, "AllReduce", 4096, "ncclFloat32", -1, 2, "RING", "SIMPLE", 0, 1);

    fprintf(out,
            "{\"max_error\": %g, \"lt_getattr_same_descriptors\": %ld, \"cuda_events_during_nccl\": %ld, "
            "\"unexpected_nccl_handles\": %ld, \"stalled_stream\": %lu}\n",
            worst, getattr_same, nccl_events, standin_nccl_unexpected_handles(), (unsigned long)(uintptr_t)s2);
    fflush(out);
    return 0;
}

/* `calls` x Sgemm 16x16x16 (the same group as above) on a stream of its own,
 * `pause_us` apart: GEMMs that keep finishing while an agent samples, so a
 * test can count them across published intervals. */
int run_gemm_stream(int calls, int pause_us)
{
    const float one = 1, zero = 0;
    void *h;
    cublasCreate_v2(&h);
    cublasSetStream_v2(h, standin_stream_create());
    float *A = matrix(256, 11), *B = matrix(256, 12), *C = matrix(256, 0);
    for (int i = 0; i < calls; i++) {
        cublasSgemm_v2(h, 0, 0, 16, 16, 16, &one, A, 16, B, 16, &zero, C, 16);
        usleep((unsigned)pause_us);
    }
    free(A), free(B), free(C);
    return 0;
}

/* `calls` x Sgemm 16x16x16 (the group above) on a stream of its own that is
 * in CUDA-graph capture for its calls from..to-1 (0-based): calls the hook
 * cannot time. */
int run_gemm_captured(int calls, int from, int to)
{
    const float one = 1, zero = 0;
    void *h, *s = standin_stream_create();
    cublasCreate_v2(&h);
    cublasSetStream_v2(h, s);
    float *A = matrix(256, 11), *B = matrix(256, 12), *C = matrix(256, 0);
    for (int i = 0; i < calls; i++) {
        standin_stream_capture(s, i >= from && i < to);
        cublasSgemm_v2(h, 0, 0, 16, 16, 16, &one, A, 16, B, 16, &zero, C, 16);
    }
    free(A), free(B), free(C);
    return 0;
}

/* For the GPU-clock placement check (run with STANDIN_GPU_CLOCK=realtime:...):
 * `calls` x Sgemm 16x16x12 (a shape of its own) on a fresh stream, queued
 * behind a `hold_us` wait so that they run back to back on the GPU, with the
 * stream waiting `gap_us` before every 4th call.  Prints each call's GPU
 * start and end time. */
int run_timeline(FILE *out, int calls, int hold_us, int gap_us)
{
    const float one = 1, zero = 0;
    void *h, *s = standin_stream_create();
    cublasCreate_v2(&h);
    cublasSetStream_v2(h, s);
    float *A = matrix(256, 13), *B = matrix(256, 14), *C = matrix(256, 0);
    standin_stream_wait(s, (uint64_t)hold_us * 1000);
    fprintf(out, "{\"stream\": %lu, \"calls\": [", (unsigned long)(uintptr_t)s);
    for (int i = 0; i < calls; i++) {
        if (i && i % 4 == 0) standin_stream_wait(s, (uint64_t)gap_us * 1000);
        uint64_t start = standin_stream_wait(s, 0);
        cublasSgemm_v2(h, 0, 0, 16, 16, 12, &one, A, 16, B, 12, &zero, C, 16);
        fprintf(out, "%s[%lu, %lu]", i ? ", " : "", (unsigned long)start,
                (unsigned long)(start + standin_kernel_ns(1, 16, 16, 12)));
    }
    fprintf(out, "]}\n");
    fflush(out);
    free(A), free(B), free(C);
    return 0;
}

/* `threads` threads one after another, each making `calls` x Sgemm 16x16x8
 * (a shape of its own) and exiting: the counts of threads that are gone. */
static void *gemm_thread(void *arg)
{
    const float one = 1, zero = 0;
    int calls = *(int *)arg;
    void *h;
    cublasCreate_v2(&h);
    cublasSetStream_v2(h, standin_stream_create());
    float *A = matrix(128, 15), *B = matrix(128, 16), *C = matrix(256, 0);
    for (int i = 0; i < calls; i++) cublasSgemm_v2(h, 0, 0, 16, 16, 8, &one, A, 16, B, 8, &zero, C, 16);
    free(A), free(B), free(C);
    return NULL;
}

int run_gemm_threads(int threads, int calls)
{
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, gemm_thread, &calls) != 0) return 1;
        pthread_join(t, NULL);
    }
    return 0;
}

/* `calls` x Sgemm 16x16x4 (a shape of its own) on an idle stream, `pause_us`
 * apart; prints the host's CLOCK_REALTIME just before each call (on an idle
 * stream the call's start event is taken then). */
int run_gemm_paced(FILE *out, int calls, int pause_us)
{
    const float one = 1, zero = 0;
    void *h;
    cublasCreate_v2(&h);
    void *s = standin_stream_create();
    cublasSetStream_v2(h, s);
    float *A = matrix(64, 17), *B = matrix(64, 18), *C = matrix(256, 0);
    fprintf(out, "{\"stream\": %lu, \"launched\": [", (unsigned long)(uintptr_t)s);
    for (int i = 0; i < calls; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        cublasSgemm_v2(h, 0, 0, 16, 16, 4, &one, A, 16, B, 4, &zero, C, 16);
        fprintf(out, "%s%lld", i ? ", " : "", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
        usleep((unsigned)pause_us);
    }
    fprintf(out, "]}\n");
    fflush(out);
    free(A), free(B), free(C);
    return 0;
}
