/* Stand-in cuBLAS / cuBLASLt: computes the GEMM on the CPU (float data,
 * column-major, whatever the dtype tag) and advances the stream's virtual
 * clock by the modelled kernel time (10 us + 1 ns per 100 FLOPs).
 * STANDIN_SGEMM_SLOWER=<calls>:<extra_ns> makes every cublasSgemm_v2 call
 * after the process's first <calls> of them run <extra_ns> longer: a GPU that
 * leaves its boost clock after a burst's first calls.  standin_sgemm_extra_ns(ns)
 * makes the following cublasSgemm_v2 calls run `ns` longer (a caller that
 * chooses each call's duration). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void standin_stream_advance(void *s, uint64_t ns);

typedef struct handle {
    void *stream;
} handle;

static long lt_getattr_calls;
long standin_lt_getattr_calls(void) { return lt_getattr_calls; }

uint64_t standin_kernel_ns(int64_t b, int64_t m, int64_t n, int64_t k)
{
    return 10000 + (uint64_t)(2 * b * m * n * k) / 100;
}

int cublasCreate_v2(void **h)
{
    *h = calloc(1, sizeof(handle));
    return 0;
}

int cublasSetStream_v2(void *h, void *stream)
{
    ((handle *)h)->stream = stream;
    return 0;
}

int cublasGetStream_v2(void *h, void **stream)
{
    *stream = ((handle *)h)->stream;
    return 0;
}

/* C = alpha*op(A)*op(B) + beta*C, column-major, op = transpose when t != 0. */
static void gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float acc = 0;
            for (int64_t p = 0; p < k; p++) {
                float a = ta ? A[p + i * lda] : A[i + p * lda];
                float b = tb ? B[j + p * ldb] : B[p + j * ldb];
                acc += a * b;
            }
            C[i + j * ldc] = alpha * acc + beta * C[i + j * ldc];
        }
}

int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo)
{
    (void)at, (void)bt, (void)ct, (void)compute, (void)algo;
    gemm(ta, tb, m, n, k, *(const float *)alpha, A, lda, B, ldb, *(const float *)beta, C, ldc);
    standin_stream_advance(((handle *)h)->stream, standin_kernel_ns(1, m, n, k));
    return 0;
}

int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,
                               int at, int lda, long long sa, const void *B, int bt, int ldb, long long sb,
                               const void *beta, void *C, int ct, int ldc, long long sc, int batch, int compute,
                               int algo)
{
    (void)at, (void)bt, (void)ct, (void)compute, (void)algo;
    for (int i = 0; i < batch; i++)
        gemm(ta, tb, m, n, k, *(const float *)alpha, (const float *)A + i * sa, lda, (const float *)B + i * sb, ldb,
             *(const float *)beta, (float *)C + i * sc, ldc);
    standin_stream_advance(((handle *)h)->stream, standin_kernel_ns(batch, m, n, k));
    return 0;
}

/* The extra time of this cublasSgemm_v2 call under STANDIN_SGEMM_SLOWER (0 without it). */
static uint64_t sgemm_slowdown_ns(void)
{
    static long calls, fast_calls = -1;
    static uint64_t extra_ns;
    if (fast_calls < 0) {
        const char *v = getenv("STANDIN_SGEMM_SLOWER");
        char *end = NULL;
        fast_calls = v ? strtol(v, &end, 10) : 0;
        extra_ns = end && *end == ':' ? strtoull(end + 1, NULL, 10) : 0;
    }
    return ++calls > fast_calls ? extra_ns : 0;
}

static uint64_t sgemm_extra_ns;
void standin_sgemm_extra_ns(uint64_t ns) { sgemm_extra_ns = ns; }

