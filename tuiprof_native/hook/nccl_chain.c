/* The NCCL profiler plugin this library chains to: the one NCCL_PROFILER_PLUGIN
 * named (NCCL's Inspector, Google's CoMMA, ...) before `tuiprof run` made this
 * library NCCL's plugin.  NCCL loads one profiler plugin only, so instead of
 * replacing the user's, this library loads it and passes NCCL's calls on:
 * each communicator's init (its context kept in ours), and every event the
 * plugin would have been offered had NCCL loaded it alone, with the parent
 * handles in the descriptor turned into its own (nccl_plugin.c does that).
 *
 * Loaded once, at the first communicator's init: the name is taken as NCCL
 * takes NCCL_PROFILER_PLUGIN (a path or library name for dlopen; else also
 * libnccl-profiler-<name>.so), its ncclProfiler_v<N> in the version NCCL
 * speaks to this library, or v5 under a v6 NCCL.  What became of it is one
 * line on stderr, and tp_chain_status for the hook's health. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hook_internal.h"
#include "nccl_profiler.h"

#define CHAINED_PLUGIN_ENV "TUIPROF_NCCL_CHAINED_PLUGIN"
#define STATUS_MAX 512

static pthread_mutex_t g_load_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_loaded;           /* under g_load_lock; then read only */
static int g_chained_version;  /* 0: nothing to chain to */
static const void *g_table;    /* its ncclProfiler_v<g_chained_version> */
static int (*g_start)(void *, void **, void *);
static int (*g_stop)(void *);
static int (*g_record)(void *, int, void *);
static int (*g_finalize)(void *);
static char g_status[STATUS_MAX]; /* written once, under g_load_lock */
static _Atomic int g_init_failures, g_last_init_error;

/* dlopen the plugin as NCCL does (plugin_open.cc): the name as given, then,
 * for a bare name (no '/', not lib*.so), libnccl-profiler-<name>.so. */
static void *open_like_nccl(const char *name, char *error, size_t cap)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
    tp_copy_name(error, cap, dlerror());
    size_t n = strlen(name);
    int library_name = strncmp(name, "lib", 3) == 0 && n >= 3 && strcmp(name + n - 3, ".so") == 0;
    if (strchr(name, '/') || library_name) return NULL;
    char prefixed[256];
    if (snprintf(prefixed, sizeof(prefixed), "libnccl-profiler-%s.so", name) >= (int)sizeof(prefixed)) return NULL;
    lib = dlopen(prefixed, RTLD_NOW | RTLD_LOCAL);
    if (!lib) tp_copy_name(error, cap, dlerror());
    return lib;
}

/* Its table in `version`, or v5 under a v6 NCCL; sets g_chained_version. */
static const void *find_table(void *lib, int version)
{
    char symbol[32];
    snprintf(symbol, sizeof(symbol), "ncclProfiler_v%d", version);
    const void *table = dlsym(lib, symbol);
    if (table) {
        g_chained_version = version;
    } else if (version == 6 && (table = dlsym(lib, "ncclProfiler_v5"))) {
        g_chained_version = 5;
    }
    return table;
}

static void take_calls(void)
{
    if (g_chained_version <= 3) {
        const nccl_profiler_v1 *t = g_table;
        g_start = t->start_event, g_stop = t->stop_event, g_record = t->record_state, g_finalize = t->finalize;
    } else if (g_chained_version == 4) {
        const nccl_profiler_v4 *t = g_table;
        g_start = t->start_event, g_stop = t->stop_event, g_record = t->record_state, g_finalize = t->finalize;
    } else {
        const nccl_profiler_v5 *t = g_table;
        g_start = t->start_event, g_stop = t->stop_event, g_record = t->record_state, g_finalize = t->finalize;
    }
}

static void load(int version)
{
    const char *name = getenv(CHAINED_PLUGIN_ENV);
    if (!name || !name[0]) return;
    char error[256] = "";
    void *lib = open_like_nccl(name, error, sizeof(error));
    if (!lib) {
        snprintf(g_status, sizeof(g_status), "not chained to %s: it could not be loaded (%s)", name, error);
        return;
    }
    const void *table = find_table(lib, version);
    Dl_info self, found;
    if (!table) {
        snprintf(g_status, sizeof(g_status), "not chained to %s: it has no ncclProfiler_v%d, the version NCCL speaks here",
                 name, version);
    } else if (dladdr((void *)tp_chain_status, &self) && dladdr(table, &found) && self.dli_fbase == found.dli_fbase) {
        snprintf(g_status, sizeof(g_status), "not chained to %s: it is this library", name);
    } else {
        g_table = table;
        take_calls();
        snprintf(g_status, sizeof(g_status), "chains to %s (ncclProfiler_v%d)",
                 dladdr(table, &found) && found.dli_fname ? found.dli_fname : name, g_chained_version);
        fprintf(stderr, "tuiprof: NCCL profiler plugin %s\n", g_status);
        return;
    }
    g_chained_version = 0;
    dlclose(lib);
    fprintf(stderr, "tuiprof: NCCL profiler plugin %s\n", g_status);
}

