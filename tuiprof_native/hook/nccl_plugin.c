/* NCCL profiler plugin in every version of NCCL's profiler API, ncclProfiler_v1
 * (NCCL 2.23) to ncclProfiler_v6 (2.29, 2.30), living in the same library as
 * the GEMM interposers.  NCCL looks the symbols up from the newest it knows
 * down, so each NCCL takes the version it speaks natively.
 *
 * NCCL reports a collective or p2p op as a Coll/P2p event (start at enqueue,
 * stop once enqueued) and, in v3 and later, from its proxy thread one KernelCh
 * event per channel the op runs on.  An op is finished when its host event
 * stopped and its channels did; its duration is last-channel-stop minus
 * first-channel-start.  What that time is depends on the version:
 * - v4+: GPU globaltimer stamps, and the exact channel count (nChannels);
 * - v3: no stamps: the channels' start and stop are when the proxy thread saw
 *   them (host clock, its polling latency included), and NCCL announces only
 *   a bound on the channels (nMaxChannels): an op is finished once its
 *   channels all stopped and none started for CHANNEL_BOUND_QUIET_NS;
 * - v1, v2: no kernel events: ops are counted, untimed;
 * - v6 also runs some collectives on copy engines (CeColl events): counted,
 *   untimed (timing them would take CUDA events on NCCL's stream);
 * - v6: NCCL 2.29 and 2.30 send no Coll event for a Broadcast (with
 *   NCCL_ALLGATHERV_ENABLE, their default, enqueue.cc makes it a broadcast task
 *   whose later collective task has no activation mask), only its CollApi
 *   event: a v6 Broadcast is counted from that API event, untimed, and a
 *   Broadcast Coll event (NCCL_ALLGATHERV_ENABLE=0) is not counted again.
 * No CUDA event is ever put on an NCCL stream.  Up to v4 NCCL starts an op's
 * events only under a Group event that got a handle, so a Group gets one (a
 * sentinel, when the chained plugin gives none).  Up to v3 init names no
 * communicator: each event carries its hash, and its size is the one
 * ncclCommInitRank was given (nccl_fallback.c; 0, unknown, for others).
 *
 * Ops live in a fixed pool; an exhausted pool makes NCCL see a NULL handle
 * (it then skips the op), counted as a drop.  A plugin named to chain to
 * (nccl_chain.c) gets every event it asks for: an op's handle keeps the
 * chained plugin's handle for the same event, and events only it wants get
 * its handle as theirs. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "hook_internal.h"
#include "nccl_profiler.h"

#define OP_COUNT 4096u
#define CHANNELS 64u  /* NCCL's MAXCHANNELS since 2.24 (2.23: 32) */
#define OP_ALIGN 128u /* an op's kernel-channel handle: the op's address | channel << 1 | 1 */
#define STRAGGLER_CHANNEL_NS 100000000ULL /* finish ops missing announced channels after 100 ms idle */
#define CHANNEL_BOUND_QUIET_NS 2000000ULL /* v3: channels all stopped and none started for 2 ms: done */

/* ---- NCCL's descriptors, per version (only the members read here) ------ */

typedef struct descr_v1 { /* NCCL 2.23: functions, types, algorithms, protocols as enum values */
    uint8_t type;
    void *parent;
    int rank;
    union {
        struct {
            const char *comm_name;
            uint64_t comm_hash;
            uint64_t seq;
            uint8_t func;
            const void *sendbuff;
            void *recvbuff;
            size_t count;
            int root;
            uint8_t datatype;
            uint32_t op;
            size_t traffic_bytes;
            uint8_t max_channels;
            uint8_t warps;
            uint8_t algo;
            uint8_t proto;
        } coll;
        struct {
            const char *comm_name;
            uint64_t comm_hash;
            uint8_t func;
            void *buff;
            uint8_t datatype;
            size_t count;
            int peer;
        } p2p;
    };
} descr_v1;

