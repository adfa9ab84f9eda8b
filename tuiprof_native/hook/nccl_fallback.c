/* NCCL collectives seen at the API, for an NCCL that did not accept the
 * profiler plugin (NCCL 2.18-2.22 have no profiler plugin API; a run with
 * NCCL_PROFILER_PLUGIN=none, or where NCCL could not load this library).
 *
 * The rule: an op is recorded here only while no communicator in this
 * process has initialised the profiler plugin (TP_FLAG_NCCL_PLUGIN unset).
 * NCCL initialises the plugin inside communicator init, before the
 * communicator's first collective, so with a plugin NCCL accepted nothing is
 * ever recorded twice: these interposers stay plain pass-throughs.
 *
 * Two modes, read once at the first op:
 * - counting only (default): op, dtype, bytes (nccl-tests size), comm hash,
 *   rank, per-communicator sequence; no CUDA call, no duration, no in-flight
 *   entry (nothing tells when the op finished);
 * - TUIPROF_NCCL_FALLBACK=1 (`tuiprof run --nccl-fallback`): a CUDA event
 *   pair on the op's stream around the call.  The start event completes
 *   when the stream reaches the op (its earlier work done), the stop event
 *   when the op's work is done: stream time, launch gaps and NCCL's host-
 *   side work between the two included, so it is not NCCL kernel time (the
 *   plugin's figure).  Waiting for peers is inside either.  The op is
 *   in-flight (for the hang detector) from its enqueue until the stop event
 *   completes.  Events on the NCCL stream may cost comm/compute overlap,
 *   which is why this is opt-in (bench/native/nccl_fallback.md).
 *
 * Ops inside ncclGroupStart/End are launched at the outermost ncclGroupEnd:
 * the group is timed as one span, and each of its ops carries that span
 * (its algorithm column reads "group" when the group held more than one op,
 * as their times are not separable).
 *
 * The communicator's hash is NCCL's own (the DJB2a hash of the ncclUniqueId
 * given to ncclCommInitRank / ncclCommInitRankConfig) so that ranks agree on
 * it; a communicator made by ncclCommSplit gets its parent's hash mixed with
 * the colour (the same on every member); one whose creation was not seen
 * (ncclCommInitAll, or made before this library) a hash of its address,
 * which other ranks do not share. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hook_internal.h"

#define NCCL_SUCCESS 0
#define NCCL_INTERNAL_ERROR 3
#define NCCL_IN_PROGRESS 7 /* nonblocking communicator: enqueued, still running */
#define UNIQUE_ID_BYTES 128
#define COMM_TABLE 256u    /* power of two */
#define OP_POOL TP_NCCL_FALLBACK_OPS /* ops between enqueue and completion (timed mode) */
#define SPAN_POOL 1024u    /* event pairs in flight: a solo op or a group */
#define GROUP_MAX 64u      /* ops of a group timed together; more are counted only */
#define STREAMS 32u

enum op_kind { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, SEND, RECV, OP_KINDS };
static const char *const op_names[OP_KINDS] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                               "Reduce",    "Send",      "Recv"};

typedef struct unique_id {
    char internal[UNIQUE_ID_BYTES];
} unique_id;

typedef struct comm_entry {
    _Atomic(void *) comm;
    _Atomic uint64_t hash;  /* 0 until known */
    int rank, nranks;       /* -1 / 0 until read */
    _Atomic int info_read;
    _Atomic uint64_t seq[OP_KINDS];
} comm_entry;

typedef struct span {
    uint32_t timer;
    uint32_t n;
    void *stream;
    uint32_t ops[GROUP_MAX];
} span;

typedef struct group_state {
    uint32_t n;
    int mixed_streams;
    void *stream;
    tp_record recs[GROUP_MAX];
} group_state;

