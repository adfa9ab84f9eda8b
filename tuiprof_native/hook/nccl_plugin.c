/* NCCL profiler plugin (ncclProfiler_v5 for NCCL 2.28, ncclProfiler_v4 for
 * 2.27), living in the same library as the GEMM interposers.
 *
 * NCCL reports a collective or p2p op as a Coll/P2p event (start at enqueue,
 * stop once enqueued) and, from its proxy thread, one KernelCh event per
 * channel carrying GPU globaltimer stamps of when that channel's kernel work
 * started and finished.  An op is finished when its host event stopped and
 * every channel it announced (nChannels) stopped; its GPU duration is
 * last-channel-stop minus first-channel-start.  No CUDA event is ever put on
 * an NCCL stream.  Ops live in a fixed pool; an exhausted pool makes NCCL see
 * a NULL handle (it then skips the op), counted as a drop. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "hook_internal.h"

#define NCCL_SUCCESS 0
#define PROFILE_COLL (1 << 1)
#define PROFILE_P2P (1 << 2)
#define PROFILE_KERNEL_CH (1 << 6)
#define KERNEL_CH_STOP_STATE 22
#define OP_COUNT 4096u
#define STRAGGLER_CHANNEL_NS 100000000ULL /* finish ops missing announced channels after 100 ms idle */
#define KCH_TAG ((uintptr_t)1)

typedef void (*nccl_logger_fn)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);

/* Descriptor layout shared by v4 and v5 up to the members read here (v4's
 * type is one byte, v5's eight; both little-endian, so the low byte holds the
 * type either way). */
typedef struct nccl_descr {
    uint64_t type;
    void *parent;
    int rank;
    union {
        struct {
            uint64_t seq;
            const char *func;
            const void *sendbuff;
            void *recvbuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nchannels;
            uint8_t nwarps;
            const char *algo;
            const char *proto;
        } coll;
        struct {
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
            uint8_t nchannels;
        } p2p;
        struct {
            uint8_t channel;
            uint64_t ptimer;
        } kernel_ch;
    };
} nccl_descr;

typedef struct nccl_comm {
    uint64_t hash;
    int nranks, rank, nnodes;
} nccl_comm;

typedef struct nccl_op {
    _Alignas(64) _Atomic uint32_t host_done;
    _Atomic uint32_t ch_started, ch_stopped, finished;
    _Atomic uint64_t gpu_start, gpu_stop, last_activity_ns;
    uint32_t index, expected_channels;
    const nccl_comm *comm;
    tp_record rec;
} nccl_op;

static nccl_op g_ops[OP_COUNT];
static tp_queue *_Atomic g_free_ops;
static _Atomic int64_t g_gpu_clock_offset; /* realtime - globaltimer, 0 when they agree */
static _Atomic int g_offset_known;
static _Atomic uint64_t g_p2p_seq;
static _Atomic uint64_t g_shortfall, g_late;

void tp_nccl_anomalies(uint64_t *shortfall, uint64_t *late)
{
    *shortfall = atomic_load(&g_shortfall);
    *late = atomic_load(&g_late);
}

static int ops_ready(void)
{
    if (TP_LIKELY(atomic_load(&g_free_ops) != NULL)) return 1;
    tp_queue *q = tp_queue_create(OP_COUNT, sizeof(uint32_t));
    if (!q) return 0;
    for (uint32_t i = 0; i < OP_COUNT; i++) {
        g_ops[i].index = i;
        tp_queue_push(q, &i);
    }
    tp_queue *none = NULL;
    if (!atomic_compare_exchange_strong(&g_free_ops, &none, q)) tp_queue_free(q); /* another comm won */
    return 1;
}

void tp_nccl_fork_child(void)
{
    atomic_store(&g_shortfall, 0);
    atomic_store(&g_late, 0);
    if (!g_free_ops) return;
    tp_queue_reset(g_free_ops);
    for (uint32_t i = 0; i < OP_COUNT; i++) {
        g_ops[i].comm = NULL; /* the parent's in-flight ops: the sweep must not free them a second time */
        tp_queue_push(g_free_ops, &i);
    }
}