int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc)
{
    gemm(ta, tb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    standin_stream_advance(((handle *)h)->stream, standin_kernel_ns(1, m, n, k) + sgemm_slowdown_ns() + sgemm_extra_ns);
    return 0;
}

/* ---- cuBLASLt ---- */
typedef struct layout {
    uint32_t type;
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t batch;
} layout;

typedef struct desc {
    int32_t transa, transb;
} desc;

int cublasLtCreate(void **h)
{
    *h = calloc(1, 8);
    return 0;
}

int cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld)
{
    layout *x = calloc(1, sizeof(layout));
    x->type = (uint32_t)type, x->rows = rows, x->cols = cols, x->ld = ld, x->batch = 1;
    *l = x;
    return 0;
}

int cublasLtMatrixLayoutDestroy(void *l)
{
    free(l);
    return 0;
}

int cublasLtMatrixLayoutSetAttribute(void *l, int attr, const void *buf, size_t size)
{
    layout *x = l;
    (void)size;
    switch (attr) {
    case 5: x->batch = *(const int32_t *)buf; return 0;
    case 6: x->stride = *(const int64_t *)buf; return 0;
    default: return 7;
    }
}

int cublasLtMatrixLayoutGetAttribute(void *l, int attr, void *buf, size_t size, size_t *written)
{
    layout *x = l;
    __atomic_fetch_add(&lt_getattr_calls, 1, __ATOMIC_RELAXED);
    *written = size;
    switch (attr) {
    case 0: *(uint32_t *)buf = x->type; return 0;
    case 2: *(uint64_t *)buf = x->rows; return 0;
    case 3: *(uint64_t *)buf = x->cols; return 0;
    case 4: *(int64_t *)buf = x->ld; return 0;
    case 5: *(int32_t *)buf = x->batch; return 0;
    case 6: *(int64_t *)buf = x->stride; return 0;
    default: return 7;
    }
}

int cublasLtMatmulDescCreate(void **d, int compute, int scale)
{
    (void)compute, (void)scale;
    *d = calloc(1, sizeof(desc));
    return 0;
}

int cublasLtMatmulDescDestroy(void *d)
{
    free(d);
    return 0;
}

int cublasLtMatmulDescSetAttribute(void *d, int attr, const void *buf, size_t size)
{
    (void)size;
    if (attr == 3) ((desc *)d)->transa = *(const int32_t *)buf;
    else if (attr == 4) ((desc *)d)->transb = *(const int32_t *)buf;
    return 0;
}

int cublasLtMatmulDescGetAttribute(void *d, int attr, void *buf, size_t size, size_t *written)
{
    __atomic_fetch_add(&lt_getattr_calls, 1, __ATOMIC_RELAXED);
    *written = size;
    if (attr == 3) *(int32_t *)buf = ((desc *)d)->transa;
    else if (attr == 4) *(int32_t *)buf = ((desc *)d)->transb;
    else return 7;
    return 0;
}

int cublasLtMatmul(void *h, void *dd, const void *alpha, const void *A, void *Ad, const void *B, void *Bd,
                   const void *beta, const void *C, void *Cd, void *D, void *Dd, const void *algo, void *ws,
                   size_t wss, void *stream)
{
    (void)h, (void)algo, (void)ws, (void)wss, (void)Cd;
    desc *d = dd;
    layout *a = Ad, *b = Bd, *o = Dd;
    int64_t m = (int64_t)o->rows, n = (int64_t)o->cols, k = (int64_t)(d->transa ? a->rows : a->cols);
    for (int32_t i = 0; i < o->batch; i++) {
        float *out = (float *)D + i * o->stride;
        if (C != D) memcpy(out, (const float *)C + i * o->stride, sizeof(float) * (size_t)(o->ld * n));
        gemm(d->transa, d->transb, m, n, k, *(const float *)alpha, (const float *)A + i * a->stride, a->ld,
             (const float *)B + i * b->stride, b->ld, *(const float *)beta, out, o->ld);
    }
    standin_stream_advance(stream, standin_kernel_ns(o->batch, m, n, k));
    return 0;
}