static comm_entry g_comms[COMM_TABLE];
static tp_record g_ops[OP_POOL]; /* token - TP_NCCL_FALLBACK_TOKEN0 */
static span g_spans[SPAN_POOL];
static tp_queue *_Atomic g_free_ops, *_Atomic g_free_spans;
static _Atomic int g_mode; /* 0 unread, 1 counting, 2 timed */
static __thread int t_depth;            /* ncclGroupStart nesting, always tracked */
static __thread group_state *t_group;   /* the ops of this thread's open group; made when first needed */

/* ---- communicators ----------------------------------------------------- */

/* NCCL's getHash: DJB2a over the unique id's bytes. */
static uint64_t id_hash(const unique_id *id)
{
    uint64_t h = 5381;
    for (int i = 0; i < UNIQUE_ID_BYTES; i++) h = ((h << 5) + h) ^ (uint64_t)(signed char)id->internal[i];
    return h;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27, x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The table entry of `comm`, made on first sight; NULL when the table is full. */
static comm_entry *comm_slot(void *comm)
{
    uint32_t start = (uint32_t)mix((uint64_t)(uintptr_t)comm) & (COMM_TABLE - 1);
    for (uint32_t i = 0; i < COMM_TABLE; i++) {
        comm_entry *e = &g_comms[(start + i) & (COMM_TABLE - 1)];
        void *cur = atomic_load_explicit(&e->comm, memory_order_acquire);
        if (cur == comm) return e;
        if (cur == NULL) {
            void *none = NULL;
            if (atomic_compare_exchange_strong(&e->comm, &none, comm) || none == comm) return e;
        }
    }
    return NULL;
}

/* A new communicator at a (possibly reused) address: forget what was there.
 * Its rank and size when the caller knows them (nranks 0: read at first use). */
static void comm_created(void *comm, uint64_t hash, int rank, int nranks)
{
    comm_entry *e = comm_slot(comm);
    if (!e) return;
    atomic_store(&e->info_read, 0);
    for (int k = 0; k < OP_KINDS; k++) atomic_store(&e->seq[k], 0);
    atomic_store(&e->hash, hash ? hash : 1);
    if (nranks <= 0) return;
    e->rank = rank, e->nranks = nranks;
    atomic_store_explicit(&e->info_read, 1, memory_order_release);
}

uint32_t tp_nccl_comm_size(uint64_t hash)
{
    for (uint32_t i = 0; i < COMM_TABLE; i++) {
        comm_entry *e = &g_comms[i];
        if (!atomic_load_explicit(&e->comm, memory_order_acquire) || atomic_load(&e->hash) != hash) continue;
        if (atomic_load_explicit(&e->info_read, memory_order_acquire) && e->nranks > 0) return (uint32_t)e->nranks;
    }
    return 0;
}

typedef int (*user_rank_fn)(void *comm, int *rank);

static comm_entry *comm_info(void *comm)
{
    comm_entry *e = comm_slot(comm);
    if (!e) return NULL;
    if (TP_LIKELY(atomic_load_explicit(&e->info_read, memory_order_acquire))) return e;
    user_rank_fn user_rank = TP_REAL(user_rank_fn, "ncclCommUserRank");
    user_rank_fn count = TP_REAL(user_rank_fn, "ncclCommCount");
    int rank = -1, nranks = 0;
    if (!user_rank || user_rank(comm, &rank) != NCCL_SUCCESS) rank = -1;
    if (!count || count(comm, &nranks) != NCCL_SUCCESS) nranks = 0;
    e->rank = rank, e->nranks = nranks;
    uint64_t none = 0;
    atomic_compare_exchange_strong(&e->hash, &none, mix((uint64_t)(uintptr_t)comm) | 1);
    atomic_store_explicit(&e->info_read, 1, memory_order_release);
    return e;
}

typedef int (*init_rank_fn)(void **comm, int nranks, unique_id id, int rank);
typedef int (*init_rank_config_fn)(void **comm, int nranks, unique_id id, int rank, void *config);
typedef int (*split_fn)(void *comm, int color, int key, void **newcomm, void *config);

TP_EXPORT int ncclCommInitRank(void **comm, int nranks, unique_id id, int rank)
{
    init_rank_fn real = TP_REAL(init_rank_fn, "ncclCommInitRank");
    if (TP_UNLIKELY(!real)) return NCCL_INTERNAL_ERROR;
    int status = real(comm, nranks, id, rank);
    if ((status == NCCL_SUCCESS || status == NCCL_IN_PROGRESS) && comm && *comm)
        comm_created(*comm, id_hash(&id), rank, nranks);
    return status;
}

TP_EXPORT int ncclCommInitRankConfig(void **comm, int nranks, unique_id id, int rank, void *config)
{
    init_rank_config_fn real = TP_REAL(init_rank_config_fn, "ncclCommInitRankConfig");
    if (TP_UNLIKELY(!real)) return NCCL_INTERNAL_ERROR;
    int status = real(comm, nranks, id, rank, config);
    if ((status == NCCL_SUCCESS || status == NCCL_IN_PROGRESS) && comm && *comm)
        comm_created(*comm, id_hash(&id), rank, nranks);
    return status;
}

TP_EXPORT int ncclCommSplit(void *comm, int color, int key, void **newcomm, void *config)
{
    split_fn real = TP_REAL(split_fn, "ncclCommSplit");
    if (TP_UNLIKELY(!real)) return NCCL_INTERNAL_ERROR;
    int status = real(comm, color, key, newcomm, config);
    if ((status == NCCL_SUCCESS || status == NCCL_IN_PROGRESS) && comm && newcomm && *newcomm) {
        comm_entry *parent = comm_info(comm);
        uint64_t base = parent ? atomic_load(&parent->hash) : mix((uint64_t)(uintptr_t)comm);
        comm_created(*newcomm, mix(base ^ mix((uint64_t)(uint32_t)color + 1)), -1, 0);
    }
    return status;
}

/* ---- mode and pools ---------------------------------------------------- */

/* A free list holding 0..n-1 (capacity: the power of two at or above n). */
static tp_queue *index_pool(tp_queue *_Atomic *slot, uint32_t n, uint32_t capacity)
{
    tp_queue *q = atomic_load(slot);
    if (TP_LIKELY(q != NULL)) return q;
    q = tp_queue_create(capacity, sizeof(uint32_t));
    if (!q) return NULL;
    for (uint32_t i = 0; i < n; i++) tp_queue_push(q, &i);
    tp_queue *none = NULL;
    if (!atomic_compare_exchange_strong(slot, &none, q)) {
        tp_queue_free(q); /* another thread won */
        q = none;
    }
    return q;
}

/* 1 counting, 2 timed; read once.  Pools for the timed mode are made here;
 * without them it counts only. */
static int mode(void)
{
    int m = atomic_load_explicit(&g_mode, memory_order_relaxed);
    if (TP_LIKELY(m)) return m;
    const char *v = getenv("TUIPROF_NCCL_FALLBACK");
    m = v && strcmp(v, "1") == 0 && index_pool(&g_free_ops, OP_POOL, OP_POOL + 1) &&
                index_pool(&g_free_spans, SPAN_POOL, SPAN_POOL)
            ? 2
            : 1;
    atomic_store(&g_mode, m);
    tp_set_flag(m == 2 ? TP_FLAG_NCCL_API | TP_FLAG_NCCL_API_EVENTS : TP_FLAG_NCCL_API);
    return m;
}

/* Whether this op is ours: the hook runs and NCCL did not take the plugin. */
static int fallback_active(void)
{
    return tp_ensure_started() && !(tp_flags() & TP_FLAG_NCCL_PLUGIN);
}

/* ---- records ----------------------------------------------------------- */

/* The record of one successful call: everything but timing. */
static int describe(tp_record *r, enum op_kind kind, size_t count, int dtype, void *comm)
{
    comm_entry *e = comm_info(comm);
    if (!e) return 0;
    memset(r, 0, sizeof(*r));
    tp_copy_name(r->op, sizeof(r->op), op_names[kind]);
    uint64_t size = 0;
    if (dtype >= 0 && dtype < TP_NCCL_DTYPES) {
        tp_copy_name(r->dtype, sizeof(r->dtype), tp_nccl_dtypes[dtype].name);
        size = tp_nccl_dtypes[dtype].size;
    } else {
        tp_copy_name(r->dtype, sizeof(r->dtype), "unknown");
    }
    r->bytes = (uint64_t)count * size;
    /* count is per rank for AllGather / ReduceScatter; nccl-tests sizes them by the whole buffer */
    if (kind == ALL_GATHER || kind == REDUCE_SCATTER) r->bytes *= (uint64_t)(e->nranks > 0 ? e->nranks : 0);
    r->stream = atomic_load(&e->hash);
    r->rank = e->rank;
    r->nranks = (uint32_t)(e->nranks > 0 ? e->nranks : 0);
    r->op_seq = atomic_fetch_add_explicit(&e->seq[kind], 1, memory_order_relaxed); /* from 0, as NCCL's */
    r->launched_ns = tp_now_ns();
    return 1;
}

static void submit_counted(tp_record *r)
{
    r->type = TP_REC_NCCL_DONE;
    r->token = TP_NCCL_UNTRACKED_TOKEN; /* never in the in-flight table */
    r->dur_ns = UINT64_MAX;
    r->start_ns = r->launched_ns;
    r->end_ns = 0;
    tp_submit(r);
}

/* Timed: the ops enter the in-flight table now; the writer finishes them
 * when the span's stop event completes.  Out of pool room: counted only. */
static void submit_timed(tp_record *recs, uint32_t n, uint32_t timer, void *stream)
{
    uint32_t s;
    if (!tp_queue_pop(g_free_spans, &s)) goto untimed;
    span *sp = &g_spans[s];
    sp->timer = timer, sp->stream = stream, sp->n = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t o;
        if (!tp_queue_pop(g_free_ops, &o)) {
            submit_counted(&recs[i]);
            continue;
        }
        tp_record *r = &g_ops[o];
        *r = recs[i];
        if (n > 1) tp_copy_name(r->algo, sizeof(r->algo), "group");
        r->type = TP_REC_NCCL_START;
        r->token = TP_NCCL_FALLBACK_TOKEN0 + o;
        tp_submit(r);
        sp->ops[sp->n++] = o;
    }
    if (sp->n == 0) { /* every op was counted above */
        tp_timer_abandon(timer);
        tp_queue_push(g_free_spans, &s);
        return;
    }
    tp_record handoff;
    memset(&handoff, 0, sizeof(handoff));
    handoff.type = TP_REC_NCCL_SPAN;
    handoff.timer = s;
    tp_submit(&handoff);
    return;
untimed:
    tp_timer_abandon(timer);
    for (uint32_t i = 0; i < n; i++) submit_counted(&recs[i]);
}