/* nccl-tests "size" in bytes and the element size of NCCL's type names. */
static uint64_t type_size(const char *t)
{
    if (!t) return 0;
    if (strstr(t, "8")) return 1;          /* ncclInt8, ncclFloat8e4m3, ncclFloat8e5m2 */
    if (strstr(t, "16")) return 2;         /* ncclFloat16, ncclBfloat16 */
    if (strstr(t, "32")) return 4;
    if (strstr(t, "64")) return 8;
    return 0;                              /* "Unknown": bytes not known */
}

static const char *short_dtype(const char *t)
{
    static const char *const map[][2] = {
        {"ncclInt8", "int8"},       {"ncclUint8", "uint8"},     {"ncclInt32", "int32"},
        {"ncclUint32", "uint32"},   {"ncclInt64", "int64"},     {"ncclUint64", "uint64"},
        {"ncclFloat16", "fp16"},    {"ncclFloat32", "fp32"},    {"ncclFloat64", "fp64"},
        {"ncclBfloat16", "bf16"},   {"ncclFloat8e4m3", "fp8e4m3"}, {"ncclFloat8e5m2", "fp8e5m2"},
    };
    if (!t) return "unknown";
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(map[i][0], t) == 0) return map[i][1];
    return t;
}

static uint64_t realtime_of(uint64_t gpu_ns)
{
    return (uint64_t)((int64_t)gpu_ns + atomic_load_explicit(&g_gpu_clock_offset, memory_order_relaxed));
}

/* GPU globaltimer usually runs on the Unix epoch; if it does not, map it by
 * the offset seen at the first channel stop (observation latency included). */
static void learn_clock(uint64_t gpu_ns)
{
    if (atomic_load_explicit(&g_offset_known, memory_order_relaxed)) return;
    int64_t offset = (int64_t)tp_now_ns() - (int64_t)gpu_ns;
    if (offset > -5000000000LL && offset < 5000000000LL) offset = 0;
    atomic_store(&g_gpu_clock_offset, offset);
    atomic_store(&g_offset_known, 1);
    tp_set_flag(TP_FLAG_NCCL_GPU_TIME);
}

static void finish(nccl_op *op)
{
    uint32_t expected = 0;
    if (!atomic_compare_exchange_strong(&op->finished, &expected, 1)) return;
    tp_record *r = &op->rec;
    r->type = TP_REC_NCCL_DONE;
    uint64_t stopped = atomic_load(&op->ch_stopped);
    uint64_t g0 = atomic_load(&op->gpu_start), g1 = atomic_load(&op->gpu_stop);
    if (stopped > 0 && g1 >= g0 && g0 != UINT64_MAX) {
        r->dur_ns = g1 - g0;
        r->start_ns = realtime_of(g0);
        r->end_ns = realtime_of(g1);
    } else {
        r->dur_ns = UINT64_MAX;
        r->start_ns = r->launched_ns;
        r->end_ns = 0;
    }
    tp_submit(r);
    uint32_t i = op->index;
    tp_queue_push(g_free_ops, &i);
}

static void maybe_finish(nccl_op *op)
{
    if (!atomic_load(&op->host_done)) return;
    uint32_t started = atomic_load(&op->ch_started), stopped = atomic_load(&op->ch_stopped);
    if (started != stopped) return;
    if (stopped >= op->expected_channels) finish(op);
}

void tp_nccl_sweep(uint64_t now_ns)
{
    if (!g_free_ops) return;
    for (uint32_t i = 0; i < OP_COUNT; i++) {
        nccl_op *op = &g_ops[i];
        if (!op->comm || atomic_load(&op->finished) || !atomic_load(&op->host_done)) continue;
        uint32_t started = atomic_load(&op->ch_started), stopped = atomic_load(&op->ch_stopped);
        if (stopped == 0 || started != stopped) continue;
        if (now_ns - atomic_load(&op->last_activity_ns) > STRAGGLER_CHANNEL_NS) {
            atomic_fetch_add(&g_shortfall, 1);
            finish(op);
        }
    }
}

