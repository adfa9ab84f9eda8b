/* Pooled CUDA event pairs on the caller's stream, placed on the GPU's clock.
 *
 * CUDA is never linked: its functions are looked up at runtime in whichever
 * libcudart and libcuda the process already loaded.  The calls a timed GEMM
 * makes on its own thread (capture check, current context, two event
 * records) go to the driver API: a runtime cudaEvent_t / cudaStream_t is the
 * driver's CUevent / CUstream, the runtime made the context current, and the
 * driver's calls skip the runtime's own layer (bench/native/native_callcost.md: on
 * an H100, cuEventRecord 0.83-1.16 us against cudaEventRecord's 1.08-1.99 us).
 * Creating events, querying them and the writer's device switch stay with
 * the runtime (cold paths; cudaSetDevice makes a device's primary context
 * current).  Event pairs come from a fixed pool (a lock-free free list); a
 * GEMM that finds the pool empty, runs inside CUDA-graph capture or on a
 * thread with no current context is counted but not timed.
 *
 * Both events of a pair must be timing events recorded in the call's stream
 * order: the start cannot be taken from an event recorded earlier (other
 * work, which the hook does not see, may run between) nor the stop from the
 * writer thread.  Two driver records are therefore the floor of an exact
 * timed call.
 *
 * Placement (the technique xpu-timer uses, per device here): the writer
 * records an anchor event on a private idle stream and reads CLOCK_REALTIME
 * around it until it completes; a call's start is then the anchor's CPU time
 * plus elapsed(anchor -> start event), its end likewise with the stop event.
 * Both come from the GPU's own clock, so calls that ran back to back on a
 * stream are placed back to back and idle time is the GPU's.  The anchor is
 * renewed every second (drift between the two clocks, float precision of
 * the elapsed time); the previous one stays for calls launched before the
 * new one was taken. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
typedef int (*stream_create_fn)(void **stream, unsigned flags);
typedef int (*ctx_get_current_fn)(void **ctx);
#define CAPTURE_MODE_RELAXED 2
#define STREAM_NON_BLOCKING 1

static struct {
    /* runtime (libcudart) */
    event_create_fn create;
    event_destroy_fn destroy;
    event_record_fn record; /* the writer's anchors */
    event_query_fn query;
    event_elapsed_fn elapsed;
    get_device_fn get_device;
    set_device_fn set_device;
    capture_mode_fn exchange_capture_mode; /* optional */
    stream_create_fn stream_create;         /* optional: without it, no GPU-clock placement */
    /* driver (libcuda), a timed call's own thread */
    event_record_fn cu_record;
    stream_capturing_fn cu_capturing;
    ctx_get_current_fn cu_current;
} cuda;

typedef struct timer {
    void *start, *stop;
    void *ctx; /* the context its events belong to */
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
    cuda.cu_record = (event_record_fn)tp_resolve("cuEventRecord");
    cuda.cu_capturing = (stream_capturing_fn)tp_resolve("cuStreamIsCapturing");
    cuda.cu_current = (ctx_get_current_fn)tp_resolve("cuCtxGetCurrent");
    cuda.query = (event_query_fn)tp_resolve("cudaEventQuery");
    cuda.elapsed = (event_elapsed_fn)tp_resolve("cudaEventElapsedTime");
    cuda.get_device = (get_device_fn)tp_resolve("cudaGetDevice");
    cuda.set_device = (set_device_fn)tp_resolve("cudaSetDevice");
    cuda.exchange_capture_mode = (capture_mode_fn)tp_resolve("cudaThreadExchangeStreamCaptureMode");
    cuda.stream_create = (stream_create_fn)tp_resolve("cudaStreamCreateWithFlags");
    int ok = cuda.create && cuda.destroy && cuda.record && cuda.query && cuda.elapsed && cuda.get_device &&
             cuda.set_device && cuda.cu_record && cuda.cu_capturing && cuda.cu_current;
    if (ok && !g_free) {
        g_free = tp_queue_create(TIMER_COUNT, sizeof(uint32_t));
        if (g_free) fill_free_list();
        ok = g_free != NULL;
    }
    if (ok) tp_set_flag(TP_FLAG_CUDA_TIMING);
    atomic_store_explicit(&g_cuda_state, ok ? 2 : 3, memory_order_release);
    return ok;
}

/* The pair's events, made anew when the calling thread's context is not the
 * one they were made in (another device); 0 when they cannot be. */
static int events_for(timer *t, void *ctx)
{
    if (TP_LIKELY(t->created && t->ctx == ctx)) return 1;
    if (t->created) {
        cuda.destroy(t->start);
        cuda.destroy(t->stop);
        t->created = 0;
    }
    int device = 0;
    if (cuda.get_device(&device) != CUDA_SUCCESS) return 0;
    if (cuda.create(&t->start, 0) != CUDA_SUCCESS) return 0;
    if (cuda.create(&t->stop, 0) != CUDA_SUCCESS) {
        cuda.destroy(t->start);
        return 0;
    }
    t->ctx = ctx;
    t->device = device;
    t->created = 1;
    return 1;
}

int tp_timer_acquire(void *stream, uint32_t *out)
{
    if (!cuda_usable()) return 0;
    int capture = 0;
    if (cuda.cu_capturing(stream, &capture) != CUDA_SUCCESS || capture != 0) return 0;
    void *ctx = NULL;
    if (cuda.cu_current(&ctx) != CUDA_SUCCESS || !ctx) return 0; /* the call's own launch would make one current */
    uint32_t i;
    if (!tp_queue_pop(g_free, &i)) return 0;
    timer *t = &g_timers[i];
    if (!events_for(t, ctx) || cuda.cu_record(t->start, stream) != CUDA_SUCCESS) {
        tp_queue_push(g_free, &i);
        return 0;
    }
    *out = i;
    return 1;
}

