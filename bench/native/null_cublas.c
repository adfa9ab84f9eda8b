/* A cuBLAS that does nothing, over the real CUDA runtime (bench/native/native_callcost.sh, CUDA=1): its
 * cublasGemmEx returns at once, so what libtuiprof_hook.so adds to a call -- with the real CUDA
 * driver's event records on a timed one -- is not lost in cuBLAS's own ~11 us of host work, which
 * varies by more than a microsecond from run to run.  The stream is the legacy default stream, as
 * PyTorch's default. */
#include <stddef.h>

static int handle;

int cublasCreate_v2(void **h)
{
    *h = &handle;
    return 0;
}

int cublasGetStream_v2(void *h, void **stream)
{
    (void)h;
    *stream = NULL;
    return 0;
}

int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo)
{
    (void)h, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)A, (void)at, (void)lda, (void)B;
    (void)bt, (void)ldb, (void)beta, (void)C, (void)ct, (void)ldc, (void)compute, (void)algo;
    return 0;
}