typedef struct p2p_v2 {
    const char *comm_name;
    uint64_t comm_hash;
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
} p2p_v2;

typedef struct descr_v2 { /* NCCL 2.24, 2.25: names as strings */
    uint8_t type;
    void *parent;
    int rank;
    union {
        struct {
            const char *comm_name;
            uint64_t comm_hash;
            uint64_t seq;
            const char *func;
            const void *sendbuff;
            void *recvbuff;
            size_t count;
            int root;
            const char *datatype;
            size_t traffic_bytes;
            uint8_t max_channels;
            uint8_t warps;
            const char *algo;
            const char *proto;
        } coll;
        p2p_v2 p2p;
    };
} descr_v2;

typedef struct descr_v3 { /* NCCL 2.26: kernel channel events, without GPU stamps */
    uint8_t type;
    void *parent;
    int rank;
    union {
        struct {
            const char *comm_name;
            uint64_t comm_hash;
            uint64_t seq;
            const char *func;
            const void *sendbuff;
            void *recvbuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t max_channels;
            uint8_t warps;
            const char *algo;
            const char *proto;
        } coll;
        p2p_v2 p2p;
        struct {
            uint8_t channel;
        } kernel_ch;
    };
} descr_v3;

typedef struct coll_v4 {
    uint64_t seq;
    const char *func;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    int root;
    const char *datatype;
    uint8_t channels;
    uint8_t warps;
    const char *algo;
    const char *proto;
} coll_v4;

typedef struct p2p_v4 {
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
    uint8_t channels;
} p2p_v4;

typedef struct kernel_ch_v4 {
    uint8_t channel;
    uint64_t ptimer; /* GPU globaltimer at the channel's start */
} kernel_ch_v4;

typedef struct descr_v4 { /* NCCL 2.27: the communicator at init, exact channel counts, GPU stamps */
    uint8_t type;
    void *parent;
    int rank;
    union {
        coll_v4 coll;
        p2p_v4 p2p;
        kernel_ch_v4 kernel_ch;
    };
} descr_v4;

typedef struct descr_v6 { /* NCCL 2.28 (v5) and 2.29+ (v6, adds copy-engine collectives): a 64-bit type */
    uint64_t type;
    void *parent;
    int rank;
    union {
        coll_v4 coll; /* then parentGroup, not read */
        p2p_v4 p2p;
        kernel_ch_v4 kernel_ch;
        struct {
            uint64_t seq;
            const char *func;
            const void *sendbuff;
            void *recvbuff;
            size_t count;
            int root;
            const char *datatype;
        } ce_coll;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            int root;
        } coll_api; /* then the stream and graphCaptured, not read */
    };
} descr_v6;

_Static_assert(offsetof(descr_v1, parent) == offsetof(nccl_descr_head, parent), "parent at offset 8");
_Static_assert(offsetof(descr_v6, parent) == offsetof(nccl_descr_head, parent), "parent at offset 8");

/* One event as every version's reader gives it. */
typedef struct event {
    uint32_t type;
    void *parent;
    int rank;
    const char *func, *datatype, *algo, *proto; /* NCCL's names (datatype: "ncclFloat32") */
    size_t count;
    uint64_t seq;
    int has_seq;           /* p2p ops have no sequence number */
    uint32_t channels;     /* kernel channels the op runs on */
    int channels_bound;    /* v3: channels is an upper bound */
    uint64_t comm_hash;    /* v1-v3: the event's; 0: the context's */
    uint8_t channel;       /* kernel channel */
    uint64_t ptimer;       /* ... its GPU start; 0: none (v3) */
} event;

/* ---- contexts and ops -------------------------------------------------- */

