/* Drives an NCCL profiler plugin the way NCCL of one profiler API version
 * does, with NCCL's own descriptor types (tests/native/nccl_profiler_headers,
 * from NCCL's ext-profiler example): dlopen NCCL_PROFILER_PLUGIN, look up
 * ncclProfiler_v<N> from the driven version down (NCCL of that version knows
 * no newer one), init one communicator, then a fixed program of ops:
 *
 *   AllReduce bf16 x1024, RING/SIMPLE, 2 channels, 50 us on the GPU, 3 times
 *   AllGather fp32 x256, RING/LL, 1 channel, 20 us, 2 times
 *   Send int8 x100 to rank 2, 1 channel, 5 us, 2 times
 *   v6: AlltoAll fp32 x64 on copy engines, once
 *   v6: Broadcast fp32 x128 twice, as NCCL 2.29/2.30 report it: its CollApi
 *       event alone (their default), then with a Coll event too
 *       (NCCL_ALLGATHERV_ENABLE=0)
 *
 * Per op as NCCL does: (v5+) GroupApi and CollApi/P2pApi events, a Group
 * event (up to v4 the op's events start only when it got a handle), the
 * Coll/P2p event (stopped once enqueued), a ProxyOp per channel when the
 * plugin asks for proxy events, and (v3+) one KernelCh per channel: v4+ with
 * GPU timer stamps (start, KernelChStop state, stop), v3 without, and v3
 * announces two channels more than it runs (nMaxChannels is a bound).
 * The communicator is made through ncclCommInitRank (stand-in libnccl) so
 * that the hook learns its size; its hash is NCCL's: DJB2a of the unique id.
 *
 * Usage: driver VERSION.  Prints one JSON line (what was driven), then READY,
 * and finalizes and exits at a line on stdin. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "err.h"
#include "profiler.h"
#include "types.h"

#define NRANKS 4
#define RANK 1

typedef struct unique_id {
    char internal[128];
} unique_id;
int ncclCommInitRank(void **comm, int nranks, unique_id id, int rank); /* the stand-in libnccl */

typedef struct op {
    const char *func;
    uint8_t func_v1;
    const char *datatype;
    uint8_t datatype_v1;
    size_t count;
    int peer; /* -1: a collective */
    const char *algo, *proto;
    uint8_t algo_v1, proto_v1;
    int channels, times;
    uint64_t gpu_ns;
} op;

static const op program[] = {
    {"AllReduce", 4, "ncclBfloat16", ncclBfloat16, 1024, -1, "RING", "SIMPLE", 1, 2, 2, 3, 50000},
    {"AllGather", 2, "ncclFloat32", ncclFloat32, 256, -1, "RING", "LL", 1, 0, 1, 2, 20000},
    {"Send", 6, "ncclInt8", ncclInt8, 100, 2, NULL, NULL, 0, 0, 1, 2, 5000},
};

typedef union any_descr { /* room for a descriptor of any version */
    ncclProfilerEventDescr_v1_t v1;
    ncclProfilerEventDescr_v2_t v2;
    ncclProfilerEventDescr_v3_t v3;
    ncclProfilerEventDescr_v4_t v4;
    ncclProfilerEventDescr_v5_t v5;
    ncclProfilerEventDescr_v6_t v6;
} any_descr;

static int version;
static void *ctx;
static int mask;
static uint64_t comm_hash;
static uint64_t seq[8];
static ncclResult_t (*start_fn)(void *, void **, void *);
static ncclResult_t (*stop_fn)(void *);
static ncclResult_t (*record_fn)(void *, ncclProfilerEventState_t, void *);
static ncclResult_t (*finalize_fn)(void *);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* NCCL offers an event when the plugin asks for it or for one of its descendants. */
static int offered(int type)
{
    int task = ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin;
    switch (type) {
    case ncclProfileGroupApi: return mask != 0;
    case ncclProfileCollApi: return mask & (type | ncclProfileColl | task | ncclProfileCeColl);
    case ncclProfileP2pApi: return mask & (type | ncclProfileP2p | task);
    case ncclProfileGroup: return mask & (type | ncclProfileColl | ncclProfileP2p | task);
    case ncclProfileColl:
    case ncclProfileP2p: return mask & (type | task);
    case ncclProfileProxyOp: return mask & (type | ncclProfileProxyStep | ncclProfileNetPlugin);
    default: return mask & type;
    }
}

