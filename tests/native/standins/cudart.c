/* Stand-in CUDA runtime for CI: the runtime calls the hook and the stand-in
 * libraries make, each passed to the stand-in driver (cuda.c, linked as
 * libcuda.so.1), which models the device, its streams and events.
 *
 * Device memory is host memory here: cudaMalloc(Async) hands out 256-byte
 * aligned blocks (as the real one does), copies are memcpy, and each copy
 * occupies its stream (cudaMemcpy: the default one) for
 * standin_copy_ns(bytes) of GPU time, so the events around it measure that. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int cuEventRecord(void *event, void *stream);
int cuEventQuery(void *event);
int cuEventElapsedTime(float *ms, void *start, void *stop);
int cuEventCreate(void **event, unsigned flags);
int cuEventDestroy_v2(void *event);
int cuStreamCreate(void **stream, unsigned flags);
int cuCtxGetDevice(int *device);
void standin_stream_advance(void *s, uint64_t ns);

#define SUCCESS 0
#define ERROR_INVALID_VALUE 1
#define ERROR_MEMORY_ALLOCATION 2
#define ERROR_INVALID_MEMCPY_DIRECTION 21
#define MEMCPY_KINDS 5 /* HostToHost .. Default */

int cudaStreamCreateWithFlags(void **stream, unsigned flags) { return cuStreamCreate(stream, flags); }
int cudaEventCreateWithFlags(void **event, unsigned flags) { return cuEventCreate(event, flags); }
int cudaEventDestroy(void *event) { return cuEventDestroy_v2(event); }
int cudaEventRecord(void *event, void *stream) { return cuEventRecord(event, stream); }
int cudaEventQuery(void *event) { return cuEventQuery(event); }
int cudaEventElapsedTime(float *ms, void *start, void *stop) { return cuEventElapsedTime(ms, start, stop); }
int cudaGetDevice(int *device) { return cuCtxGetDevice(device); }
int cudaSetDevice(int device) { return device == 0 ? 0 : 101; }

/* The modelled GPU time of a copy of `bytes`: 1 us, plus 10 bytes a nanosecond. */
uint64_t standin_copy_ns(uint64_t bytes) { return 1000 + bytes / 10; }

/* The async calls do not go through the exported cudaMalloc / cudaFree (the hook would count them twice). */
static int allocate(void **p, size_t size)
{
    if (!p) return ERROR_INVALID_VALUE;
    *p = aligned_alloc(256, (size + 255) / 256 * 256 + 256);
    return *p ? SUCCESS : ERROR_MEMORY_ALLOCATION;
}

int cudaMalloc(void **p, size_t size) { return allocate(p, size); }

int cudaFree(void *p)
{
    free(p);
    return SUCCESS;
}

int cudaMallocAsync(void **p, size_t size, void *stream)
{
    (void)stream;
    return allocate(p, size);
}

int cudaFreeAsync(void *p, void *stream)
{
    (void)stream;
    free(p);
    return SUCCESS;
}

static int copy(void *dst, const void *src, size_t count, int kind, void *stream)
{
    if (kind < 0 || kind >= MEMCPY_KINDS) return ERROR_INVALID_MEMCPY_DIRECTION;
    memmove(dst, src, count);
    standin_stream_advance(stream, standin_copy_ns(count));
    return SUCCESS;
}

int cudaMemcpy(void *dst, const void *src, size_t count, int kind) { return copy(dst, src, count, kind, NULL); }

int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream)
{
    return copy(dst, src, count, kind, stream);
}