typedef struct nccl_comm { /* one per communicator; never freed: ops in flight at finalize point at it */
    int version;
    int recording;          /* 0 while the hook is inert: events only pass on to the chained plugin */
    uint64_t hash;          /* v4+; v1-v3 name it per event */
    _Atomic int nranks;     /* v1-v3: looked up once known, 0 until then */
    int rank, nnodes;
    void *chained;          /* the chained plugin's context for this communicator; NULL: none */
    int chained_mask;
    _Atomic uint64_t broadcasts; /* v6: Broadcasts counted from their API event, NCCL's sequence numbers */
} nccl_comm;

typedef struct nccl_op {
    _Alignas(OP_ALIGN) _Atomic uint32_t host_done;
    _Atomic uint32_t ch_started, ch_stopped, finished;
    _Atomic uint64_t gpu_start, gpu_stop, last_activity_ns; /* v3: host clock */
    uint32_t index, expected_channels;
    int channels_bound;
    int host_clock;         /* v3: channel times are the proxy thread's observations */
    const nccl_comm *comm;
    void *chained;          /* the chained plugin's handle for this op's Coll/P2p event */
    tp_record rec;
} nccl_op;

static nccl_op g_ops[OP_COUNT];
static void *(*_Atomic g_chained_channels)[CHANNELS]; /* [op][channel]: the chained plugin's kernel-channel handles */
static tp_queue *_Atomic g_free_ops;
static _Atomic int64_t g_gpu_clock_offset; /* realtime - globaltimer, 0 when they agree */
static _Atomic int g_offset_known;
static _Atomic uint64_t g_p2p_seq;
static _Atomic uint64_t g_shortfall, g_late;
static _Atomic int g_version; /* the API NCCL initialised us with; 0: none yet */
static const char g_group_sentinel; /* v1-v4: a Group event's handle when nobody else gives one */

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

