/* Host cost of one intercepted cublasGemmEx: a 1x1x1 GEMM through the
 * stand-in cuBLAS (tests/native/standins), called N times in a loop, timed
 * with CLOCK_MONOTONIC.  Run once plain and once with libtuiprof_hook.so
 * preloaded; the difference is the hook's cost per call (stand-in events
 * cost ~20 ns, real cudaEventRecord pairs cost more).  Built with
 * -DREAL_CUDA it calls the real cuBLAS on a GPU instead: a 1x1x1 fp32 GEMM
 * on device buffers, the stream synchronised every 1000 calls so that the
 * launch queue never fills and the figure stays the host's cost. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int cublasCreate_v2(void **h);
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo);

#ifdef REAL_CUDA
int cudaMalloc(void **p, size_t size);
int cudaDeviceSynchronize(void);
int cublasSetPointerMode_v2(void *h, int mode);
#define SYNC_EVERY 1000
#else
#define SYNC_EVERY 0
#endif

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    void *h;
    cublasCreate_v2(&h);
    float host[3] = {1, 2, 0}, one = 1, zero = 0;
    float *a = &host[0], *b = &host[1], *c = &host[2];
#ifdef REAL_CUDA
    float *dev;
    if (cudaMalloc((void **)&dev, 3 * sizeof(float)) != 0) return 2;
    a = dev, b = dev + 1, c = dev + 2;
#endif
    struct timespec t0, t1;
    for (int pass = 0; pass < 2; pass++) { /* a warm-up pass of n / 10, then the timed one */
        long calls = pass ? n : n / 10;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < calls; i++) {
            cublasGemmEx(h, 0, 0, 1, 1, 1, &one, a, 0, 1, b, 0, 1, &zero, c, 0, 1, 68, -1);
#ifdef REAL_CUDA
            if (i % SYNC_EVERY == SYNC_EVERY - 1) cudaDeviceSynchronize();
#endif
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
    }
    double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n;
    printf("%.1f %d\n", ns, (int)getpid()); /* the pid names the segment to remove */
    return SYNC_EVERY || host[2] == 2 ? 0 : 1;
}
