/* Stand-in NCCL 2.28 for CI: loads the profiler plugin named by
 * NCCL_PROFILER_PLUGIN and drives ncclProfiler_v5 the way NCCL 2.28 does:
 * per communicator init; per op GroupApi/CollApi (offered whatever the
 * plugin asked for), Group, Coll or P2p at enqueue, Coll stop once enqueued,
 * then from a separate proxy thread one KernelCh event per channel with GPU
 * timer stamps (start, KernelChStop state, stop).  Its own copy of the v5
 * structs, written from NCCL's header, checks the plugin's ABI.  Built with
 * -DSTANDIN_V4 it is NCCL 2.27 instead: ncclProfiler_v4, a one-byte event
 * type, the older init signature, no API-level events, and an op's events
 * only under a Group event that got a handle. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

enum {
    GROUP = 1 << 0, COLL = 1 << 1, P2P = 1 << 2, KERNEL_CH = 1 << 6,
    GROUP_API = 1 << 8, COLL_API = 1 << 9, P2P_API = 1 << 10, KERNEL_LAUNCH = 1 << 11,
};
#define KERNEL_CH_STOP 22

#ifdef STANDIN_V4
#define EVENT_TYPE uint8_t
#define PARENT_GROUP
#define PROFILER_SYMBOL "ncclProfiler_v4"
#else
#define EVENT_TYPE uint64_t
#define PARENT_GROUP void *parentGroup;
#define PROFILER_SYMBOL "ncclProfiler_v5"
#endif

typedef struct {
    EVENT_TYPE type;
    void *parentObj;
    int rank;
    union {
        struct { int graphCaptured; int groupDepth; } groupApi;
        struct { const char *func; size_t count; const char *datatype; int root; void *stream; bool graphCaptured; } collApi;
        struct { const char *func; size_t count; const char *datatype; void *stream; bool graphCaptured; } p2pApi;
        struct { void *stream; } kernelLaunch;
        struct {
            uint64_t seqNumber; const char *func; void const *sendBuff; void *recvBuff; size_t count; int root;
            const char *datatype; uint8_t nChannels; uint8_t nWarps; const char *algo; const char *proto;
            PARENT_GROUP
        } coll;
        struct {
            const char *func; void *buff; const char *datatype; size_t count; int peer; uint8_t nChannels;
            PARENT_GROUP
        } p2p;
        struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
        struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    };
} descr_v5;

typedef union {
    struct { size_t transSize; } proxyStep;
    struct { uint64_t pTimer; } kernelCh;
} state_args_v5;

typedef struct {
    const char *name;
#ifdef STANDIN_V4
    int (*init)(void **, int *, const char *, uint64_t, int, int, int, void *);
#else
    int (*init)(void **, uint64_t, int *, const char *, int, int, int, void *);
#endif
    int (*startEvent)(void *, void **, descr_v5 *);
    int (*stopEvent)(void *);
    int (*recordEventState)(void *, int, state_args_v5 *);
    int (*finalize)(void *);
} profiler_v5;

typedef struct comm {
    void *ctx;
    int mask, rank;
    uint64_t seq[16];
} comm;

static profiler_v5 *plugin;
static long unexpected_handles; /* handles returned for events the plugin did not ask for */

long standin_nccl_unexpected_handles(void) { return unexpected_handles; }

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void *standin_nccl_init(uint64_t comm_hash, int nranks, int rank)
{
    if (!plugin) {
        const char *path = getenv("NCCL_PROFILER_PLUGIN");
        void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        plugin = lib ? dlsym(lib, PROFILER_SYMBOL) : NULL;
    }
    comm *c = calloc(1, sizeof(comm));
    c->rank = rank;
#ifdef STANDIN_V4
    if (plugin) plugin->init(&c->ctx, &c->mask, "standin", comm_hash, 1, nranks, rank, NULL);
#else
    if (plugin) plugin->init(&c->ctx, comm_hash, &c->mask, "standin", 1, nranks, rank, NULL);
#endif
    return c;
}

static void *offer(comm *c, int wanted_by, int type, descr_v5 *d)
{
    void *h = NULL;
#ifdef STANDIN_V4
    if (type & (GROUP_API | COLL_API | P2P_API | KERNEL_LAUNCH)) return NULL; /* no such events before v5 */
#endif
    d->type = (EVENT_TYPE)type;
    if (plugin && (c->mask & wanted_by)) {
        plugin->startEvent(c->ctx, &h, d);
#ifdef STANDIN_V4
        if (type == GROUP) return h; /* every plugin must give one (below) */
#endif
        if (h && !(c->mask & type)) unexpected_handles++;
    }
    return h;
}

