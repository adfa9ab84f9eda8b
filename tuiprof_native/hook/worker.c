/* Lazy start, the writer thread, fork handling and exit flush.
 *
 * Nothing happens when the library is loaded except registering fork and
 * exit handlers.  The first GEMM, NCCL communicator, step or DataLoader wait
 * creates the segment and starts one background thread; from then on that
 * thread alone writes the segment.  If anything is missing (room in
 * /dev/shm, memory, a thread) or in the way (a file at the segment's path),
 * or TUIPROF_DISABLE=1, the hook stays inert and every interposer is a plain
 * pass-through; the first two say why on stderr and in a note for the agent
 * (shm_files.c). */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "hook_internal.h"

#define RECORD_QUEUE 8192u
#define GEMM_PENDING 4096u /* = timer pool size: a pending GEMM owns a timer */
#define MAX_STREAMS 64u
#define NCCL_OUTSTANDING TP_NCCL_TOKENS /* plugin ops, then the API fallback's */
#define BUSY_SLEEP_NS 100000L /* GEMMs to poll or collectives in flight */
/* Nothing to do: sleep 1 ms, then twice as long each time up to 50 ms, and
 * back to 1 ms once work comes.  An idle rank's writer wakes 20 times a
 * second instead of 1000 (bench/native/native_idle.md); 50 ms bounds the heartbeat's
 * age.  A writer asleep longer than 1 ms is "parked" on a futex, and the
 * first record submitted wakes it, so a burst after a quiet spell finds it
 * draining the queue instead of overflowing it. */
#define IDLE_SLEEP_MIN_NS 1000000L
#define IDLE_SLEEP_MAX_NS 50000000L
#define SWEEP_EVERY_NS 10000000ULL

enum { STOPPED = 0, STARTING = 1, RUNNING = 2, INERT = 3 };

static _Atomic int g_state;
static _Atomic uint32_t g_flags;
static _Atomic uint64_t g_drops;
static _Atomic int g_flush_request, g_drained, g_stop;
static _Atomic uint32_t g_parked; /* 1 while the writer sleeps on it (futex word) */
static tp_queue *g_records;
static pthread_t g_thread;

/* Writer-private state. */
typedef struct stream_fifo {
    uint64_t stream;
    uint64_t last_end_ns; /* end of the last call placed on this stream */
    uint32_t head, tail; /* indices into timers[], mod GEMM_PENDING */
    uint32_t timers[GEMM_PENDING];
} stream_fifo;

static stream_fifo *g_streams; /* MAX_STREAMS, calloc'd at start */
static uint32_t g_stream_count;
static tp_record *g_pending;   /* by timer index */
static tp_record *g_outstanding; /* NCCL, by token */
static uint8_t *g_outstanding_used;
static uint32_t g_outstanding_count;
static int g_inflight_dirty;
static uint32_t g_inflight_published;

int tp_is_running(void) { return atomic_load_explicit(&g_state, memory_order_acquire) == RUNNING; }

void tp_set_flag(uint32_t flag) { atomic_fetch_or(&g_flags, flag); }

uint32_t tp_flags(void) { return atomic_load_explicit(&g_flags, memory_order_relaxed); }

void tp_count_drop(void) { atomic_fetch_add_explicit(&g_drops, 1, memory_order_relaxed); }

/* Wake a parked writer.  Producers pay one relaxed load while it is awake;
 * a wake-up lost to a race costs at most one back-off sleep. */
