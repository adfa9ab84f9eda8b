/* Pooled CUDA event pairs on the caller's stream.
 *
 * The CUDA runtime is never linked: its functions are looked up at runtime
 * in whichever libcudart the process already loaded.  Event pairs come from
 * a fixed pool (a lock-free free list); a GEMM that finds the pool empty, or
 * runs inside CUDA-graph capture, is counted but not timed. */
#include <stdatomic.h>
#include <stdlib.h>

#include "hook_internal.h"

#define TIMER_COUNT 4096u
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_READY 600

typedef int (*event_create_fn)(void **event, unsigned flags);
typedef int (*event_destroy_fn)(void *event);
typedef int (*event_record_fn)(void *event, void *stream);
typedef int (*event_query_fn)(void *event);
typedef int (*event_elapsed_fn)(float *ms, void *start, void *stop);
typedef int (*get_device_fn)(int *device);
typedef int (*set_device_fn)(int device);
typedef int (*stream_capturing_fn)(void *stream, int *status);
typedef int (*capture_mode_fn)(int *mode);
#define CAPTURE_MODE_RELAXED 2

static struct {
    event_create_fn create;
    event_destroy_fn destroy;
    event_record_fn record;
    event_query_fn query;
    event_elapsed_fn elapsed;
    get_device_fn get_device;
    set_device_fn set_device;
    stream_capturing_fn capturing; /* optional */
    capture_mode_fn exchange_capture_mode; /* optional */
} cuda;

typedef struct timer {
    void *start, *stop;
    int device;
    int created;
} timer;

static timer g_timers[TIMER_COUNT];
static tp_queue *g_free;
static _Atomic int g_cuda_state; /* 0 unresolved, 1 resolving, 2 usable, 3 unusable */
static int g_writer_device = -1;

static void fill_free_list(void)
{
    tp_queue_reset(g_free);
    for (uint32_t i = 0; i < TIMER_COUNT; i++) tp_queue_push(g_free, &i);
}

static int cuda_usable(void)
{
    int s = atomic_load_explicit(&g_cuda_state, memory_order_acquire);
    if (TP_LIKELY(s == 2)) return 1;
    if (s != 0) return 0;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g_cuda_state, &expected, 1)) return 0;
    cuda.create = (event_create_fn)tp_resolve("cudaEventCreateWithFlags");
    cuda.destroy = (event_destroy_fn)tp_resolve("cudaEventDestroy");
    cuda.record = (event_record_fn)tp_resolve("cudaEventRecord");
    cuda.query = (event_query_fn)tp_resolve("cudaEventQuery");
    cuda.elapsed = (event_elapsed_fn)tp_resolve("cudaEventElapsedTime");
    cuda.get_device = (get_device_fn)tp_resolve("cudaGetDevice");
    cuda.set_device = (set_device_fn)tp_resolve("cudaSetDevice");
    cuda.capturing = (stream_capturing_fn)tp_resolve("cudaStreamIsCapturing");
    cuda.exchange_capture_mode = (capture_mode_fn)tp_resolve("cudaThreadExchangeStreamCaptureMode");
    int ok = cuda.create && cuda.destroy && cuda.record && cuda.query && cuda.elapsed && cuda.get_device &&
             cuda.set_device;
    if (ok && !g_free) {
        g_free = tp_queue_create(TIMER_COUNT, sizeof(uint32_t));
        if (g_free) fill_free_list();
        ok = g_free != NULL;
    }
    if (ok) tp_set_flag(TP_FLAG_CUDA_TIMING);
    atomic_store_explicit(&g_cuda_state, ok ? 2 : 3, memory_order_release);
    return ok;
}

int tp_timer_acquire(void *stream, uint32_t *out)
{
    if (!cuda_usable()) return 0;
    if (cuda.capturing) {
        int status = 0;
        if (cuda.capturing(stream, &status) != CUDA_SUCCESS || status != 0) return 0;
    }
    uint32_t i;
    if (!tp_queue_pop(g_free, &i)) return 0;
    timer *t = &g_timers[i];
    int device = 0;
    if (cuda.get_device(&device) != CUDA_SUCCESS) goto give_back;
    if (!t->created || t->device != device) {
        if (t->created) {
            cuda.destroy(t->start);
            cuda.destroy(t->stop);
            t->created = 0;
        }
        if (cuda.create(&t->start, 0) != CUDA_SUCCESS) goto give_back;
        if (cuda.create(&t->stop, 0) != CUDA_SUCCESS) {
            cuda.destroy(t->start);
            goto give_back;
        }
        t->device = device;
        t->created = 1;
    }
    if (cuda.record(t->start, stream) != CUDA_SUCCESS) goto give_back;
    *out = i;
    return 1;
give_back:
    tp_queue_push(g_free, &i);
    return 0;
}

void tp_timer_stop(uint32_t i, void *stream) { cuda.record(g_timers[i].stop, stream); }

void tp_timer_abandon(uint32_t i) { tp_queue_push(g_free, &i); }

int tp_timer_poll(uint32_t i, uint64_t *dur_ns)
{
    timer *t = &g_timers[i];
    if (t->device != g_writer_device) {
        if (g_writer_device == -1 && cuda.exchange_capture_mode) {
            /* Relaxed capture interaction for this (writer) thread, so its
             * event queries never invalidate a CUDA-graph capture that an
             * application thread runs in global mode. */
            int mode = CAPTURE_MODE_RELAXED;
            cuda.exchange_capture_mode(&mode);
        }
        /* Query from the right device, so the writer thread never creates a
         * context on device 0 for a rank that lives on another GPU. */
        if (cuda.set_device(t->device) != CUDA_SUCCESS) return -1;
        g_writer_device = t->device;
    }
    int q = cuda.query(t->stop);
    if (q == CUDA_ERROR_NOT_READY) return 0;
    if (q != CUDA_SUCCESS) return -1;
    float ms = 0;
    if (cuda.elapsed(&ms, t->start, t->stop) != CUDA_SUCCESS || ms < 0) return -1;
    *dur_ns = (uint64_t)((double)ms * 1e6 + 0.5);
    return 1;
}

void tp_timer_release(uint32_t i) { tp_queue_push(g_free, &i); }

void tp_timer_fork_child(void)
{
    /* The parent's events mean nothing in the child (CUDA does not survive
     * fork); forget them without touching the driver. */
    for (uint32_t i = 0; i < TIMER_COUNT; i++) g_timers[i].created = 0;
    if (g_free) fill_free_list();
    g_writer_device = -1;
}