void tp_timer_stop(uint32_t i, void *stream) { cuda.cu_record(g_timers[i].stop, stream); }

void tp_timer_abandon(uint32_t i) { tp_queue_push(g_free, &i); }

/* ---- anchors (writer thread only) -------------------------------------- */

#define MAX_DEVICES 64
#define ANCHOR_TRIES 3                 /* the tightest CPU window of these is kept */
#define ANCHOR_WAIT_NS 2000000ULL      /* a try whose event is not done by then is dropped */
#define REANCHOR_NS 1000000000ULL

typedef struct anchor {
    void *event;       /* the try kept; NULL: none */
    uint64_t cpu_ns;   /* CLOCK_REALTIME of the event's GPU timestamp (window midpoint) */
    uint64_t done_ns;  /* when it was seen complete: calls launched later ran after it */
} anchor;

typedef struct device_clock {
    void *stream;
    void *events[2][ANCHOR_TRIES]; /* two generations: the current anchor and the previous */
    int generation;
    anchor cur, prev;
    int broken;                    /* stream or events could not be made: no placement */
} device_clock;

static device_clock g_clocks[MAX_DEVICES];

static int make_clock(device_clock *c)
{
    if (!cuda.stream_create || cuda.stream_create(&c->stream, STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 0;
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < ANCHOR_TRIES; i++)
            if (cuda.create(&c->events[g][i], 0) != CUDA_SUCCESS) return 0;
    return 1;
}

/* A new anchor for the writer's current device: record, then spin on the
 * event; its GPU timestamp lies between the record call and the completion
 * seen, and the midpoint of the narrowest such window is kept. */
static void take_anchor(device_clock *c)
{
    void **events = c->events[c->generation ^ 1];
    anchor best = {0};
    uint64_t best_window = UINT64_MAX;
    for (int i = 0; i < ANCHOR_TRIES; i++) {
        uint64_t t0 = tp_now_ns();
        if (cuda.record(events[i], c->stream) != CUDA_SUCCESS) return;
        uint64_t t2;
        int q;
        do {
            q = cuda.query(events[i]);
            t2 = tp_now_ns();
        } while (q == CUDA_ERROR_NOT_READY && t2 - t0 < ANCHOR_WAIT_NS);
        if (q != CUDA_SUCCESS) continue;
        if (t2 - t0 < best_window) {
            best_window = t2 - t0;
            best = (anchor){events[i], t0 + (t2 - t0) / 2, t2};
        }
    }
    if (!best.event) return;
    c->generation ^= 1;
    c->prev = c->cur;
    c->cur = best;
}

/* The device's anchor for a call launched at `launched_ns`, renewed when
 * due; NULL when the device has none. */
static const anchor *anchor_for(int device, uint64_t launched_ns)
{
    if (device < 0 || device >= MAX_DEVICES) return NULL;
    device_clock *c = &g_clocks[device];
    if (c->broken) return NULL;
    if (!c->stream && !make_clock(c)) {
        c->broken = 1;
        return NULL;
    }
    uint64_t now = tp_now_ns();
    if (!c->cur.event || now - c->cur.done_ns > REANCHOR_NS) take_anchor(c);
    if (c->cur.event && c->cur.done_ns <= launched_ns) return &c->cur;
    if (c->prev.event && c->prev.done_ns <= launched_ns) return &c->prev;
    return c->cur.event ? &c->cur : NULL; /* launched before any anchor: elapsed may be negative */
}

static int place(const anchor *a, void *event, uint64_t *at)
{
    float ms = 0;
    if (cuda.elapsed(&ms, a->event, event) != CUDA_SUCCESS) return 0;
    int64_t off = (int64_t)((double)ms * 1e6 + (ms < 0 ? -0.5 : 0.5));
    if (off < 0 && (uint64_t)-off > a->cpu_ns) return 0;
    *at = (uint64_t)((int64_t)a->cpu_ns + off);
    return 1;
}

int tp_timer_poll(uint32_t i, uint64_t launched_ns, tp_gpu_span *span)
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
    /* Not ready while either event is pending: the completion check and the
     * duration in one driver call (each call the writer makes can hold up an
     * application thread's event record). */
    float ms = 0;
    int q = cuda.elapsed(&ms, t->start, t->stop);
    if (q == CUDA_ERROR_NOT_READY) return 0;
    if (q != CUDA_SUCCESS || ms < 0) return -1;
    span->dur_ns = (uint64_t)((double)ms * 1e6 + 0.5);
    span->start_ns = span->end_ns = 0;
    const anchor *a = anchor_for(t->device, launched_ns);
    if (!a || !place(a, t->start, &span->start_ns) || !place(a, t->stop, &span->end_ns) ||
        span->end_ns < span->start_ns)
        span->start_ns = span->end_ns = 0;
    return 1;
}

void tp_timer_release(uint32_t i) { tp_queue_push(g_free, &i); }

void tp_timer_fork_child(void)
{
    /* The parent's events mean nothing in the child (CUDA does not survive
     * fork); forget them without touching the driver. */
    for (uint32_t i = 0; i < TIMER_COUNT; i++) g_timers[i].created = 0;
    memset(g_clocks, 0, sizeof(g_clocks));
    if (g_free) fill_free_list();
    g_writer_device = -1;
}
