/*
 * NCCL's profiler plugin API as this library speaks it (our own declarations
 * of NCCL's ABI, written from NCCL's ext-profiler headers; checked against
 * them by tests/native/test_nccl_profiler_versions.py), and the plugin this
 * library chains to (nccl_chain.c).  Private to nccl_plugin.c and nccl_chain.c.
 *
 * Versions and the NCCL releases that speak them: v1 2.23, v2 2.24-2.25,
 * v3 2.26, v4 2.27, v5 2.28, v6 2.29-2.30.  NCCL looks up ncclProfiler_v<N>
 * from the highest N it knows down and takes the first it finds.
 */
#ifndef TUIPROF_NCCL_PROFILER_H
#define TUIPROF_NCCL_PROFILER_H

#include <stddef.h>
#include <stdint.h>

#define NCCL_SUCCESS 0
#define NCCL_PROFILER_NEWEST 6

/* Event types (a descriptor's type, and the bits of the activation mask). */
enum {
    PROFILE_GROUP = 1 << 0,
    PROFILE_COLL = 1 << 1,
    PROFILE_P2P = 1 << 2,
    PROFILE_PROXY_OP = 1 << 3,
    PROFILE_PROXY_STEP = 1 << 4,
    PROFILE_PROXY_CTRL = 1 << 5,
    PROFILE_KERNEL_CH = 1 << 6,    /* v3+ */
    PROFILE_NET_PLUGIN = 1 << 7,   /* v3+ */
    PROFILE_GROUP_API = 1 << 8,    /* v5+ */
    PROFILE_COLL_API = 1 << 9,     /* v5+ */
    PROFILE_P2P_API = 1 << 10,     /* v5+ */
    PROFILE_KERNEL_LAUNCH = 1 << 11, /* v5+ */
    PROFILE_CE_COLL = 1 << 12,     /* v6: a collective run by copy engines */
    PROFILE_CE_SYNC = 1 << 13,     /* v6 */
    PROFILE_CE_BATCH = 1 << 14,    /* v6 */
};

/* recordEventState: a kernel channel finished; its args hold the GPU timer (v4+). */
#define STATE_KERNEL_CH_STOP 22

typedef void (*nccl_logger_fn)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);

/* The function tables, by the shape of their init (the other members agree in every version). */
typedef struct nccl_profiler_v1 { /* v1, v2, v3 */
    const char *name;
    int (*init)(void **context, int *mask);
    int (*start_event)(void *context, void **handle, void *descr);
    int (*stop_event)(void *handle);
    int (*record_state)(void *handle, int state, void *args);
    int (*finalize)(void *context);
} nccl_profiler_v1;

typedef struct nccl_profiler_v4 {
    const char *name;
    int (*init)(void **context, int *mask, const char *comm_name, uint64_t comm_hash, int nnodes, int nranks, int rank,
                nccl_logger_fn log);
    int (*start_event)(void *context, void **handle, void *descr);
    int (*stop_event)(void *handle);
    int (*record_state)(void *handle, int state, void *args);
    int (*finalize)(void *context);
} nccl_profiler_v4;

typedef struct nccl_profiler_v5 { /* v5, v6 */
    const char *name;
    int (*init)(void **context, uint64_t comm_id, int *mask, const char *comm_name, int nnodes, int nranks, int rank,
                nccl_logger_fn log);
    int (*start_event)(void *context, void **handle, void *descr);
    int (*stop_event)(void *handle);
    int (*record_state)(void *handle, int state, void *args);
    int (*finalize)(void *context);
} nccl_profiler_v5;

/* Every version's descriptor starts with its type (one byte up to v4, eight
 * from v5) and the parent event's handle at offset 8. */
typedef struct nccl_descr_head {
    uint64_t type_bytes;
    void *parent;
} nccl_descr_head;

/* ---- the chained plugin (nccl_chain.c) --------------------------------- */
/* The profiler plugin NCCL_PROFILER_PLUGIN named before `tuiprof run` put
 * this library there (it moves that name to TUIPROF_NCCL_CHAINED_PLUGIN).
 * Loaded at the first communicator's init, named and found as NCCL finds a
 * plugin, and spoken to in the version NCCL speaks to this library; for a v6
 * NCCL, v5 when it has no v6 (every v5 event is laid out alike in v6; copy
 * engine events are not passed on, as NCCL itself does). */
typedef struct tp_comm_args {
    uint64_t hash;   /* v4+ */
    const char *name;
    int nnodes, nranks, rank;
    nccl_logger_fn log;
} tp_comm_args;

/* The chained plugin's context for one communicator and the events it asks
 * for: 1, or 0 when none is named, it could not be loaded, or its init
 * failed (then NCCL's events for this communicator do not reach it). */
int tp_chain_init(int version, const tp_comm_args *args, void **context, int *mask);
/* Whether NCCL, with the chained plugin alone, would offer it this event:
 * the event's type or one of its descendants' is in the plugin's mask. */
int tp_chain_wants(int mask, uint32_t type);
/* Calls into the chained plugin with its own context and handles. */
void *tp_chain_start(void *context, void *descr);
void tp_chain_stop(void *handle);
void tp_chain_record(void *handle, int state, void *args);
void tp_chain_finalize(void *context);
/* tp_chain_status (what became of the plugin named to chain to) is in
 * hook_internal.h: the writer copies it into the segment's header. */

#endif
