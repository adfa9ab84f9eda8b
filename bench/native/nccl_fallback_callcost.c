/* Host cost of one ncclAllReduce through the hook's NCCL API fallback
 * (tuiprof_native/hook/nccl_fallback.c): a 1-element fp32 all-reduce called
 * N times in batches of BATCH, timed with CLOCK_MONOTONIC around each batch;
 * between batches (outside the timed span) the stream is drained and the
 * thread pauses 1 ms, so the hook's writer keeps up as it would with real
 * collectives (each costs microseconds).  Run plain and under
 * libtuiprof_hook.so (counting only, or TUIPROF_NCCL_FALLBACK=1): the
 * difference is the hook's cost per call.
 *
 * By default against the stand-in NCCL 2.21.5 (tests/native/standins/
 * nccl_api.c) and CUDA runtime, whose calls cost almost nothing, so the
 * figure is the hook's own work.  Built with -DREAL_NCCL it drives the real
 * NCCL on GPU 0 instead (one-rank communicator from ncclCommInitAll, device
 * buffers, a stream of its own); the plugin is not loaded (no
 * NCCL_PROFILER_PLUGIN), so the fallback is what records. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int ncclAllReduce(const void *s, void *r, size_t count, int dtype, int op, void *comm, void *stream);
#define FP32 7
#define SUM 0
#define BATCH 256

#ifdef REAL_NCCL
int ncclCommInitAll(void **comms, int ndev, const int *devlist);
int cudaMalloc(void **p, size_t size);
int cudaStreamCreate(void **stream);
int cudaStreamSynchronize(void *stream);
#else
typedef struct { char internal[128]; } unique_id;
int ncclCommInitRank(void **comm, int nranks, unique_id id, int rank);
void *standin_stream_create(void);
static int cudaStreamSynchronize(void *stream) { (void)stream; return 0; }
#endif

static double elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e9 + (double)(b->tv_nsec - a->tv_nsec);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    void *comm = NULL, *stream = NULL;
    float *buf = NULL;
#ifdef REAL_NCCL
    int dev = 0;
    if (ncclCommInitAll(&comm, 1, &dev) != 0 || cudaMalloc((void **)&buf, sizeof(float)) != 0 ||
        cudaStreamCreate(&stream) != 0)
        return 2;
#else
    unique_id id = {{0}};
    if (ncclCommInitRank(&comm, 2, id, 0) != 0) return 2;
    stream = standin_stream_create();
#endif
    double total = 0;
    for (int pass = 0; pass < 2; pass++) { /* a warm-up pass of n / 10, then the timed one */
        long calls = pass ? n : n / 10;
        total = 0;
        for (long done = 0; done < calls; done += BATCH) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (long i = done; i < done + BATCH && i < calls; i++)
                if (ncclAllReduce(buf, buf, 1, FP32, SUM, comm, stream) != 0) return 1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            total += elapsed_ns(&t0, &t1);
            cudaStreamSynchronize(stream);
            usleep(1000);
        }
    }
    printf("%.1f %d\n", total / (double)n, (int)getpid()); /* the pid names the segment */
    return 0;
}