/* Start one event from a zeroed descriptor of the driven version whose common part is set here. */
static void *start(int type, void *parent, void *descr)
{
    if (!offered(type)) return NULL;
    if (version >= 5) {
        ncclProfilerEventDescr_v6_t *d = descr;
        d->type = (uint64_t)type, d->parentObj = parent, d->rank = RANK;
    } else { /* v1-v4 share the head */
        ncclProfilerEventDescr_v4_t *d = descr;
        d->type = (uint8_t)type, d->parentObj = parent, d->rank = RANK;
    }
    void *handle = NULL;
    start_fn(ctx, &handle, descr);
    return handle;
}

static void stop(void *handle)
{
    if (handle) stop_fn(handle);
}

/* Fill the Coll or P2p descriptor of `o` in the driven version. */
static void describe(const op *o, void *descr, void *group)
{
    int coll = o->peer < 0;
    int announced = version == 3 ? o->channels + 2 : o->channels;
    uint64_t s = coll ? seq[o->func_v1]++ : 0;
    if (version == 1) {
        ncclProfilerEventDescr_v1_t *d = descr;
        if (coll) {
            d->coll.commHash = comm_hash, d->coll.seqNumber = s, d->coll.func = o->func_v1, d->coll.count = o->count;
            d->coll.datatype = o->datatype_v1, d->coll.nMaxChannels = (uint8_t)announced;
            d->coll.algo = o->algo_v1, d->coll.proto = o->proto_v1;
        } else {
            d->p2p.commHash = comm_hash, d->p2p.func = o->func_v1, d->p2p.count = o->count;
            d->p2p.datatype = o->datatype_v1, d->p2p.peer = o->peer;
        }
    } else if (version == 2) {
        ncclProfilerEventDescr_v2_t *d = descr;
        if (coll) {
            d->coll.commHash = comm_hash, d->coll.seqNumber = s, d->coll.func = o->func, d->coll.count = o->count;
            d->coll.datatype = o->datatype, d->coll.nMaxChannels = (uint8_t)announced;
            d->coll.algo = o->algo, d->coll.proto = o->proto;
        } else {
            d->p2p.commHash = comm_hash, d->p2p.func = o->func, d->p2p.count = o->count;
            d->p2p.datatype = o->datatype, d->p2p.peer = o->peer;
        }
    } else if (version == 3) {
        ncclProfilerEventDescr_v3_t *d = descr;
        if (coll) {
            d->coll.commHash = comm_hash, d->coll.seqNumber = s, d->coll.func = o->func, d->coll.count = o->count;
            d->coll.datatype = o->datatype, d->coll.nMaxChannels = (uint8_t)announced;
            d->coll.algo = o->algo, d->coll.proto = o->proto;
        } else {
            d->p2p.commHash = comm_hash, d->p2p.func = o->func, d->p2p.count = o->count;
            d->p2p.datatype = o->datatype, d->p2p.peer = o->peer;
        }
    } else if (version == 4) {
        ncclProfilerEventDescr_v4_t *d = descr;
        if (coll) {
            d->coll.seqNumber = s, d->coll.func = o->func, d->coll.count = o->count, d->coll.datatype = o->datatype;
            d->coll.nChannels = (uint8_t)announced, d->coll.algo = o->algo, d->coll.proto = o->proto;
        } else {
            d->p2p.func = o->func, d->p2p.count = o->count, d->p2p.datatype = o->datatype, d->p2p.peer = o->peer;
            d->p2p.nChannels = (uint8_t)announced;
        }
    } else {
        ncclProfilerEventDescr_v6_t *d = descr;
        if (coll) {
            d->coll.seqNumber = s, d->coll.func = o->func, d->coll.count = o->count, d->coll.datatype = o->datatype;
            d->coll.nChannels = (uint8_t)announced, d->coll.algo = o->algo, d->coll.proto = o->proto;
            d->coll.parentGroup = group;
        } else {
            d->p2p.func = o->func, d->p2p.count = o->count, d->p2p.datatype = o->datatype, d->p2p.peer = o->peer;
            d->p2p.nChannels = (uint8_t)announced, d->p2p.parentGroup = group;
        }
    }
}

