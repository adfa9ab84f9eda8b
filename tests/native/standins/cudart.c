/* Stand-in CUDA runtime for CI: streams are virtual clocks, events copy the
 * clock of the stream they are recorded on.  A stalled stream never
 * completes the events recorded on it (an op that hangs). */
#include <stdint.h>
#include <stdlib.h>

typedef struct standin_stream {
    uint64_t clock_ns;
    int stalled;
} standin_stream;

typedef struct standin_event {
    uint64_t t;
    int never;
} standin_event;

static standin_stream default_stream;
static long events_recorded;

static standin_stream *resolve(void *s) { return s ? (standin_stream *)s : &default_stream; }

void *standin_stream_create(void) { return calloc(1, sizeof(standin_stream)); }
void standin_stream_advance(void *s, uint64_t ns) { resolve(s)->clock_ns += ns; }
void standin_stream_stall(void *s, int on) { resolve(s)->stalled = on; }
long standin_events_recorded(void) { return events_recorded; }

int cudaEventCreateWithFlags(void **event, unsigned flags)
{
    (void)flags;
    *event = calloc(1, sizeof(standin_event));
    return *event ? 0 : 2;
}

int cudaEventDestroy(void *event)
{
    free(event);
    return 0;
}

int cudaEventRecord(void *event, void *stream)
{
    standin_event *e = event;
    e->t = resolve(stream)->clock_ns;
    e->never = resolve(stream)->stalled;
    __atomic_fetch_add(&events_recorded, 1, __ATOMIC_RELAXED);
    return 0;
}

int cudaEventQuery(void *event) { return ((standin_event *)event)->never ? 600 : 0; }

int cudaEventElapsedTime(float *ms, void *start, void *stop)
{
    *ms = (float)((double)(((standin_event *)stop)->t - ((standin_event *)start)->t) / 1e6);
    return 0;
}

int cudaGetDevice(int *device)
{
    *device = 0;
    return 0;
}

int cudaSetDevice(int device) { return device == 0 ? 0 : 101; }

int cudaStreamIsCapturing(void *stream, int *status)
{
    (void)stream;
    *status = 0;
    return 0;
}
