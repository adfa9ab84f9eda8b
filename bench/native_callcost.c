/* Host cost of one intercepted cublasGemmEx: a 1x1x1 GEMM through the
 * stand-in cuBLAS (tests/native/standins), called N times in a loop, timed
 * with CLOCK_MONOTONIC.  Run once plain and once with libtuiprof_hook.so
 * preloaded; the difference is the hook's cost per call (stand-in events
 * cost ~20 ns, real cudaEventRecord pairs cost more: see native_gpu.md). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int cublasCreate_v2(void **h);
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    void *h;
    cublasCreate_v2(&h);
    float a = 1, b = 2, c = 0, one = 1, zero = 0;
    for (long i = 0; i < n / 10; i++) /* warm-up */
        cublasGemmEx(h, 0, 0, 1, 1, 1, &one, &a, 0, 1, &b, 0, 1, &zero, &c, 0, 1, 68, -1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++)
        cublasGemmEx(h, 0, 0, 1, 1, 1, &one, &a, 0, 1, &b, 0, 1, &zero, &c, 0, 1, 68, -1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n;
    printf("%.1f %d\n", ns, (int)getpid()); /* the pid names the segment to remove */
    return c == 2 ? 0 : 1;
}