/* The kernel's channels as NCCL's proxy thread reports them (v3+). */
static void run_channels(const op *o, void *task)
{
    void *channels[8] = {0};
    uint64_t gpu_start = now_ns();
    for (int c = 0; c < o->channels; c++) {
        any_descr d;
        memset(&d, 0, sizeof(d));
        uint64_t stamp = gpu_start + (uint64_t)c * 100; /* channels start a little apart */
        if (version == 3) d.v3.kernelCh.channelId = (uint8_t)c; /* no GPU stamp */
        else if (version == 4) d.v4.kernelCh.channelId = (uint8_t)c, d.v4.kernelCh.pTimer = stamp;
        else d.v6.kernelCh.channelId = (uint8_t)c, d.v6.kernelCh.pTimer = stamp;
        channels[c] = start(ncclProfileKernelCh, task, &d);
    }
    if (version == 3) { /* the proxy thread sees the kernel run */
        struct timespec pause = {0, (long)o->gpu_ns};
        nanosleep(&pause, NULL);
    }
    for (int c = 0; c < o->channels; c++) {
        if (!channels[c]) continue;
        if (version >= 4) {
            ncclProfilerEventStateArgs_v5_t a = {0};
            a.kernelCh.pTimer = gpu_start + o->gpu_ns - (uint64_t)c * 100; /* channel 0 finishes last */
            record_fn(channels[c], ncclProfilerKernelChStop, &a);
        }
        stop(channels[c]);
    }
}

static void run_op(const op *o)
{
    any_descr group_api = {0}, api = {0}, group = {0}, task = {0}, proxy[8];
    void *group_api_handle = NULL, *api_handle = NULL;
    if (version >= 5) {
        group_api_handle = start(ncclProfileGroupApi, NULL, &group_api);
        if (o->peer < 0) {
            api.v6.collApi.func = o->func, api.v6.collApi.count = o->count, api.v6.collApi.datatype = o->datatype;
        } else {
            api.v6.p2pApi.func = o->func, api.v6.p2pApi.count = o->count, api.v6.p2pApi.datatype = o->datatype;
        }
        api_handle = start(o->peer < 0 ? ncclProfileCollApi : ncclProfileP2pApi, group_api_handle, &api);
        stop(api_handle); /* at the end of the API call; its handle stays the op's parent */
    }
    void *group_handle = start(ncclProfileGroup, NULL, &group);
    void *task_handle = NULL;
    if (group_handle || version >= 5) {
        describe(o, &task, group_handle);
        task_handle = start(o->peer < 0 ? ncclProfileColl : ncclProfileP2p, version >= 5 ? api_handle : group_handle,
                            &task);
    }
    void *proxy_handles[8] = {0};
    for (int c = 0; c < o->channels; c++) {
        memset(&proxy[c], 0, sizeof(proxy[c])); /* proxyOp is laid out alike in every version */
        proxy[c].v6.proxyOp.channelId = (uint8_t)c, proxy[c].v6.proxyOp.peer = o->peer, proxy[c].v6.proxyOp.nSteps = 1;
        proxy_handles[c] = start(ncclProfileProxyOp, task_handle, &proxy[c]);
    }
    stop(task_handle); /* enqueued */
    stop(group_handle);
    stop(group_api_handle);
    if (version >= 3) run_channels(o, task_handle);
    for (int c = 0; c < o->channels; c++) stop(proxy_handles[c]);
}

static void run_ce_coll(void)
{
    any_descr group_api = {0}, api = {0}, ce = {0};
    void *group_api_handle = start(ncclProfileGroupApi, NULL, &group_api);
    api.v6.collApi.func = "AlltoAll", api.v6.collApi.count = 64, api.v6.collApi.datatype = "ncclFloat32";
    void *api_handle = start(ncclProfileCollApi, group_api_handle, &api);
    stop(api_handle);
    ce.v6.ceColl.seqNumber = 0, ce.v6.ceColl.func = "AlltoAll", ce.v6.ceColl.count = 64;
    ce.v6.ceColl.datatype = "ncclFloat32", ce.v6.ceColl.syncStrategy = "UC", ce.v6.ceColl.ceSeqNum = 0;
    stop(start(ncclProfileCeColl, api_handle, &ce));
    stop(group_api_handle);
}