typedef struct proxy_job {
    void *task;
    comm *c;
    int channels, hang;
    uint64_t gpu_start, gpu_dur;
} proxy_job;

static void *proxy(void *arg)
{
    proxy_job *j = arg;
    void *ch[64] = {0};
    for (int i = 0; i < j->channels; i++) {
        descr_v5 d = {0};
        d.parentObj = j->task;
        d.kernelCh.channelId = (uint8_t)i;
        d.kernelCh.pTimer = j->gpu_start + (uint64_t)i * 100; /* channels start a little apart */
        ch[i] = offer(j->c, KERNEL_CH, KERNEL_CH, &d);
    }
    if (j->hang) return NULL; /* the kernel never finishes */
    for (int i = 0; i < j->channels; i++) {
        if (!ch[i]) continue;
        state_args_v5 a = {0};
        a.kernelCh.pTimer = j->gpu_start + j->gpu_dur - (uint64_t)i * 100; /* channel 0 finishes last */
        plugin->recordEventState(ch[i], KERNEL_CH_STOP, &a);
        plugin->stopEvent(ch[i]);
    }
    return NULL;
}

static int func_index(const char *f)
{
    static const char *const names[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce",
                                        "SendRecv", "Send", "Recv", "AlltoAll", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], f)) return i;
    return 15;
}

/* One collective (peer < 0) or p2p op, GPU time gpu_dur_ns, optionally hung. */
int standin_nccl_op(void *handle, const char *func, size_t count, const char *dtype, int peer, int channels,
                    const char *algo, const char *proto, uint64_t gpu_dur_ns, int hang)
{
    comm *c = handle;
    int mask_any = COLL | P2P | KERNEL_CH | GROUP;
    descr_v5 g = {0};
    void *group_api = offer(c, GROUP_API | COLL_API | P2P_API | KERNEL_LAUNCH | mask_any, GROUP_API, &g);
    descr_v5 api = {0};
    api.parentObj = group_api;
    int api_type = peer < 0 ? COLL_API : P2P_API;
    if (peer < 0) {
        api.collApi.func = func, api.collApi.count = count, api.collApi.datatype = dtype;
    } else {
        api.p2pApi.func = func, api.p2pApi.count = count, api.p2pApi.datatype = dtype;
    }
    void *coll_api = offer(c, api_type | COLL | P2P | KERNEL_CH, api_type, &api);
    descr_v5 grp = {0};
    void *group = offer(c, mask_any, GROUP, &grp);
    descr_v5 t = {0};
    t.rank = c->rank;
    t.parentObj = coll_api;
    void *task = NULL;
#ifdef STANDIN_V4
    t.parentObj = group;
    int task_events = group != NULL; /* NCCL 2.27 starts an op's events only under a group that got a handle */
#else
    int task_events = 1;
#endif
    if (!task_events) {
        /* the op runs unseen */
    } else if (peer < 0) {
        t.coll.seqNumber = c->seq[func_index(func)]++;
        t.coll.func = func, t.coll.count = count, t.coll.datatype = dtype, t.coll.nChannels = (uint8_t)channels;
        t.coll.algo = algo, t.coll.proto = proto;
#ifndef STANDIN_V4
        t.coll.parentGroup = group;
#endif
        task = offer(c, COLL | KERNEL_CH, COLL, &t);
    } else {
        t.p2p.func = func, t.p2p.count = count, t.p2p.datatype = dtype, t.p2p.peer = peer;
        t.p2p.nChannels = (uint8_t)channels;
#ifndef STANDIN_V4
        t.p2p.parentGroup = group;
#endif
        task = offer(c, P2P | KERNEL_CH, P2P, &t);
    }
    proxy_job job = {task, c, channels, hang, now_ns(), gpu_dur_ns};
    pthread_t th;
    pthread_create(&th, NULL, proxy, &job);
    if (task) plugin->stopEvent(task); /* enqueued: races with the proxy thread, as in NCCL */
    if (group) plugin->stopEvent(group);
    if (coll_api) plugin->stopEvent(coll_api);
    if (group_api) plugin->stopEvent(group_api);
    pthread_join(th, NULL);
    return task != NULL;
}

void standin_nccl_finalize(void *handle)
{
    comm *c = handle;
    if (plugin && c->ctx) plugin->finalize(c->ctx);
    free(c);
}