/* ---- one op ------------------------------------------------------------ */

typedef struct op_call {
    int active, timed;
    uint32_t timer;
    void *stream;
    void *comm;
} op_call;

static int succeeded(int status) { return status == NCCL_SUCCESS || status == NCCL_IN_PROGRESS; }

static void op_begin(op_call *c, void *comm, void *stream)
{
    c->active = comm && fallback_active();
    c->timed = 0;
    c->comm = comm, c->stream = stream;
    if (!c->active) return;
    if (mode() == 2 && t_depth == 0) c->timed = tp_timer_acquire(stream, &c->timer); /* a group's: at its end */
}

static void op_end(op_call *c, int status, enum op_kind kind, size_t count, int dtype)
{
    if (!c->active) return;
    if (!succeeded(status)) { /* nothing was enqueued: not an op */
        if (c->timed) tp_timer_abandon(c->timer);
        return;
    }
    if (t_depth > 0) {
        group_state *g = t_group ? t_group : (t_group = calloc(1, sizeof(*t_group))); /* one per thread, never freed */
        if (!g || g->n == GROUP_MAX) { /* counted now, outside the group's span */
            tp_record r;
            if (describe(&r, kind, count, dtype, c->comm)) submit_counted(&r);
            return;
        }
        if (!describe(&g->recs[g->n], kind, count, dtype, c->comm)) return;
        if (g->n == 0) g->stream = c->stream;
        else if (g->stream != c->stream) g->mixed_streams = 1;
        g->n++;
        return;
    }
    tp_record r;
    if (!describe(&r, kind, count, dtype, c->comm)) {
        if (c->timed) tp_timer_abandon(c->timer);
        return;
    }
    if (!c->timed) {
        submit_counted(&r);
        return;
    }
    tp_timer_stop(c->timer, c->stream);
    submit_timed(&r, 1, c->timer, c->stream);
}