/* Room for the chained plugin's kernel-channel handles (2 MiB, made only when chaining). */
static void chained_channels_ready(void)
{
    if (atomic_load(&g_chained_channels)) return;
    void *(*table)[CHANNELS] = calloc(OP_COUNT, sizeof(*table));
    void *(*none)[CHANNELS] = NULL;
    if (table && !atomic_compare_exchange_strong(&g_chained_channels, &none, table)) free(table);
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

/* The op a handle of ours stands for, and which of its kernel channels (-1:
 * the op itself); NULL for a handle that is not ours. */
static nccl_op *our_op(void *handle, int *channel)
{
    uintptr_t h = (uintptr_t)handle, op = h & ~(uintptr_t)(OP_ALIGN - 1);
    if (op < (uintptr_t)g_ops || op >= (uintptr_t)(g_ops + OP_COUNT)) return NULL;
    *channel = (h & 1) ? (int)((h >> 1) % CHANNELS) : -1;
    return (nccl_op *)op;
}

static void *channel_handle(nccl_op *op, uint8_t channel)
{
    return (void *)((uintptr_t)op | ((uintptr_t)(channel % CHANNELS) << 1) | 1);
}

/* The chained plugin's handle for the event `handle` names (ours or its own). */
static void *chained_handle(void *handle)
{
    int channel;
    nccl_op *op = our_op(handle, &channel);
    if (!op) return handle == &g_group_sentinel ? NULL : handle;
    if (channel < 0) return op->chained;
    void *(*table)[CHANNELS] = atomic_load(&g_chained_channels);
    return table && op->comm->chained ? table[op->index][channel] : NULL; /* slots are written for chained comms only */
}

/* ---- names ------------------------------------------------------------- */

/* ncclDataType_t in its order: NCCL's name, ours, and the element size. */
const tp_nccl_dtype tp_nccl_dtypes[TP_NCCL_DTYPES] = {
    {"ncclInt8", "int8", 1},       {"ncclUint8", "uint8", 1},   {"ncclInt32", "int32", 4},
    {"ncclUint32", "uint32", 4},   {"ncclInt64", "int64", 8},   {"ncclUint64", "uint64", 8},
    {"ncclFloat16", "fp16", 2},    {"ncclFloat32", "fp32", 4},  {"ncclFloat64", "fp64", 8},
    {"ncclBfloat16", "bf16", 2},   {"ncclFloat8e4m3", "fp8e4m3", 1}, {"ncclFloat8e5m2", "fp8e5m2", 1},
};

static const tp_nccl_dtype *dtype_named(const char *nccl_name)
{
    for (size_t i = 0; nccl_name && i < TP_NCCL_DTYPES; i++)
        if (strcmp(tp_nccl_dtypes[i].nccl_name, nccl_name) == 0) return &tp_nccl_dtypes[i];
    return NULL;
}

/* v1's enum values as later versions name them. */
static const char *enum_name(const char *const *names, size_t n, uint8_t value)
{
    return value < n ? names[value] : "Unknown";
}

static const char *const func_names[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                         "AllReduce", "SendRecv", "Send",     "Recv"};
static const char *const algo_names[] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
static const char *const proto_names[] = {"LL", "LL128", "SIMPLE"};
#define NAME_OF(names, value) enum_name(names, sizeof(names) / sizeof(names[0]), value)

/* ---- each version's events --------------------------------------------- */

static void read_v1(const descr_v1 *d, event *e)
{
    memset(e, 0, sizeof(*e));
    e->type = d->type, e->parent = d->parent, e->rank = d->rank;
    if (e->type == PROFILE_COLL) {
        e->func = NAME_OF(func_names, d->coll.func);
        e->datatype = d->coll.datatype < TP_NCCL_DTYPES ? tp_nccl_dtypes[d->coll.datatype].nccl_name : "Unknown";
        e->algo = NAME_OF(algo_names, d->coll.algo), e->proto = NAME_OF(proto_names, d->coll.proto);
        e->count = d->coll.count, e->seq = d->coll.seq, e->has_seq = 1, e->comm_hash = d->coll.comm_hash;
    } else if (e->type == PROFILE_P2P) {
        e->func = NAME_OF(func_names, d->p2p.func);
        e->datatype = d->p2p.datatype < TP_NCCL_DTYPES ? tp_nccl_dtypes[d->p2p.datatype].nccl_name : "Unknown";
        e->count = d->p2p.count, e->comm_hash = d->p2p.comm_hash;
    }
}

static void read_p2p_v2(const p2p_v2 *p, event *e)
{
    e->func = p->func, e->datatype = p->datatype, e->count = p->count, e->comm_hash = p->comm_hash;
}

static void read_v2(const descr_v2 *d, event *e)
{
    memset(e, 0, sizeof(*e));
    e->type = d->type, e->parent = d->parent, e->rank = d->rank;
    if (e->type == PROFILE_COLL) {
        e->func = d->coll.func, e->datatype = d->coll.datatype, e->algo = d->coll.algo, e->proto = d->coll.proto;
        e->count = d->coll.count, e->seq = d->coll.seq, e->has_seq = 1, e->comm_hash = d->coll.comm_hash;
    } else if (e->type == PROFILE_P2P) {
        read_p2p_v2(&d->p2p, e);
    }
}

static void read_v3(const descr_v3 *d, event *e)
{
    memset(e, 0, sizeof(*e));
    e->type = d->type, e->parent = d->parent, e->rank = d->rank;
    if (e->type == PROFILE_COLL) {
        e->func = d->coll.func, e->datatype = d->coll.datatype, e->algo = d->coll.algo, e->proto = d->coll.proto;
        e->count = d->coll.count, e->seq = d->coll.seq, e->has_seq = 1, e->comm_hash = d->coll.comm_hash;
        e->channels = d->coll.max_channels, e->channels_bound = 1;
    } else if (e->type == PROFILE_P2P) {
        read_p2p_v2(&d->p2p, e);
        e->channels = CHANNELS, e->channels_bound = 1; /* no count given */
    } else if (e->type == PROFILE_KERNEL_CH) {
        e->channel = d->kernel_ch.channel;
    }
}

/* v4's members, which v5 and v6 lay out alike. */
static void read_v4_members(uint32_t type, const coll_v4 *coll, const p2p_v4 *p2p, const kernel_ch_v4 *ch, event *e)
{
    if (type == PROFILE_COLL) {
        e->func = coll->func, e->datatype = coll->datatype, e->algo = coll->algo, e->proto = coll->proto;
        e->count = coll->count, e->seq = coll->seq, e->has_seq = 1, e->channels = coll->channels;
    } else if (type == PROFILE_P2P) {
        e->func = p2p->func, e->datatype = p2p->datatype, e->count = p2p->count, e->channels = p2p->channels;
    } else if (type == PROFILE_KERNEL_CH) {
        e->channel = ch->channel, e->ptimer = ch->ptimer;
    }
}

static void read_v4(const descr_v4 *d, event *e)
{
    memset(e, 0, sizeof(*e));
    e->type = d->type, e->parent = d->parent, e->rank = d->rank;
    read_v4_members(e->type, &d->coll, &d->p2p, &d->kernel_ch, e);
}

static void read_v6(const descr_v6 *d, event *e) /* and v5 */
{
    memset(e, 0, sizeof(*e));
    e->type = (uint32_t)d->type, e->parent = d->parent, e->rank = d->rank;
    read_v4_members(e->type, &d->coll, &d->p2p, &d->kernel_ch, e);
    if (e->type == PROFILE_CE_COLL) {
        e->func = d->ce_coll.func, e->datatype = d->ce_coll.datatype, e->algo = "CE";
        e->count = d->ce_coll.count, e->seq = d->ce_coll.seq, e->has_seq = 1;
    } else if (e->type == PROFILE_COLL_API) {
        e->func = d->coll_api.func, e->datatype = d->coll_api.datatype, e->count = d->coll_api.count;
    }
}

/* The events this library records in each version. */
static int our_mask(int version)
{
    int mask = PROFILE_COLL | PROFILE_P2P;
    if (version >= 3) mask |= PROFILE_KERNEL_CH;
    if (version >= 6) mask |= PROFILE_CE_COLL | PROFILE_COLL_API; /* the API event: for Broadcast only */
    return mask;
}

/* ---- timing ------------------------------------------------------------ */

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

static void earliest(_Atomic uint64_t *slot, uint64_t t)
{
    uint64_t cur = atomic_load(slot);
    while (t < cur && !atomic_compare_exchange_weak(slot, &cur, t)) {
    }
}

static void latest(_Atomic uint64_t *slot, uint64_t t)
{
    uint64_t cur = atomic_load(slot);
    while (t > cur && !atomic_compare_exchange_weak(slot, &cur, t)) {
    }
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
        r->start_ns = op->host_clock ? g0 : realtime_of(g0);
        r->end_ns = op->host_clock ? g1 : realtime_of(g1);
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
        uint64_t quiet = op->channels_bound ? CHANNEL_BOUND_QUIET_NS : STRAGGLER_CHANNEL_NS;
        if (now_ns - atomic_load(&op->last_activity_ns) > quiet) {
            if (!op->channels_bound) atomic_fetch_add(&g_shortfall, 1); /* fewer than NCCL announced */
            finish(op);
        }
    }
}

