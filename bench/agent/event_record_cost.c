/* What each CUDA call a timed GEMM makes costs the host, alone: ns per call,
 * in batches of BATCH with the GPU queue drained between batches outside the
 * timed span.  The runtime's calls (what the hook uses today) against the
 * driver's own (cuEventRecord & co, looked up in libcuda.so.1), each on the
 * legacy default stream and on a created stream, with and without a kernel
 * of work queued ahead.  Prints one "name ns" line per variant.
 * Build: gcc -O2 bench/agent/event_record_cost.c libcudart.so.N -ldl */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int cudaEventCreateWithFlags(void **event, unsigned flags);
int cudaEventRecord(void *event, void *stream);
int cudaEventRecordWithFlags(void *event, void *stream, unsigned flags);
int cudaGetDevice(int *device);
int cudaStreamIsCapturing(void *stream, int *status);
int cudaStreamGetCaptureInfo(void *stream, int *status, unsigned long long *id);
int cudaStreamCreateWithFlags(void **stream, unsigned flags);
int cudaDeviceSynchronize(void);
int cudaFree(void *p);

#define BATCH 256
#define CALLS 200000

typedef int (*cu_record_fn)(void *event, void *stream);
typedef int (*cu_record_flags_fn)(void *event, void *stream, unsigned flags);
typedef int (*cu_capturing_fn)(void *stream, int *status);
static cu_record_fn cu_record;
static cu_record_flags_fn cu_record_flags;
static cu_capturing_fn cu_capturing;

enum variant { RT_RECORD, RT_RECORD_FLAGS, RT_RECORD_NOTIMING, CU_RECORD, CU_RECORD_FLAGS, CU_RECORD_NOTIMING,
               RT_CAPTURING, RT_CAPTURE_INFO, CU_CAPTURING, RT_GET_DEVICE, VARIANTS };
static const char *names[VARIANTS] = {
    "cudaEventRecord", "cudaEventRecordWithFlags", "cudaEventRecord(disable timing)",
    "cuEventRecord", "cuEventRecordWithFlags", "cuEventRecord(disable timing)",
    "cudaStreamIsCapturing", "cudaStreamGetCaptureInfo", "cuStreamIsCapturing", "cudaGetDevice",
};

static double ns_between(struct timespec a, struct timespec b)
{
    return (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
}

static double run(enum variant v, void *stream, void **events, void **plain_events)
{
    double total = 0;
    for (long done = 0; done < CALLS; done += BATCH) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < BATCH; i++) {
            int status, device;
            unsigned long long id;
            switch (v) {
            case RT_RECORD: cudaEventRecord(events[i], stream); break;
            case RT_RECORD_FLAGS: cudaEventRecordWithFlags(events[i], stream, 0); break;
            case RT_RECORD_NOTIMING: cudaEventRecord(plain_events[i], stream); break;
            case CU_RECORD: cu_record(events[i], stream); break;
            case CU_RECORD_FLAGS: cu_record_flags(events[i], stream, 0); break;
            case CU_RECORD_NOTIMING: cu_record(plain_events[i], stream); break;
            case RT_CAPTURING: cudaStreamIsCapturing(stream, &status); break;
            case RT_CAPTURE_INFO: cudaStreamGetCaptureInfo(stream, &status, &id); break;
            case CU_CAPTURING: cu_capturing(stream, &status); break;
            case RT_GET_DEVICE: cudaGetDevice(&device); break;
            default: break;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        total += ns_between(t0, t1);
        cudaDeviceSynchronize();
    }
    return total / CALLS;
}

int main(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return fprintf(stderr, "no libcuda.so.1\n"), 2;
    cu_record = (cu_record_fn)dlsym(cuda, "cuEventRecord");
    cu_record_flags = (cu_record_flags_fn)dlsym(cuda, "cuEventRecordWithFlags");
    cu_capturing = (cu_capturing_fn)dlsym(cuda, "cuStreamIsCapturing");
    if (!cu_record || !cu_record_flags || !cu_capturing) return fprintf(stderr, "driver symbols missing\n"), 2;
    cudaFree(NULL); /* the runtime makes its context current */
    static void *events[BATCH], *plain_events[BATCH];
    for (int i = 0; i < BATCH; i++)
        if (cudaEventCreateWithFlags(&events[i], 0) || cudaEventCreateWithFlags(&plain_events[i], 2))
            return fprintf(stderr, "event create failed\n"), 2;
    void *created;
    if (cudaStreamCreateWithFlags(&created, 1)) return 2;
    void *streams[2] = {NULL, created};
    const char *stream_names[2] = {"default stream", "created stream"};
    for (int round = 0; round < 3; round++)
        for (int s = 0; s < 2; s++)
            for (int v = 0; v < VARIANTS; v++) {
                double ns = run(v, streams[s], events, plain_events);
                if (round == 2) printf("%-34s %-15s %7.1f ns\n", names[v], stream_names[s], ns);
            }
    return 0;
}