#define NCCL_OP_HOOK(NAME, KIND, PARAMS, ARGS, COUNT, DTYPE)                \
    typedef int (*NAME##_fn) PARAMS;                                        \
    TP_EXPORT int NAME PARAMS                                               \
    {                                                                       \
        NAME##_fn real = TP_REAL(NAME##_fn, #NAME);                         \
        if (TP_UNLIKELY(!real)) return NCCL_INTERNAL_ERROR;                 \
        op_call c;                                                          \
        op_begin(&c, comm, stream);                                         \
        int status = real ARGS;                                             \
        op_end(&c, status, KIND, COUNT, DTYPE);                             \
        return status;                                                      \
    }

NCCL_OP_HOOK(ncclAllReduce, ALL_REDUCE,
             (const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, void *comm, void *stream),
             (sendbuff, recvbuff, count, datatype, op, comm, stream), count, datatype)
NCCL_OP_HOOK(ncclAllGather, ALL_GATHER,
             (const void *sendbuff, void *recvbuff, size_t sendcount, int datatype, void *comm, void *stream),
             (sendbuff, recvbuff, sendcount, datatype, comm, stream), sendcount, datatype)
NCCL_OP_HOOK(ncclReduceScatter, REDUCE_SCATTER,
             (const void *sendbuff, void *recvbuff, size_t recvcount, int datatype, int op, void *comm,
              void *stream),
             (sendbuff, recvbuff, recvcount, datatype, op, comm, stream), recvcount, datatype)
NCCL_OP_HOOK(ncclBroadcast, BROADCAST,
             (const void *sendbuff, void *recvbuff, size_t count, int datatype, int root, void *comm, void *stream),
             (sendbuff, recvbuff, count, datatype, root, comm, stream), count, datatype)
NCCL_OP_HOOK(ncclReduce, REDUCE,
             (const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, int root, void *comm,
              void *stream),
             (sendbuff, recvbuff, count, datatype, op, root, comm, stream), count, datatype)
NCCL_OP_HOOK(ncclSend, SEND, (const void *sendbuff, size_t count, int datatype, int peer, void *comm, void *stream),
             (sendbuff, count, datatype, peer, comm, stream), count, datatype)
NCCL_OP_HOOK(ncclRecv, RECV, (void *recvbuff, size_t count, int datatype, int peer, void *comm, void *stream),
             (recvbuff, count, datatype, peer, comm, stream), count, datatype)

/* ---- groups ------------------------------------------------------------ */

typedef int (*group_fn)(void);

TP_EXPORT int ncclGroupStart(void)
{
    group_fn real = TP_REAL(group_fn, "ncclGroupStart");
    if (TP_UNLIKELY(!real)) return NCCL_INTERNAL_ERROR;
    int status = real();
    if (status != NCCL_SUCCESS) return status;
    if (t_depth++ == 0 && t_group) t_group->n = 0, t_group->mixed_streams = 0;
    return status;
}

TP_EXPORT int ncclGroupEnd(void)
{
    group_fn real = TP_REAL(group_fn, "ncclGroupEnd");
    if (TP_UNLIKELY(!real)) return NCCL_INTERNAL_ERROR;
    if (t_depth != 1) { /* not in a group (NCCL says so), or an inner end */
        int status = real();
        if (t_depth > 0) t_depth--;
        return status;
    }
    group_state *g = t_group;
    if (!g || g->n == 0) { /* none of its ops is ours */
        t_depth = 0;
        return real();
    }
    /* The outermost end launches the group's ops: the span covers it. */
    uint32_t timer = 0;
    int timed = !g->mixed_streams && mode() == 2 && tp_timer_acquire(g->stream, &timer);
    int status = real();
    t_depth = 0;
    if (!succeeded(status)) {
        if (timed) tp_timer_abandon(timer);
        g->n = 0;
        return status;
    }
    if (timed) {
        tp_timer_stop(timer, g->stream);
        submit_timed(g->recs, g->n, timer, g->stream);
    } else {
        for (uint32_t i = 0; i < g->n; i++) submit_counted(&g->recs[i]);
    }
    g->n = 0;
    return status;
}

/* ---- writer side: completion ------------------------------------------- */

typedef struct stream_spans {
    void *stream;
    uint32_t head, tail;
    uint32_t spans[SPAN_POOL];
} stream_spans;

static stream_spans g_streams[STREAMS];
static uint32_t g_stream_count;

static void finish_span(uint32_t s, int st, const tp_gpu_span *gpu)
{
    span *sp = &g_spans[s];
    for (uint32_t i = 0; i < sp->n; i++) {
        tp_record r = g_ops[sp->ops[i]];
        r.type = TP_REC_NCCL_DONE;
        if (st > 0) {
            r.dur_ns = gpu->dur_ns;
            r.start_ns = gpu->start_ns ? gpu->start_ns : r.launched_ns;
            r.end_ns = gpu->end_ns ? gpu->end_ns : r.start_ns + gpu->dur_ns;
        } else {
            r.dur_ns = UINT64_MAX;
            r.start_ns = r.launched_ns;
            r.end_ns = 0;
        }
        tp_submit(&r);
        tp_queue_push(g_free_ops, &sp->ops[i]);
    }
    tp_queue_push(g_free_spans, &s);
}

void tp_nccl_fallback_track(uint32_t s)
{
    span *sp = &g_spans[s];
    stream_spans *f = NULL;
    for (uint32_t i = 0; i < g_stream_count && !f; i++)
        if (g_streams[i].stream == sp->stream) f = &g_streams[i];
    if (!f && g_stream_count < STREAMS) {
        f = &g_streams[g_stream_count++];
        f->stream = sp->stream, f->head = f->tail = 0;
    }
    if (!f) { /* too many NCCL streams: finished untimed */
        tp_timer_release(sp->timer);
        finish_span(s, -1, NULL);
        return;
    }
    f->spans[f->tail++ % SPAN_POOL] = s;
}

/* Completed spans, oldest first per stream (events on a stream complete in order). */
int tp_nccl_fallback_poll(void)
{
    int done = 0;
    for (uint32_t i = 0; i < g_stream_count; i++) {
        stream_spans *f = &g_streams[i];
        while (f->head != f->tail) {
            uint32_t s = f->spans[f->head % SPAN_POOL];
            tp_gpu_span gpu;
            int st = tp_timer_poll(g_spans[s].timer, g_ops[g_spans[s].ops[0]].launched_ns, &gpu);
            if (st == 0) break;
            tp_timer_release(g_spans[s].timer);
            f->head++;
            finish_span(s, st, &gpu);
            done++;
        }
    }
    return done;
}

void tp_nccl_fallback_fork_child(void)
{
    /* The parent's pending spans and its threads' groups are not the child's. */
    g_stream_count = 0;
    if (g_free_ops) {
        tp_queue_reset(g_free_ops);
        for (uint32_t i = 0; i < OP_POOL; i++) tp_queue_push(g_free_ops, &i);
    }
    if (g_free_spans) {
        tp_queue_reset(g_free_spans);
        for (uint32_t i = 0; i < SPAN_POOL; i++) tp_queue_push(g_free_spans, &i);
    }
    t_depth = 0;
    if (t_group) t_group->n = 0;
    atomic_store(&g_mode, 0);
}