/* ---- init -------------------------------------------------------------- */

static int plugin_init(int version, void **context, int *mask, const tp_comm_args *args)
{
    *context = NULL;
    *mask = 0;
    void *chained;
    int chained_mask;
    int chaining = tp_chain_init(version, args, &chained, &chained_mask);
    atomic_store(&g_version, version); /* after the chain's status: the writer copies that once it sees this */
    int recording = tp_ensure_started() && ops_ready();
    if (!recording && !chaining) return NCCL_SUCCESS; /* inert: NCCL runs without us */
    nccl_comm *c = calloc(1, sizeof(*c));
    if (!c) { /* the chained plugin's context stays unused: NCCL runs without either */
        if (chaining) tp_chain_finalize(chained);
        return NCCL_SUCCESS;
    }
    c->version = version, c->recording = recording;
    c->hash = args->hash, c->rank = args->rank, c->nnodes = args->nnodes;
    atomic_init(&c->nranks, args->nranks);
    if (chaining) {
        c->chained = chained, c->chained_mask = chained_mask;
        if (recording) chained_channels_ready();
    }
    *context = c;
    *mask = (recording ? our_mask(version) : 0) | (chaining ? chained_mask : 0);
    if (recording) tp_set_flag(TP_FLAG_NCCL_PLUGIN);
    return NCCL_SUCCESS;
}