static void run_broadcasts(void)
{
    for (int with_coll = 0; with_coll < 2; with_coll++) {
        any_descr group_api = {0}, api = {0}, task = {0};
        void *group_api_handle = start(ncclProfileGroupApi, NULL, &group_api);
        api.v6.collApi.func = "Broadcast", api.v6.collApi.count = 128, api.v6.collApi.datatype = "ncclFloat32";
        void *api_handle = start(ncclProfileCollApi, group_api_handle, &api);
        if (with_coll) {
            task.v6.coll.seqNumber = 0, task.v6.coll.func = "Broadcast", task.v6.coll.count = 128;
            task.v6.coll.datatype = "ncclFloat32", task.v6.coll.algo = "RING", task.v6.coll.proto = "SIMPLE";
            stop(start(ncclProfileColl, api_handle, &task)); /* no channels: NCCL would send them, we need none */
        }
        stop(api_handle);
        stop(group_api_handle);
    }
}

static uint64_t djb2a(const unique_id *id)
{
    uint64_t h = 5381;
    for (size_t i = 0; i < sizeof(id->internal); i++) h = ((h << 5) + h) ^ (uint64_t)(signed char)id->internal[i];
    return h;
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    version = atoi(argv[1]);
    const char *path = getenv("NCCL_PROFILER_PLUGIN");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) return 3;
    int found = 0;
    void *table = NULL;
    for (int v = version; v >= 1 && !table; v--) { /* NCCL's order: newest first */
        char symbol[32];
        snprintf(symbol, sizeof(symbol), "ncclProfiler_v%d", v);
        if ((table = dlsym(lib, symbol))) found = v;
    }
    if (found != version) return 4;

    unique_id id;
    memset(&id, 0, sizeof(id));
    snprintf(id.internal, sizeof(id.internal), "tuiprof profiler driver, API v%d", version);
    void *comm = NULL;
    if (ncclCommInitRank(&comm, NRANKS, id, RANK) != 0) return 5;
    comm_hash = djb2a(&id);

    if (version <= 3) {
        ncclProfiler_v3_t *t = table; /* v1-v3 tables agree but for the descriptor type */
        t->init(&ctx, &mask);
        start_fn = (void *)t->startEvent, stop_fn = t->stopEvent, record_fn = (void *)t->recordEventState;
        finalize_fn = t->finalize;
    } else if (version == 4) {
        ncclProfiler_v4_t *t = table;
        t->init(&ctx, &mask, "driver", comm_hash, 1, NRANKS, RANK, NULL);
        start_fn = (void *)t->startEvent, stop_fn = t->stopEvent, record_fn = (void *)t->recordEventState;
        finalize_fn = t->finalize;
    } else {
        ncclProfiler_v5_t *t = table; /* v6's table is v5's but for the descriptor type */
        t->init(&ctx, comm_hash, &mask, "driver", 1, NRANKS, RANK, NULL);
        start_fn = (void *)t->startEvent, stop_fn = t->stopEvent, record_fn = (void *)t->recordEventState;
        finalize_fn = t->finalize;
    }
    for (size_t i = 0; i < sizeof(program) / sizeof(program[0]); i++)
        for (int n = 0; n < program[i].times; n++) run_op(&program[i]);
    if (version >= 6) run_ce_coll(), run_broadcasts();

    int (*chosen)(void) = (int (*)(void))dlsym(lib, "tuiprof_nccl_profiler_version");
    const char *(*chain)(void) = (const char *(*)(void))dlsym(lib, "tuiprof_nccl_chain");
    printf("{\"symbol\": \"ncclProfiler_v%d\", \"mask\": %d, \"comm_hash\": %llu, \"chosen\": %d, \"chain\": \"%s\"}\n",
           found, mask, (unsigned long long)comm_hash, chosen ? chosen() : -1, chain ? chain() : "");
    printf("READY\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof(line), stdin)) return 6;
    if (ctx) finalize_fn(ctx);
    return 0;
}