int tp_chain_init(int version, const tp_comm_args *a, void **context, int *mask)
{
    *context = NULL;
    *mask = 0;
    pthread_mutex_lock(&g_load_lock);
    if (!g_loaded) load(version);
    g_loaded = 1;
    pthread_mutex_unlock(&g_load_lock);
    if (!g_table) return 0;
    int status;
    if (g_chained_version <= 3) {
        status = ((const nccl_profiler_v1 *)g_table)->init(context, mask);
    } else if (g_chained_version == 4) {
        status = ((const nccl_profiler_v4 *)g_table)->init(context, mask, a->name, a->hash, a->nnodes, a->nranks,
                                                           a->rank, a->log);
    } else {
        status = ((const nccl_profiler_v5 *)g_table)->init(context, a->hash, mask, a->name, a->nnodes, a->nranks,
                                                           a->rank, a->log);
    }
    if (status != NCCL_SUCCESS) { /* NCCL would have run this communicator without it */
        atomic_fetch_add(&g_init_failures, 1);
        atomic_store(&g_last_init_error, status);
        *context = NULL;
        *mask = 0;
        return 0;
    }
    if (g_chained_version < version) *mask &= ~(PROFILE_CE_COLL | PROFILE_CE_SYNC | PROFILE_CE_BATCH);
    return 1;
}

/* The event types NCCL checks before it offers one (an event is offered when
 * the plugin asks for it or for an event that has it as an ancestor). */
static uint32_t with_descendants(uint32_t type)
{
    const uint32_t below_task = PROFILE_PROXY_OP | PROFILE_PROXY_STEP | PROFILE_KERNEL_CH | PROFILE_NET_PLUGIN;
    const uint32_t ce = PROFILE_CE_COLL | PROFILE_CE_SYNC | PROFILE_CE_BATCH;
    switch (type) {
    case PROFILE_GROUP_API: return ~0u;
    case PROFILE_COLL_API: return type | PROFILE_COLL | below_task | ce;
    case PROFILE_P2P_API: return type | PROFILE_P2P | below_task;
    case PROFILE_GROUP: return type | PROFILE_COLL | PROFILE_P2P | below_task;
    case PROFILE_COLL:
    case PROFILE_P2P: return type | below_task;
    case PROFILE_PROXY_OP: return type | PROFILE_PROXY_STEP | PROFILE_NET_PLUGIN;
    case PROFILE_PROXY_STEP: return type | PROFILE_NET_PLUGIN;
    case PROFILE_CE_COLL: return ce;
    default: return type;
    }
}

int tp_chain_wants(int mask, uint32_t type) { return (with_descendants(type) & (uint32_t)mask) != 0; }

void *tp_chain_start(void *context, void *descr)
{
    void *handle = NULL;
    g_start(context, &handle, descr);
    return handle;
}

void tp_chain_stop(void *handle) { g_stop(handle); }

void tp_chain_record(void *handle, int state, void *args) { g_record(handle, state, args); }

void tp_chain_finalize(void *context) { g_finalize(context); }

int tp_chain_init_failures(void) { return atomic_load(&g_init_failures); }

void tp_chain_status(char *buf, size_t cap)
{
    char full[STATUS_MAX + 128];
    pthread_mutex_lock(&g_load_lock);
    int failures = atomic_load(&g_init_failures);
    if (failures && g_table) {
        snprintf(full, sizeof(full), "%s; its init failed (error %d) for %d communicator%s, whose events it does not see",
                 g_status, atomic_load(&g_last_init_error), failures, failures == 1 ? "" : "s");
    } else {
        snprintf(full, sizeof(full), "%s", g_status);
    }
    pthread_mutex_unlock(&g_load_lock);
    size_t len = strlen(full);
    if (cap == 0) return;
    if (len < cap) {
        memcpy(buf, full, len + 1);
        return;
    }
    /* Too long (the segment header's field): the middle of the path goes, the verdict at the end stays. */
    size_t head = (cap - 4) / 3, tail = cap - 4 - head;
    memcpy(buf, full, head);
    memcpy(buf + head, "...", 3);
    memcpy(buf + head + 3, full + len - tail, tail + 1);
}