/* v1-v3: init names no communicator. */
static int init_unnamed(int version, void **context, int *mask)
{
    tp_comm_args args = {.hash = 0, .name = NULL, .nnodes = 0, .nranks = 0, .rank = -1, .log = NULL};
    return plugin_init(version, context, mask, &args);
}

static int init_v1(void **context, int *mask) { return init_unnamed(1, context, mask); }
static int init_v2(void **context, int *mask) { return init_unnamed(2, context, mask); }
static int init_v3(void **context, int *mask) { return init_unnamed(3, context, mask); }

static int init_v4(void **context, int *mask, const char *name, uint64_t hash, int nnodes, int nranks, int rank,
                   nccl_logger_fn log)
{
    tp_comm_args args = {.hash = hash, .name = name, .nnodes = nnodes, .nranks = nranks, .rank = rank, .log = log};
    return plugin_init(4, context, mask, &args);
}

static int init_v5_as(int version, void **context, uint64_t comm_id, int *mask, const char *name, int nnodes,
                      int nranks, int rank, nccl_logger_fn log)
{
    tp_comm_args args = {.hash = comm_id, .name = name, .nnodes = nnodes, .nranks = nranks, .rank = rank, .log = log};
    return plugin_init(version, context, mask, &args);
}

static int init_v5(void **context, uint64_t comm_id, int *mask, const char *name, int nnodes, int nranks, int rank,
                   nccl_logger_fn log)
{
    return init_v5_as(5, context, comm_id, mask, name, nnodes, nranks, rank, log);
}

static int init_v6(void **context, uint64_t comm_id, int *mask, const char *name, int nnodes, int nranks, int rank,
                   nccl_logger_fn log)
{
    return init_v5_as(6, context, comm_id, mask, name, nnodes, nranks, rank, log);
}

/* ---- events ------------------------------------------------------------ */

/* v1-v3: the communicator's size once ncclCommInitRank told it (0 until then). */
static uint32_t comm_size(nccl_comm *c, uint64_t hash)
{
    int n = atomic_load_explicit(&c->nranks, memory_order_relaxed);
    if (n > 0) return (uint32_t)n;
    n = (int)tp_nccl_comm_size(hash);
    if (n > 0) atomic_store_explicit(&c->nranks, n, memory_order_relaxed);
    return (uint32_t)n;
}

static nccl_op *new_op(nccl_comm *comm, const event *e, void *chained)
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
    op->chained = chained;
    op->expected_channels = e->channels, op->channels_bound = e->channels_bound;
    op->host_clock = comm->version == 3;
    tp_record *r = &op->rec;
    memset(r, 0, sizeof(*r));
    r->stream = e->comm_hash ? e->comm_hash : comm->hash;
    r->nranks = comm->version <= 3 ? comm_size(comm, r->stream) : (uint32_t)comm->nranks;
    r->rank = comm->version <= 3 ? e->rank : comm->rank;
    r->token = i;
    tp_copy_name(r->op, sizeof(r->op), e->func);
    const tp_nccl_dtype *dtype = dtype_named(e->datatype);
    tp_copy_name(r->dtype, sizeof(r->dtype), dtype ? dtype->name : "unknown");
    tp_copy_name(r->algo, sizeof(r->algo), e->algo);
    tp_copy_name(r->proto, sizeof(r->proto), e->proto);
    r->op_seq = e->has_seq ? e->seq : atomic_fetch_add(&g_p2p_seq, 1) + 1; /* NCCL gives p2p no sequence number */
    r->bytes = (uint64_t)e->count * (dtype ? dtype->size : 0); /* 0: bytes not known */
    /* count is per rank for AllGather / ReduceScatter; nccl-tests sizes them by the whole buffer */
    if (!strcmp(r->op, "AllGather") || !strcmp(r->op, "ReduceScatter")) r->bytes *= r->nranks;
    r->launched_ns = tp_now_ns();
    atomic_store(&op->last_activity_ns, r->launched_ns);
    atomic_store(&op->finished, 0);
    tp_record start = *r;
    start.type = TP_REC_NCCL_START;
    tp_submit(&start);
    return op;
}

