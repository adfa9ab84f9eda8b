/* Host cost of one intercepted cublasGemmEx: a 1x1x1 GEMM through the
 * stand-in cuBLAS (tests/native/standins), called N times in a loop, timed
 * with CLOCK_MONOTONIC.  Run once plain and once with libtuiprof_hook.so
 * preloaded; the difference is the hook's cost per call (stand-in events
 * cost ~20 ns, real cudaEventRecord pairs cost more).  Built with
 * -DREAL_CUDA it calls the real cuBLAS on a GPU instead: a 1x1x1 fp32 GEMM
 * on device buffers.  Calls are timed in batches of BATCH, the GPU queue
 * drained between batches outside the timed span, so the figure is the
 * host's cost and the launch queue never fills. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cublasCreate_v2(void **h);
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo);

#ifdef REAL_CUDA
#include <dlfcn.h>
int cudaMalloc(void **p, size_t size);
int cudaDeviceSynchronize(void);
int cudaEventCreateWithFlags(void **event, unsigned flags);
int cudaEventRecord(void *event, void *stream);
int cudaGetDevice(int *device);
int cudaStreamIsCapturing(void *stream, int *status);
#define drain() cudaDeviceSynchronize()
#else
#define drain() 0
#endif
#define BATCH 256 /* calls between drains of the GPU queue; only the calls are timed */

static double elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e9 + (double)(b->tv_nsec - a->tv_nsec);
}

#ifdef REAL_CUDA
typedef int (*record_fn)(void *event, void *stream);
typedef int (*capturing_fn)(void *stream, int *status);
typedef int (*current_fn)(void **ctx);

/* The CUDA calls the hook adds to a timed call, alone: ns per timed call.
 * `driver` 0: the runtime's, as the hook made them up to issue 13 (capture
 * check, device, start and stop event records); 1: the driver's it makes now
 * (capture check, current context, the two records). */
static double cuda_apis_ns(long n, int driver)
{
    static record_fn cu_record;
    static capturing_fn cu_capturing;
    static current_fn cu_current;
    void *start, *stop; /* first: the runtime's first call loads libcuda */
    if (cudaEventCreateWithFlags(&start, 0) || cudaEventCreateWithFlags(&stop, 0)) return -1;
    if (!cu_record) {
        void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!cuda) return -1;
        cu_record = (record_fn)dlsym(cuda, "cuEventRecord");
        cu_capturing = (capturing_fn)dlsym(cuda, "cuStreamIsCapturing");
        cu_current = (current_fn)dlsym(cuda, "cuCtxGetCurrent");
        if (!cu_record || !cu_capturing || !cu_current) return -1;
    }
    double total = 0;
    for (long done = 0; done < n; done += BATCH) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = done; i < done + BATCH && i < n; i++) {
            int capturing, device;
            void *ctx;
            if (driver) {
                cu_capturing(NULL, &capturing);
                cu_current(&ctx);
                cu_record(start, NULL);
                cu_record(stop, NULL);
            } else {
                cudaStreamIsCapturing(NULL, &capturing);
                cudaGetDevice(&device);
                cudaEventRecord(start, NULL);
                cudaEventRecord(stop, NULL);
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        total += elapsed_ns(&t0, &t1);
        drain();
    }
    return total / (double)n;
}

/* The one clock read of a timed call (its launch time), alone: ns per read. */
static double clock_ns(long n)
{
    struct timespec t0, t1, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) clock_gettime(CLOCK_REALTIME, &now);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return elapsed_ns(&t0, &t1) / (double)n;
}
#endif

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
#ifdef REAL_CUDA
    if (argc > 2 && strcmp(argv[2], "cuda-apis") == 0) { /* "runtime_ns driver_ns clock_ns pid" */
        cuda_apis_ns(n / 10, 0), cuda_apis_ns(n / 10, 1); /* warm-up */
        double runtime = cuda_apis_ns(n, 0), driver = cuda_apis_ns(n, 1);
        printf("%.1f %.1f %.1f %d\n", runtime, driver, clock_ns(n), (int)getpid());
        return 0;
    }
#endif
    void *h;
    cublasCreate_v2(&h);
    float host[3] = {1, 2, 0}, one = 1, zero = 0;
    float *a = &host[0], *b = &host[1], *c = &host[2];
#ifdef REAL_CUDA
    float *dev;
    if (cudaMalloc((void **)&dev, 3 * sizeof(float)) != 0) return 2;
    a = dev, b = dev + 1, c = dev + 2;
#endif
    double total = 0;
    for (int pass = 0; pass < 2; pass++) { /* a warm-up pass of n / 10, then the timed one */
        long calls = pass ? n : n / 10;
        total = 0;
        for (long done = 0; done < calls; done += BATCH) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (long i = done; i < done + BATCH && i < calls; i++)
                cublasGemmEx(h, 0, 0, 1, 1, 1, &one, a, 0, 1, b, 0, 1, &zero, c, 0, 1, 68, -1);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            total += elapsed_ns(&t0, &t1);
            drain();
        }
    }
    double ns = total / (double)n;
    printf("%.1f %d\n", ns, (int)getpid()); /* the pid names the segment to remove */
#ifdef REAL_CUDA
    return 0;
#else
    return host[2] == 2 ? 0 : 1;
#endif
}