static void wake_writer(void)
{
    if (TP_UNLIKELY(atomic_load_explicit(&g_parked, memory_order_relaxed)) && atomic_exchange(&g_parked, 0))
        syscall(SYS_futex, &g_parked, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void tp_submit(const tp_record *r)
{
    if (!g_records || !tp_queue_push(g_records, r)) {
        tp_count_drop();
        return;
    }
    wake_writer();
}

/* ---- writer ------------------------------------------------------------ */

static stream_fifo *fifo_for(uint64_t stream)
{
    for (uint32_t i = 0; i < g_stream_count; i++)
        if (g_streams[i].stream == stream) return &g_streams[i];
    if (g_stream_count == MAX_STREAMS) return NULL;
    stream_fifo *f = &g_streams[g_stream_count++];
    f->stream = stream;
    f->last_end_ns = 0;
    f->head = f->tail = 0;
    return f;
}

/* A launch that is counted without a duration (its timing failed, or never began). */
static void fold_untimed_launch(tp_record *r)
{
    if (r->type == TP_REC_COPY_LAUNCH) { /* a copy whose timing failed: counted already, untimed */
        tp_memory_copy_untimed(r);
        return;
    }
    r->start_ns = r->launched_ns;
    r->end_ns = 0;
    tp_segment_fold(r, TP_KIND_GEMM);
    tp_counters_begin();
    tp_segment_get()->header.counters.gemm_untimed++;
    tp_counters_end();
}

static void record_interval(const tp_record *r, uint32_t kind)
{
    tp_counters *c = &tp_segment_get()->header.counters;
    tp_record e = *r;
    tp_counters_begin();
    if (kind == TP_KIND_STEP) {
        if (c->last_step_ns) {
            e.start_ns = c->last_step_ns;
            c->last_step_time_ns = r->end_ns - c->last_step_ns;
            c->step_time_total_ns += c->last_step_time_ns;
        } else {
            e.start_ns = r->end_ns;
        }
        c->step_count++;
        c->last_step_ns = r->end_ns;
        e.op_seq = c->step_count;
    } else if (kind == TP_KIND_GC) {
        c->gc_count++;
        c->gc_pause_total_ns += r->end_ns - r->start_ns;
    } else {
        c->dataloader_count++;
        c->dataloader_wait_total_ns += r->end_ns - r->start_ns;
    }
    tp_counters_end();
    tp_segment_event(&e, kind);
}

static void handle_record(tp_record *r)
{
    switch (r->type) {
    case TP_REC_GEMM_LAUNCH:
    case TP_REC_COPY_LAUNCH: { /* both wait in their stream's order for their stop event */
        stream_fifo *f = fifo_for(r->stream);
        if (!f) { /* too many streams: count it, untimed */
            tp_timer_release(r->timer);
            r->dur_ns = UINT64_MAX;
            fold_untimed_launch(r);
            break;
        }
        g_pending[r->timer] = *r;
        f->timers[f->tail++ % GEMM_PENDING] = r->timer;
        g_inflight_dirty = 1;
        break;
    }
    case TP_REC_GEMM_UNTIMED: fold_untimed_launch(r); break;
    case TP_REC_NCCL_START:
        if (!g_outstanding_used[r->token]) g_outstanding_count++;
        g_outstanding[r->token] = *r;
        g_outstanding_used[r->token] = 1;
        g_inflight_dirty = 1;
        break;
    case TP_REC_NCCL_DONE:
        if (g_outstanding_used[r->token]) {
            g_outstanding_used[r->token] = 0;
            g_outstanding_count--;
            g_inflight_dirty = 1;
        }
        tp_segment_fold(r, TP_KIND_NCCL);
        if (r->dur_ns == UINT64_MAX) {
            tp_counters_begin();
            tp_segment_get()->header.counters.nccl_untimed++;
            tp_counters_end();
        }
        break;
    case TP_REC_STEP: record_interval(r, TP_KIND_STEP); break;
    case TP_REC_GC: record_interval(r, TP_KIND_GC); break;
    case TP_REC_DATALOADER: record_interval(r, TP_KIND_DATALOADER); break;
    case TP_REC_NCCL_SPAN: tp_nccl_fallback_track(r->timer); break;
    default: break;
    }
}

/* Where a finished call sits in time: from the GPU's clock when its device
 * has an anchor; else its end is now (within one poll interval).  A stream
 * runs one call after another, so a start before the previous call's end
 * (two anchors' small disagreement) is moved to that end. */
static void place_gemm(stream_fifo *f, tp_record *r, const tp_gpu_span *span, uint64_t now)
{
    if (span->start_ns) {
        r->start_ns = span->start_ns;
        r->end_ns = span->end_ns;
    } else {
        r->end_ns = now;
        r->start_ns = now - span->dur_ns < r->launched_ns ? r->launched_ns : now - span->dur_ns;
    }
    if (r->start_ns < f->last_end_ns) r->start_ns = f->last_end_ns;
    if (r->end_ns < r->start_ns) r->end_ns = r->start_ns;
    f->last_end_ns = r->end_ns;
}

/* Completed GEMMs, oldest first per stream (events on one stream complete
 * in order, so only each stream's head is queried). */
static int poll_gemms(uint64_t now)
{
    int done = 0;
    for (uint32_t s = 0; s < g_stream_count; s++) {
        stream_fifo *f = &g_streams[s];
        while (f->head != f->tail) {
            uint32_t t = f->timers[f->head % GEMM_PENDING];
            tp_record *r = &g_pending[t];
            tp_gpu_span span;
            int st = tp_timer_poll(t, r->launched_ns, &span);
            if (st == 0) break;
            tp_timer_release(t);
            f->head++;
            done++;
            g_inflight_dirty = 1;
            if (st < 0) {
                r->dur_ns = UINT64_MAX;
                fold_untimed_launch(r);
                continue;
            }
            if (r->type == TP_REC_COPY_LAUNCH) {
                tp_memory_copy_timed(r, span.dur_ns);
                continue;
            }
            r->dur_ns = span.dur_ns;
            place_gemm(f, r, &span, now);
            tp_gemm_timing_done(r); /* first: once the slot shows the call, its shape's period counts it */
            tp_segment_fold(r, TP_KIND_GEMM);
        }
    }
    return done;
}

static void put_inflight(uint32_t i, uint32_t kind, const tp_record *oldest, uint64_t key, uint32_t pending)
{
    tp_inflight *e = &tp_segment_get()->inflight[i];
    tp_write_begin(&e->seq);
    e->kind = kind;
    e->pending = pending;
    tp_copy_name(e->op, sizeof(e->op), oldest->op);
    e->key = key;
    e->op_seq = oldest->op_seq;
    e->launched_ns = oldest->launched_ns;
    tp_write_end(&e->seq);
}

static void publish_inflight(void)
{
    uint32_t n = 0;
    for (uint32_t s = 0; s < g_stream_count && n < TP_MAX_INFLIGHT; s++) {
        stream_fifo *f = &g_streams[s];
        if (f->head == f->tail) continue;
        const tp_record *oldest = &g_pending[f->timers[f->head % GEMM_PENDING]];
        uint32_t kind = oldest->type == TP_REC_COPY_LAUNCH ? TP_KIND_MEMCPY : TP_KIND_GEMM;
        put_inflight(n++, kind, oldest, f->stream, f->tail - f->head);
    }
    if (g_outstanding_count) {
        /* oldest op per communicator */
        uint64_t comms[TP_MAX_INFLIGHT];
        uint32_t oldest[TP_MAX_INFLIGHT], pending[TP_MAX_INFLIGHT], nc = 0;
        for (uint32_t t = 0; t < NCCL_OUTSTANDING; t++) {
            if (!g_outstanding_used[t]) continue;
            const tp_record *r = &g_outstanding[t];
            uint32_t c = 0;
            while (c < nc && comms[c] != r->stream) c++;
            if (c == nc) {
                if (nc == TP_MAX_INFLIGHT) continue;
                comms[nc] = r->stream, oldest[nc] = t, pending[nc] = 0, nc++;
            }
            pending[c]++;
            if (r->launched_ns < g_outstanding[oldest[c]].launched_ns) oldest[c] = t;
        }
        for (uint32_t c = 0; c < nc && n < TP_MAX_INFLIGHT; c++)
            put_inflight(n++, TP_KIND_NCCL, &g_outstanding[oldest[c]], comms[c], pending[c]);
    }
    for (uint32_t i = n; i < g_inflight_published; i++) {
        tp_inflight *e = &tp_segment_get()->inflight[i];
        tp_write_begin(&e->seq);
        e->kind = TP_KIND_NONE;
        tp_write_end(&e->seq);
    }
    g_inflight_published = n;
}

static void sync_header(void)
{
    tp_header *h = &tp_segment_get()->header;
    uint32_t flags = atomic_load(&g_flags);
    if (h->flags != flags) __atomic_store_n(&h->flags, flags, __ATOMIC_RELEASE);
    static int chain_failures_shown;
    uint32_t api = tp_nccl_profiler_api();
    int chain_failures = tp_chain_init_failures();
    /* The status is set once NCCL initialises the plugin (then the version is set); it changes
     * only when the chained plugin fails a later communicator's init. */
    if (h->nccl_profiler_api != api || chain_failures != chain_failures_shown) {
        tp_chain_status(h->nccl_chain, sizeof(h->nccl_chain));
        __atomic_store_n(&h->nccl_profiler_api, api, __ATOMIC_RELEASE);
        chain_failures_shown = chain_failures;
    }
    uint64_t drops = atomic_load(&g_drops), shortfall, late;
    tp_nccl_anomalies(&shortfall, &late);
    tp_counters *c = &h->counters;
    if (c->dropped_records != drops || c->nccl_channel_shortfall != shortfall || c->nccl_late_channels != late) {
        tp_counters_begin();
        c->dropped_records = drops;
        c->nccl_channel_shortfall = shortfall;
        c->nccl_late_channels = late;
        tp_counters_end();
    }
}

static int gemms_pending(void)
{
    for (uint32_t s = 0; s < g_stream_count; s++)
        if (g_streams[s].head != g_streams[s].tail) return 1;
    return 0;
}

/* How long to sleep after a pass that did `work` items; `idle_ns` is the
 * idle back-off, doubled here while nothing happens. */
static long sleep_after(int work, long *idle_ns)
{
    if (work) {
        *idle_ns = IDLE_SLEEP_MIN_NS;
        return 0;
    }
    if (gemms_pending() || g_outstanding_count) {
        *idle_ns = IDLE_SLEEP_MIN_NS;
        return BUSY_SLEEP_NS;
    }
    long ns = *idle_ns;
    *idle_ns = ns * 2 < IDLE_SLEEP_MAX_NS ? ns * 2 : IDLE_SLEEP_MAX_NS;
    return ns;
}

/* Checked after the writer marked itself parked: a record, flush or stop
 * that came just before saw no flag and woke nobody. */
static int nothing_asked(void)
{
    return tp_queue_empty(g_records) && atomic_load(&g_flush_request) == atomic_load(&g_drained) &&
           !atomic_load(&g_stop);
}

static void writer_sleep(long ns)
{
    struct timespec ts = {0, ns};
    if (ns <= IDLE_SLEEP_MIN_NS) {
        nanosleep(&ts, NULL);
        return;
    }
    atomic_store(&g_parked, 1);
    if (nothing_asked())
        syscall(SYS_futex, &g_parked, FUTEX_WAIT_PRIVATE, 1, &ts, NULL, 0); /* returns at once once woken */
    atomic_store(&g_parked, 0);
}

static void *writer_main(void *arg)
{
    (void)arg;
    uint64_t last_sweep = 0;
    long idle_ns = IDLE_SLEEP_MIN_NS;
    tp_record r;
    while (!atomic_load(&g_stop)) {
        int flush = atomic_load(&g_flush_request);
        int work = 0;
        while (work < 4096 && tp_queue_pop(g_records, &r)) {
            handle_record(&r);
            work++;
        }
        uint64_t now = tp_now_ns();
        work += poll_gemms(now);
        work += tp_nccl_fallback_poll();
        work += tp_gemm_harvest_counted();
        if (now - last_sweep > SWEEP_EVERY_NS) {
            tp_nccl_sweep(now);
            last_sweep = now;
        }
        if (g_inflight_dirty) {
            publish_inflight();
            g_inflight_dirty = 0;
        }
        sync_header();
        tp_memory_publish();
        tp_segment_heartbeat();
        if (flush && work == 0 && !gemms_pending()) atomic_store(&g_drained, flush);
        long sleep_ns = sleep_after(work, &idle_ns);
        if (sleep_ns) writer_sleep(sleep_ns);
    }
    return NULL;
}

static void free_writer_tables(void)
{
    free(g_streams), free(g_pending), free(g_outstanding), free(g_outstanding_used);
    g_streams = NULL, g_pending = NULL, g_outstanding = NULL, g_outstanding_used = NULL;
}

static int start_writer(char *why, size_t cap)
{
    g_streams = calloc(MAX_STREAMS, sizeof(stream_fifo));
    g_pending = calloc(GEMM_PENDING, sizeof(tp_record));
    g_outstanding = calloc(NCCL_OUTSTANDING, sizeof(tp_record));
    g_outstanding_used = calloc(NCCL_OUTSTANDING, 1);
    if (!g_records) g_records = tp_queue_create(RECORD_QUEUE, sizeof(tp_record));
    if (!g_streams || !g_pending || !g_outstanding || !g_outstanding_used || !g_records) {
        tp_reason(why, cap, 0, "out of memory for the writer's tables");
        free_writer_tables();
        return -1;
    }
    tp_gemm_sampling_init();
    if (tp_segment_create(why, cap) != 0) {
        free_writer_tables();
        return -1;
    }
    /* The writer takes no application signals. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&g_thread, NULL, writer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        tp_reason(why, cap, rc, "cannot start the writer thread");
        tp_segment_remove();
        free_writer_tables();
        return -1;
    }
    pthread_setname_np(g_thread, "tuiprof-writer");
    tp_exit_notes_install();
    return 0;
}

static int disabled_by_user(void)
{
    const char *off = getenv("TUIPROF_DISABLE");
    return off && *off && strcmp(off, "0") != 0;
}

int tp_ensure_started(void)
{
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (TP_LIKELY(s == RUNNING)) return 1;
    if (s != STOPPED) return 0;
    int expected = STOPPED;
    if (!atomic_compare_exchange_strong(&g_state, &expected, STARTING)) return 0;
    char why[TP_REASON_MAX];
    int ok = !disabled_by_user();
    if (ok && start_writer(why, sizeof(why)) != 0) {
        ok = 0;
        tp_report_inert(why); /* the user's TUIPROF_DISABLE needs no report */
    }
    atomic_store_explicit(&g_state, ok ? RUNNING : INERT, memory_order_release);
    return ok;
}

/* Wait (bounded) until everything submitted so far is in the segment. */
TP_EXPORT int tuiprof_flush(int timeout_ms)
{
    if (!tp_is_running()) return 0;
    int token = atomic_fetch_add(&g_flush_request, 1) + 1;
    atomic_store(&g_flush_request, token);
    wake_writer();
    for (int waited = 0; waited < timeout_ms * 10; waited++) {
        if (atomic_load(&g_drained) >= token) return 1;
        struct timespec ts = {0, 100000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static void fork_child(void)
{
    /* Only this thread exists in the child: no writer, no CUDA.  Forget the
     * parent's segment; the child makes its own on first use. */
    atomic_store(&g_state, STOPPED);
    atomic_store(&g_flush_request, 0);
    atomic_store(&g_drained, 0);
    atomic_store(&g_drops, 0);
    atomic_store(&g_flags, 0);
    atomic_store(&g_parked, 0);
    tp_segment_detach();
    free_writer_tables();
    g_stream_count = 0, g_outstanding_count = 0, g_inflight_published = 0, g_inflight_dirty = 0;
    if (g_records) tp_queue_reset(g_records);
    tp_timer_fork_child();
    tp_nccl_fork_child();
    tp_nccl_fallback_fork_child();
    tp_gemm_sampling_fork_child();
    tp_memory_fork_child();
}

__attribute__((constructor)) static void on_load(void) { pthread_atfork(NULL, NULL, fork_child); }

__attribute__((destructor)) static void on_unload(void)
{
    if (!tp_is_running()) return;
    tp_set_flag(TP_FLAG_EXITED);
    tuiprof_flush(1000);
    atomic_store(&g_stop, 1);
    wake_writer();
    /* Bounded: a writer stuck in a CUDA call during driver shutdown must not keep the
     * training process from exiting; the exit takes the thread with it. */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    pthread_timedjoin_np(g_thread, NULL, &deadline);
}