/* A kernel channel of one of our ops started: its handle, or NULL when the op
 * was already reported (more channels than announced). */
static void *channel_started(nccl_op *op, const event *e, void *chained)
{
    if (atomic_load(&op->finished)) {
        atomic_fetch_add(&g_late, 1);
        return NULL;
    }
    void *(*table)[CHANNELS] = atomic_load(&g_chained_channels);
    if (op->comm->chained) {
        if (!table) return NULL; /* no room for its handle: the chained plugin keeps this channel, we lose it */
        table[op->index][e->channel % CHANNELS] = chained;
    }
    atomic_fetch_add(&op->ch_started, 1);
    uint64_t now = tp_now_ns();
    earliest(&op->gpu_start, op->host_clock ? now : e->ptimer);
    atomic_store(&op->last_activity_ns, now);
    return channel_handle(op, e->channel);
}

/* Pass the event on to the chained plugin, with its own handle as parent;
 * its handle for the event, or NULL. */
static void *pass_on(const nccl_comm *comm, const event *e, void *descr)
{
    if (!comm->chained || !tp_chain_wants(comm->chained_mask, e->type)) return NULL;
    if ((e->type & (PROFILE_COLL | PROFILE_P2P)) && e->parent == &g_group_sentinel)
        return NULL; /* its group got no handle from it: NCCL alone would not start these (v1-v4) */
    nccl_descr_head *head = descr;
    void *parent = head->parent;
    head->parent = chained_handle(parent);
    void *handle = tp_chain_start(comm->chained, descr);
    head->parent = parent; /* NCCL's descriptor as NCCL made it */
    return handle;
}

/* v6: a Broadcast is its API event (see the top); every other op its Coll/P2p/CeColl event. */
static int counted_elsewhere(const nccl_comm *comm, const event *e)
{
    if (comm->version < 6 || (e->type != PROFILE_COLL_API && e->type != PROFILE_COLL)) return 0;
    int broadcast = e->func && !strcmp(e->func, "Broadcast");
    return e->type == PROFILE_COLL ? broadcast : !broadcast;
}

static void *record_start(nccl_comm *comm, event *e, void *chained)
{
    if (!comm->recording || !(e->type & (uint32_t)our_mask(comm->version)) || counted_elsewhere(comm, e)) return NULL;
    if (e->type == PROFILE_COLL_API) /* a v6 Broadcast: numbered as NCCL numbers its collectives */
        e->seq = atomic_fetch_add(&comm->broadcasts, 1), e->has_seq = 1;
    if (e->type == PROFILE_KERNEL_CH) {
        int channel;
        nccl_op *op = our_op(e->parent, &channel);
        return op && channel < 0 ? channel_started(op, e, chained) : NULL;
    }
    nccl_op *op = new_op(comm, e, chained);
    if (!op) tp_count_drop();
    return op;
}

static int start_event(void *context, void **handle, event *e, void *descr)
{
    *handle = NULL;
    nccl_comm *comm = context;
    if (!comm) return NCCL_SUCCESS;
    void *chained = pass_on(comm, e, descr);
    void *ours = record_start(comm, e, chained);
    if (ours) *handle = ours;
    else if (chained) *handle = chained;
    else if (e->type == PROFILE_GROUP && comm->version <= 4) *handle = (void *)&g_group_sentinel;
    return NCCL_SUCCESS;
}

