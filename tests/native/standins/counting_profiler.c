/* A second NCCL profiler plugin for the chaining tests, built with
 * -DCHAIN_VERSION=N: exports ncclProfiler_v<N> only, written against NCCL's
 * headers (tests/native/nccl_profiler_headers).  It asks for Coll, P2p and
 * ProxyOp events (with Group up to v4, CollApi from v5, KernelCh from v3),
 * counts what it receives and checks that every parent, handle and context
 * NCCL's calls carry is one it gave out; at each finalize it appends one JSON
 * line of its counts to $COUNTING_PROFILER_OUT. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "err.h"
#include "profiler.h"

#define EVENTS 65536
#define TYPES 15

typedef struct event {
    int type;
} event;

static event g_events[EVENTS];
static _Atomic int g_next;
static int g_context; /* the context it gives every communicator */
static _Atomic long g_inits, g_finalizes, g_starts[TYPES], g_stops, g_kernel_stops, g_foreign, g_bad_handles,
    g_bad_contexts;

static int own(void *handle) { return handle >= (void *)g_events && handle < (void *)(g_events + EVENTS); }

static int type_index(uint64_t type)
{
    for (int i = 0; i < TYPES; i++)
        if (type == (1ull << i)) return i;
    return -1;
}

static ncclResult_t start_event(void *context, void **handle, void *descr)
{
    *handle = NULL;
    if (context != &g_context) atomic_fetch_add(&g_bad_contexts, 1);
#if CHAIN_VERSION >= 5
    ncclProfilerEventDescr_v5_t *d = descr;
#else
    ncclProfilerEventDescr_v4_t *d = descr; /* v1-v4 share the head */
#endif
    int i = type_index(d->type);
    if (i < 0) return ncclSuccess;
    atomic_fetch_add(&g_starts[i], 1);
    /* ProxyOp and KernelCh under a Coll/P2p; Coll/P2p under a Group (to v4) or CollApi/P2pApi (v5+): all its own */
    uint64_t child = ncclProfileProxyOp | ncclProfileKernelCh | ncclProfileColl | ncclProfileP2p;
    if ((d->type & child) && !own(d->parentObj)) atomic_fetch_add(&g_foreign, 1);
    int n = atomic_fetch_add(&g_next, 1);
    event *e = &g_events[n % EVENTS];
    e->type = (int)d->type;
    *handle = e;
    return ncclSuccess;
}

static ncclResult_t stop_event(void *handle)
{
    if (!own(handle)) atomic_fetch_add(&g_bad_handles, 1);
    atomic_fetch_add(&g_stops, 1);
    return ncclSuccess;
}

static ncclResult_t record_state(void *handle, ncclProfilerEventState_t state, void *args)
{
    (void)args;
    if (!own(handle)) atomic_fetch_add(&g_bad_handles, 1);
    if (state == ncclProfilerKernelChStop) atomic_fetch_add(&g_kernel_stops, 1);
    return ncclSuccess;
}

static int wanted(void)
{
    int mask = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp;
    if (CHAIN_VERSION <= 4) mask |= ncclProfileGroup;
    if (CHAIN_VERSION >= 3) mask |= ncclProfileKernelCh;
    if (CHAIN_VERSION >= 5) mask |= ncclProfileCollApi;
    return mask;
}

static ncclResult_t finalize(void *context)
{
    if (context != &g_context) atomic_fetch_add(&g_bad_contexts, 1);
    atomic_fetch_add(&g_finalizes, 1);
    FILE *out = fopen(getenv("COUNTING_PROFILER_OUT"), "a");
    if (!out) return ncclSystemError;
    fprintf(out, "{\"inits\": %ld, \"finalizes\": %ld, \"stops\": %ld, \"kernel_stops\": %ld, \"foreign_parents\": %ld, "
                 "\"bad_handles\": %ld, \"bad_contexts\": %ld, \"starts\": {",
            g_inits, g_finalizes, g_stops, g_kernel_stops, g_foreign, g_bad_handles, g_bad_contexts);
    for (int i = 0; i < TYPES; i++) fprintf(out, "%s\"%d\": %ld", i ? ", " : "", 1 << i, atomic_load(&g_starts[i]));
    fprintf(out, "}}\n");
    fclose(out);
    return ncclSuccess;
}

#if CHAIN_VERSION <= 3
static ncclResult_t init(void **context, int *mask)
#elif CHAIN_VERSION == 4
static ncclResult_t init(void **context, int *mask, const char *name, uint64_t hash, int nnodes, int nranks, int rank,
                         ncclDebugLogger_t log)
#else
static ncclResult_t init(void **context, uint64_t hash, int *mask, const char *name, int nnodes, int nranks, int rank,
                         ncclDebugLogger_t log)
#endif
{
#if CHAIN_VERSION >= 4
    (void)name, (void)hash, (void)nnodes, (void)nranks, (void)rank, (void)log;
#endif
    atomic_fetch_add(&g_inits, 1);
    *context = &g_context;
    *mask = wanted();
    return ncclSuccess;
}

#define TABLE(v) ncclProfiler_v##v
#define TABLE_TYPE(v) ncclProfiler_v##v##_t
#define EXPORT(v) __attribute__((visibility("default"))) TABLE_TYPE(v) TABLE(v)
#define EXPORTED(v) EXPORT(v)
EXPORTED(CHAIN_VERSION) = {"counting", init, (void *)start_event, stop_event, (void *)record_state, finalize};