static int plugin_init(void **context, int *mask, const char *name, uint64_t hash, int nnodes, int nranks,
                       int rank)
{
    (void)name;
    *context = NULL;
    *mask = 0;
    if (!tp_ensure_started() || !ops_ready()) return NCCL_SUCCESS; /* inert: NCCL runs without us */
    /* Never freed: ops still in flight at finalize may point at it. */
    nccl_comm *c = calloc(1, sizeof(*c));
    if (!c) return NCCL_SUCCESS;
    c->hash = hash, c->nranks = nranks, c->rank = rank, c->nnodes = nnodes;
    *context = c;
    *mask = PROFILE_COLL | PROFILE_P2P | PROFILE_KERNEL_CH;
    tp_set_flag(TP_FLAG_NCCL_PLUGIN);
    return NCCL_SUCCESS;
}

static int init_v5(void **context, uint64_t comm_id, int *mask, const char *name, int nnodes, int nranks, int rank,
                   nccl_logger_fn log)
{
    (void)log;
    return plugin_init(context, mask, name, comm_id, nnodes, nranks, rank);
}

static int init_v4(void **context, int *mask, const char *name, uint64_t hash, int nnodes, int nranks, int rank,
                   nccl_logger_fn log)
{
    (void)log;
    return plugin_init(context, mask, name, hash, nnodes, nranks, rank);
}

static nccl_op *new_op(const nccl_comm *comm)
{
    uint32_t i;
    if (!tp_queue_pop(g_free_ops, &i)) return NULL;
    nccl_op *op = &g_ops[i];
    atomic_store(&op->host_done, 0);
    atomic_store(&op->ch_started, 0);
    atomic_store(&op->ch_stopped, 0);
    atomic_store(&op->gpu_start, UINT64_MAX);
    atomic_store(&op->gpu_stop, 0);
    op->comm = comm;
    memset(&op->rec, 0, sizeof(op->rec));
    op->rec.stream = comm->hash;
    op->rec.nranks = (uint32_t)comm->nranks;
    op->rec.rank = comm->rank;
    op->rec.token = i;
    op->rec.launched_ns = tp_now_ns();
    atomic_store(&op->last_activity_ns, op->rec.launched_ns);
    atomic_store(&op->finished, 0);
    return op;
}

static void start_op(nccl_op *op)
{
    tp_record start = op->rec;
    start.type = TP_REC_NCCL_START;
    tp_submit(&start);
}