/* NCCL's startEvent for one version: its descriptor read into an event, then the one start_event. */
#define START_EVENT_OF(version)                                           \
    static int start_##version(void *context, void **handle, void *descr) \
    {                                                                     \
        event e;                                                          \
        read_##version(descr, &e);                                        \
        return start_event(context, handle, &e, descr);                   \
    }
START_EVENT_OF(v1)
START_EVENT_OF(v2)
START_EVENT_OF(v3)
START_EVENT_OF(v4)
START_EVENT_OF(v6) /* and v5 */

static int stop_event(void *handle)
{
    if (!handle || handle == &g_group_sentinel) return NCCL_SUCCESS;
    void *chained = chained_handle(handle); /* before our stop: it may hand the op to another event */
    if (chained) tp_chain_stop(chained);
    int channel;
    nccl_op *op = our_op(handle, &channel);
    if (!op) return NCCL_SUCCESS;
    if (channel >= 0) {
        uint64_t now = tp_now_ns();
        if (op->host_clock) latest(&op->gpu_stop, now);
        atomic_fetch_add(&op->ch_stopped, 1);
        atomic_store(&op->last_activity_ns, now);
    } else {
        atomic_store(&op->host_done, 1);
    }
    maybe_finish(op);
    return NCCL_SUCCESS;
}

static int record_state(void *handle, int state, void *args)
{
    if (!handle || handle == &g_group_sentinel) return NCCL_SUCCESS;
    void *chained = chained_handle(handle);
    if (chained) tp_chain_record(chained, state, args);
    int channel;
    nccl_op *op = our_op(handle, &channel);
    if (!op || channel < 0 || op->host_clock || state != STATE_KERNEL_CH_STOP || !args) return NCCL_SUCCESS;
    uint64_t t = *(const uint64_t *)args; /* the kernel channel's stop on the GPU timer */
    learn_clock(t);
    latest(&op->gpu_stop, t);
    return NCCL_SUCCESS;
}

static int finalize(void *context)
{
    nccl_comm *comm = context;
    if (comm && comm->chained) tp_chain_finalize(comm->chained);
    return NCCL_SUCCESS;
}

TP_EXPORT const nccl_profiler_v5 ncclProfiler_v6 = {"tuiprof", init_v6, start_v6, stop_event, record_state, finalize};
TP_EXPORT const nccl_profiler_v5 ncclProfiler_v5 = {"tuiprof", init_v5, start_v6, stop_event, record_state, finalize};
TP_EXPORT const nccl_profiler_v4 ncclProfiler_v4 = {"tuiprof", init_v4, start_v4, stop_event, record_state, finalize};
TP_EXPORT const nccl_profiler_v1 ncclProfiler_v3 = {"tuiprof", init_v3, start_v3, stop_event, record_state, finalize};
TP_EXPORT const nccl_profiler_v1 ncclProfiler_v2 = {"tuiprof", init_v2, start_v2, stop_event, record_state, finalize};
TP_EXPORT const nccl_profiler_v1 ncclProfiler_v1 = {"tuiprof", init_v1, start_v1, stop_event, record_state, finalize};

/* For programs that check what NCCL took (tests, bench/gpu) until the
 * segment carries it: the profiler API version NCCL initialised this library
 * with (0: none yet), and what became of the plugin it chains to ("": none
 * was named). */
uint32_t tp_nccl_profiler_api(void) { return (uint32_t)atomic_load(&g_version); }

TP_EXPORT int tuiprof_nccl_profiler_version(void) { return atomic_load(&g_version); }

TP_EXPORT const char *tuiprof_nccl_chain(void)
{
    static char status[512];
    tp_chain_status(status, sizeof(status));
    return status;
}
