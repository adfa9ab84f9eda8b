/* Stand-in NCCL API for CI: the entry points PyTorch calls (communicator
 * init/split, the collectives, Send/Recv, groups), enqueuing "kernels" on the
 * stand-in CUDA runtime's streams.  By default it is an NCCL 2.21.5 with no
 * profiler plugin support.  Built with -DSTANDIN_PROFILER it is NCCL 2.28.3
 * instead: communicator init loads the plugin and every op is also reported
 * to it, through the profiler stand-in (nccl.c, linked as libncclprof.so).
 *
 * An op's kernel takes STANDIN_OP_NS + its bytes (1 ns each) on its stream;
 * ops inside ncclGroupStart/End are queued and launched, back to back, at the
 * outermost ncclGroupEnd.  standin_nccl_fail_next(code) makes the next call
 * return `code` without enqueuing anything; a NULL communicator gets
 * ncclInvalidArgument, as in NCCL. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SUCCESS 0
#define INVALID_ARGUMENT 4
#define INVALID_USAGE 5
#define STANDIN_OP_NS 20000u
#define GROUP_MAX 256

/* The stand-in CUDA runtime's, when the process loaded it (a job may run without CUDA). */
void standin_stream_advance(void *s, uint64_t ns) __attribute__((weak));

#ifdef STANDIN_PROFILER
#define VERSION 22803
void *standin_nccl_init(uint64_t comm_hash, int nranks, int rank);
int standin_nccl_op(void *handle, const char *func, size_t count, const char *dtype, int peer, int channels,
                    const char *algo, const char *proto, uint64_t gpu_dur_ns, int hang);
#else
#define VERSION 22105
#endif

typedef struct { char internal[128]; } unique_id;

typedef struct comm {
    int nranks, rank;
    void *profiler;
} comm;

static const uint64_t type_sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char *const type_names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",   "ncclUint32",
                                         "ncclInt64",   "ncclUint64",  "ncclFloat16", "ncclFloat32",
                                         "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};

static int fail_next;
static long calls;
static __thread int group_depth;
typedef struct launch {
    void *stream;
    comm *c;
    const char *func;
    size_t count;
    int dtype, peer;
} launch;
static __thread launch queued[GROUP_MAX];
static __thread int queued_count;

void standin_nccl_fail_next(int code) { fail_next = code; }
long standin_nccl_calls(void) { return calls; }

int ncclGetVersion(int *version)
{
    *version = VERSION;
    return SUCCESS;
}

static int make_comm(comm **out, int nranks, int rank, uint64_t hash)
{
    comm *c = calloc(1, sizeof(comm));
    if (!c) return 2;
    c->nranks = nranks, c->rank = rank;
#ifdef STANDIN_PROFILER
    c->profiler = standin_nccl_init(hash, nranks, rank);
#else
    (void)hash;
#endif
    *out = c;
    return SUCCESS;
}

int ncclCommInitRank(comm **out, int nranks, unique_id id, int rank)
{
    uint64_t hash;
    memcpy(&hash, id.internal, sizeof(hash));
    return make_comm(out, nranks, rank, hash);
}

int ncclCommInitRankConfig(comm **out, int nranks, unique_id id, int rank, void *config)
{
    (void)config;
    return ncclCommInitRank(out, nranks, id, rank);
}

int ncclCommSplit(comm *parent, int color, int key, comm **out, void *config)
{
    (void)config, (void)color;
    if (!parent) return INVALID_ARGUMENT;
    return make_comm(out, parent->nranks / 2, key, (uint64_t)color);
}

int ncclCommDestroy(comm *c)
{
    free(c);
    return SUCCESS;
}

int ncclCommUserRank(const comm *c, int *rank)
{
    if (!c) return INVALID_ARGUMENT;
    *rank = c->rank;
    return SUCCESS;
}

int ncclCommCount(const comm *c, int *count)
{
    if (!c) return INVALID_ARGUMENT;
    *count = c->nranks;
    return SUCCESS;
}

/* The op's kernel on its stream (and, with the plugin, its profiler events). */
static void run(const launch *l)
{
    uint64_t ns = STANDIN_OP_NS + l->count * type_sizes[l->dtype];
#ifdef STANDIN_PROFILER
    standin_nccl_op(l->c->profiler, l->func, l->count, type_names[l->dtype], l->peer, 1, l->peer < 0 ? "RING" : NULL,
                    l->peer < 0 ? "SIMPLE" : NULL, ns, 0);
#else
    (void)type_names;
#endif
    if (standin_stream_advance) standin_stream_advance(l->stream, ns);
}

int ncclGroupStart(void)
{
    calls++;
    if (group_depth++ == 0) queued_count = 0;
    return SUCCESS;
}

int ncclGroupEnd(void)
{
    calls++;
    if (group_depth == 0) return INVALID_USAGE;
    if (--group_depth > 0) return SUCCESS;
    int code = fail_next;
    fail_next = 0;
    if (code) return code; /* the group's ops are dropped */
    for (int i = 0; i < queued_count; i++) run(&queued[i]);
    queued_count = 0;
    return SUCCESS;
}

static int enqueue(comm *c, const char *func, size_t count, int dtype, int peer, void *stream)
{
    calls++;
    if (fail_next) {
        int code = fail_next;
        fail_next = 0;
        return code;
    }
    if (!c || dtype < 0 || dtype > 11) return INVALID_ARGUMENT;
    launch l = {stream, c, func, count, dtype, peer};
    if (group_depth == 0) run(&l);
    else if (queued_count < GROUP_MAX) queued[queued_count++] = l;
    return SUCCESS;
}

int ncclAllReduce(const void *s, void *r, size_t count, int dtype, int op, comm *c, void *stream)
{
    (void)s, (void)r, (void)op;
    return enqueue(c, "AllReduce", count, dtype, -1, stream);
}

int ncclAllGather(const void *s, void *r, size_t count, int dtype, comm *c, void *stream)
{
    (void)s, (void)r;
    return enqueue(c, "AllGather", count, dtype, -1, stream);
}

int ncclReduceScatter(const void *s, void *r, size_t count, int dtype, int op, comm *c, void *stream)
{
    (void)s, (void)r, (void)op;
    return enqueue(c, "ReduceScatter", count, dtype, -1, stream);
}

int ncclBroadcast(const void *s, void *r, size_t count, int dtype, int root, comm *c, void *stream)
{
    (void)s, (void)r, (void)root;
    return enqueue(c, "Broadcast", count, dtype, -1, stream);
}

int ncclReduce(const void *s, void *r, size_t count, int dtype, int op, int root, comm *c, void *stream)
{
    (void)s, (void)r, (void)op, (void)root;
    return enqueue(c, "Reduce", count, dtype, -1, stream);
}

int ncclSend(const void *s, size_t count, int dtype, int peer, comm *c, void *stream)
{
    (void)s;
    return enqueue(c, "Send", count, dtype, peer, stream);
}

int ncclRecv(void *r, size_t count, int dtype, int peer, comm *c, void *stream)
{
    (void)r;
    return enqueue(c, "Recv", count, dtype, peer, stream);
}
