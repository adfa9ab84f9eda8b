/* Stand-in CUDA driver (libcuda.so.1) for CI: one device with a GPU clock,
 * streams that run their work one item after another on it, events that
 * take the time at which their stream reaches them.  The stand-in runtime
 * (cudart.c) is a thin layer over it, as the real one is; the hook records a
 * timed call's events through the driver's cuEventRecord and the writer
 * queries them through the runtime, so both reach this one model.
 *
 * The GPU clock is virtual by default: it stands at 0 and only the streams'
 * work moves them on, so every event completes at once and every duration is
 * exactly the modelled kernel time.  With STANDIN_GPU_CLOCK=realtime:<skew_ns>
 * it reads CLOCK_REALTIME + skew_ns (a GPU clock that disagrees with the
 * host's by a known amount), and an event completes only once that clock has
 * reached it: a test can then check where the hook places calls in time.
 * STANDIN_GPU_CLOCK=realtime:<skew_ns>:<ppm> also makes it run <ppm> parts
 * per million fast (drift, from the first reading on).
 * A stalled stream never completes the events recorded on it (an op that
 * hangs); a capturing one says so to cuStreamIsCapturing (work in CUDA-graph
 * capture, which the hook does not time). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NOT_READY 600

typedef struct standin_stream {
    uint64_t busy_until; /* GPU time when the work queued so far ends */
    int stalled;
    int capturing; /* being captured into a CUDA graph (as the driver reports it) */
} standin_stream;

typedef struct standin_event {
    uint64_t t; /* GPU time at which the stream reaches the event */
    int recorded, never;
} standin_event;

static standin_stream default_stream;
static __thread long events_recorded; /* by the calling thread (the hook's writer records anchors) */
static int clock_mode = -1; /* -1 unread, 0 virtual, 1 realtime + skew */
static int64_t clock_skew_ns;
static double clock_drift; /* fraction the GPU clock runs fast */
static int64_t clock_base_ns; /* CLOCK_REALTIME at the first reading: drift accumulates from there */

static standin_stream *resolve(void *s) { return s ? (standin_stream *)s : &default_stream; }

static uint64_t gpu_now(void)
{
    if (clock_mode < 0) {
        const char *v = getenv("STANDIN_GPU_CLOCK");
        clock_mode = v && strncmp(v, "realtime:", 9) == 0;
        if (clock_mode) {
            char *end;
            clock_skew_ns = strtoll(v + 9, &end, 10);
            if (*end == ':') clock_drift = strtod(end + 1, NULL) / 1e6;
        }
    }
    if (!clock_mode) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (!clock_base_ns) clock_base_ns = now;
    return (uint64_t)(now + clock_skew_ns + (int64_t)((double)(now - clock_base_ns) * clock_drift));
}

/* When the next item queued on `s` starts: after the stream's earlier work, and not before now. */
static uint64_t next_start(standin_stream *s)
{
    uint64_t now = gpu_now();
    return s->busy_until > now ? s->busy_until : now;
}

void *standin_stream_create(void) { return calloc(1, sizeof(standin_stream)); }
void standin_stream_stall(void *s, int on) { resolve(s)->stalled = on; }
void standin_stream_capture(void *s, int on) { resolve(s)->capturing = on; }
long standin_events_recorded(void) { return events_recorded; }

/* A kernel of `ns` on the stream (the stand-in cuBLAS calls this). */
void standin_stream_advance(void *s, uint64_t ns)
{
    standin_stream *st = resolve(s);
    st->busy_until = next_start(st) + ns;
}

/* The stream waits `ns` without running a kernel (as on another stream's
 * event); returns the GPU time its next item starts at. */
uint64_t standin_stream_wait(void *s, uint64_t ns)
{
    standin_stream *st = resolve(s);
    st->busy_until = next_start(st) + ns;
    return st->busy_until;
}

static int current_ctx; /* the one context; its address is the handle */

int cuEventRecord(void *event, void *stream)
{
    standin_event *e = event;
    standin_stream *s = resolve(stream);
    e->t = next_start(s);
    s->busy_until = e->t;
    e->recorded = 1;
    e->never = s->stalled;
    events_recorded++;
    return 0;
}

int cuEventQuery(void *event)
{
    standin_event *e = event;
    return e->never || (clock_mode == 1 && e->t > gpu_now()) ? NOT_READY : 0;
}

/* Signed, like the GPU timestamps it subtracts. */
int cuEventElapsedTime(float *ms, void *start, void *stop)
{
    standin_event *a = start, *b = stop;
    if (!a->recorded || !b->recorded) return 400; /* CUDA_ERROR_INVALID_HANDLE */
    if (cuEventQuery(a) || cuEventQuery(b)) return NOT_READY;
    *ms = (float)((double)(int64_t)(b->t - a->t) / 1e6);
    return 0;
}

int cuEventCreate(void **event, unsigned flags)
{
    (void)flags;
    *event = calloc(1, sizeof(standin_event));
    return *event ? 0 : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}

int cuEventDestroy_v2(void *event)
{
    free(event);
    return 0;
}

int cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    *stream = standin_stream_create();
    return *stream ? 0 : 2;
}

int cuStreamIsCapturing(void *stream, int *status)
{
    *status = resolve(stream)->capturing; /* CU_STREAM_CAPTURE_STATUS_NONE / _ACTIVE */
    return 0;
}

int cuCtxGetCurrent(void **ctx)
{
    *ctx = &current_ctx;
    return 0;
}

int cuCtxGetDevice(int *device)
{
    *device = 0;
    return 0;
}