static int start_event(void *context, void **handle, nccl_descr *d)
{
    *handle = NULL;
    const nccl_comm *comm = context;
    if (!comm) return NCCL_SUCCESS;
    uint8_t type = (uint8_t)d->type;
    if (type == PROFILE_COLL) {
        nccl_op *op = new_op(comm);
        if (!op) goto dropped;
        tp_record *r = &op->rec;
        tp_copy_name(r->op, sizeof(r->op), d->coll.func);
        tp_copy_name(r->dtype, sizeof(r->dtype), short_dtype(d->coll.datatype));
        tp_copy_name(r->algo, sizeof(r->algo), d->coll.algo);
        tp_copy_name(r->proto, sizeof(r->proto), d->coll.proto);
        r->op_seq = d->coll.seq;
        uint64_t size = (uint64_t)d->coll.count * type_size(d->coll.datatype);
        /* count is per rank for AllGather / ReduceScatter; nccl-tests sizes them by the whole buffer */
        if (!strcmp(r->op, "AllGather") || !strcmp(r->op, "ReduceScatter")) size *= (uint64_t)comm->nranks;
        r->bytes = size;
        op->expected_channels = d->coll.nchannels;
        start_op(op);
        *handle = op;
    } else if (type == PROFILE_P2P) {
        nccl_op *op = new_op(comm);
        if (!op) goto dropped;
        tp_record *r = &op->rec;
        tp_copy_name(r->op, sizeof(r->op), d->p2p.func);
        tp_copy_name(r->dtype, sizeof(r->dtype), short_dtype(d->p2p.datatype));
        r->op_seq = atomic_fetch_add(&g_p2p_seq, 1) + 1; /* NCCL gives p2p no sequence number */
        r->bytes = (uint64_t)d->p2p.count * type_size(d->p2p.datatype);
        op->expected_channels = d->p2p.nchannels;
        start_op(op);
        *handle = op;
    } else if (type == PROFILE_KERNEL_CH) {
        nccl_op *op = d->parent;
        if (!op) return NCCL_SUCCESS;
        if (atomic_load(&op->finished)) { /* more channels than announced, after the op was reported */
            atomic_fetch_add(&g_late, 1);
            return NCCL_SUCCESS;
        }
        atomic_fetch_add(&op->ch_started, 1);
        uint64_t t = d->kernel_ch.ptimer, cur = atomic_load(&op->gpu_start);
        while (t < cur && !atomic_compare_exchange_weak(&op->gpu_start, &cur, t)) {
        }
        atomic_store(&op->last_activity_ns, tp_now_ns());
        *handle = (void *)((uintptr_t)op | KCH_TAG);
    }
    return NCCL_SUCCESS;
dropped:
    tp_count_drop();
    return NCCL_SUCCESS;
}

static int start_event_v5(void *context, void **handle, void *descr) { return start_event(context, handle, descr); }

static int stop_event(void *handle)
{
    if (!handle) return NCCL_SUCCESS;
    if ((uintptr_t)handle & KCH_TAG) {
        nccl_op *op = (nccl_op *)((uintptr_t)handle & ~KCH_TAG);
        atomic_fetch_add(&op->ch_stopped, 1);
        atomic_store(&op->last_activity_ns, tp_now_ns());
        maybe_finish(op);
        return NCCL_SUCCESS;
    }
    nccl_op *op = handle;
    atomic_store(&op->host_done, 1);
    maybe_finish(op);
    return NCCL_SUCCESS;
}

static int record_state(void *handle, int state, void *args)
{
    if (!handle || !((uintptr_t)handle & KCH_TAG) || state != KERNEL_CH_STOP_STATE || !args) return NCCL_SUCCESS;
    nccl_op *op = (nccl_op *)((uintptr_t)handle & ~KCH_TAG);
    uint64_t t = *(const uint64_t *)args, cur = atomic_load(&op->gpu_stop);
    learn_clock(t);
    while (t > cur && !atomic_compare_exchange_weak(&op->gpu_stop, &cur, t)) {
    }
    return NCCL_SUCCESS;
}

static int finalize(void *context)
{
    (void)context;
    return NCCL_SUCCESS;
}

typedef struct nccl_profiler_v5 {
    const char *name;
    int (*init)(void **, uint64_t, int *, const char *, int, int, int, nccl_logger_fn);
    int (*start_event)(void *, void **, void *);
    int (*stop_event)(void *);
    int (*record_state)(void *, int, void *);
    int (*finalize)(void *);
} nccl_profiler_v5;

typedef struct nccl_profiler_v4 {
    const char *name;
    int (*init)(void **, int *, const char *, uint64_t, int, int, int, nccl_logger_fn);
    int (*start_event)(void *, void **, void *);
    int (*stop_event)(void *);
    int (*record_state)(void *, int, void *);
    int (*finalize)(void *);
} nccl_profiler_v4;

TP_EXPORT const nccl_profiler_v5 ncclProfiler_v5 = {"tuiprof", init_v5, start_event_v5, stop_event, record_state,
                                                    finalize};
TP_EXPORT const nccl_profiler_v4 ncclProfiler_v4 = {"tuiprof", init_v4, start_event_v5, stop_event, record_state,
                                                    finalize};
