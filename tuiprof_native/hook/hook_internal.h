/*
 * Internal interfaces of libtuiprof_hook.so (not installed, not a contract).
 *
 * Threads: application threads (GEMM hooks, NCCL API thread, Python) and
 * NCCL's proxy thread only *produce*: they push fixed-size records into
 * lock-free bounded queues and never block.  One background writer thread
 * consumes them, polls CUDA events and is the only writer of the segment.
 */
#ifndef TUIPROF_HOOK_INTERNAL_H
#define TUIPROF_HOOK_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "tuiprof_segment.h"

#define TP_EXPORT __attribute__((visibility("default")))
#define TP_LIKELY(x) __builtin_expect(!!(x), 1)
#define TP_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define TP_PATH_MAX 128   /* TP_SEGMENT_DIR/tuiprof-<uid>-<pid>-<random><suffix> */
#define TP_REASON_MAX 256 /* why the hook stays inert, one line */

/* ---- small helpers (util.c) -------------------------------------------- */
uint64_t tp_now_ns(void);  /* CLOCK_REALTIME */
void tp_copy_name(char *dst, size_t cap, const char *src);

/* ---- this process's files in TP_SEGMENT_DIR (shm_files.c) -------------- */
/* Draw this process's stem, tuiprof-<uid>-<pid>-<16 random hex digits>: 0,
 * or -1 with `why` when the kernel gives no random bytes (never blocks). */
int tp_new_stem(char *why, size_t cap);
/* This process's files are no longer its own (a fork child's stem is the parent's). */
void tp_forget_stem(void);
/* TP_SEGMENT_DIR/<stem><suffix>: the one place that builds it.  0, or -1
 * when there is no stem or it does not fit in cap. */
int tp_segment_path(char *buf, size_t cap, const char *suffix);
/* Create the segment's side files empty (<stem>.exception, <stem>.flight),
 * right after the segment made the stem visible, so no one else takes them. */
void tp_claim_sidecars(void);
/* Remove the segment and the side files this process created. */
void tp_remove_files(void);
/* printf into `why`, then " (strerror(err))" unless err is 0. */
void tp_reason(char *why, size_t cap, int err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The hook could not start: one line on stderr, and the reason in a
 * <stem>.inert note for the agent. */
void tp_report_inert(const char *reason);

/* ---- lifecycle (worker.c) ---------------------------------------------- */
/* Lazy start: creates the segment and the writer thread on first use.
 * Returns 1 when the hook is recording, 0 when inert (disabled, shared
 * memory full, a file in the way, still starting in another thread). Never
 * blocks. */
int tp_ensure_started(void);
int tp_is_running(void);
void tp_set_flag(uint32_t flag);
uint32_t tp_flags(void);

/* ---- bounded lock-free queue (queue.c) --------------------------------- */
typedef struct tp_queue tp_queue;
tp_queue *tp_queue_create(uint32_t capacity_pow2, uint32_t elem_size);
void tp_queue_free(tp_queue *q);
void tp_queue_reset(tp_queue *q);          /* fork child only: no other thread exists */
int tp_queue_push(tp_queue *q, const void *elem);  /* 0 when full */
int tp_queue_pop(tp_queue *q, void *elem);         /* 0 when empty */
int tp_queue_empty(tp_queue *q);                   /* a hint: nothing pushed and not yet popped */

/* ---- records produced by hooks, consumed by the writer ----------------- */
enum tp_record_type {
    TP_REC_GEMM_LAUNCH = 1, /* timed GEMM launched: timer index, stream */
    TP_REC_GEMM_UNTIMED,    /* GEMM due for timing, counted without (no event, no CUDA) */
    TP_REC_NCCL_START,      /* collective enqueued (in-flight) */
    TP_REC_NCCL_DONE,       /* collective finished */
    TP_REC_STEP,
    TP_REC_GC,
    TP_REC_DATALOADER,
    TP_REC_NCCL_SPAN,       /* NCCL API fallback: an event pair to poll (timer = span index) */
    TP_REC_COPY_LAUNCH,     /* timed cudaMemcpy(Async) launched: timer index, stream, bytes, weight */
};

typedef struct tp_record {
    uint32_t type;
    uint32_t timer;          /* GEMM: event-pair index */
    char op[TP_NAME_LEN];
    char dtype[TP_DTYPE_LEN];
    char algo[TP_ALGO_LEN];
    char proto[TP_PROTO_LEN];
    int64_t b, m, n, k;
    uint64_t stream;         /* GEMM stream / NCCL communicator hash */
    uint64_t op_seq;
    uint64_t bytes, flops;
    uint64_t launched_ns;
    uint64_t start_ns, end_ns;  /* realtime; end 0 when untimed */
    uint64_t dur_ns;            /* UINT64_MAX when untimed */
    uint32_t nranks;
    int32_t rank;
    uint32_t token;          /* NCCL op index, pairs START with DONE */
    uint32_t first_call;     /* GEMM: TP_FIRST_CALL_* (the launching thread's view) */
    uint32_t weight;         /* GEMM, due for timing: the calls it stands for (tp_gemm_timing_weight);
                              * copy: likewise (memory_hooks.c) */
    uint32_t copy_direction; /* copy: enum tp_copy_direction */
    uint32_t period;         /* ... and its period then (0: one of its shape's first calls) */
    void *shape;             /* ... its launching thread's tp_shape (NULL: none), */
    uint64_t shape_key;      /* ... while it still holds this key (tables are reused) */
} tp_record;

/* Whether a GEMM record is its shape's first call, as its launching thread
 * knows it: a slot's first call is taken from the first record so marked
 * (the writer folds calls as they finish, and counts of calls sampled out
 * may reach a slot before its first call finished). */
enum { TP_FIRST_CALL_NO = 0, TP_FIRST_CALL_YES = 1, TP_FIRST_CALL_UNKNOWN = 2 /* no shape entry: the slot's first record */ };

void tp_submit(const tp_record *r);  /* counts a drop when the queue is full */
void tp_count_drop(void);

/* ---- symbol resolution (resolve.c) ------------------------------------- */
/* The first definition of `name` in a loaded object other than this library
 * (RTLD_NEXT misses libraries PyTorch loads into a local scope). */
void *tp_resolve(const char *name);

/* tp_resolve(name) as a `type`, looked up on first use and kept in a static
 * of this expansion (a benign race: every thread finds the same address).
 * NULL while no loaded object defines it; then looked up again next time. */
#define TP_REAL(type, name)                                                              \
    __extension__({                                                                      \
        static _Atomic(void *) tp_real_cache_;                                           \
        void *tp_real_ = atomic_load_explicit(&tp_real_cache_, memory_order_relaxed);    \
        if (TP_UNLIKELY(!tp_real_)) {                                                    \
            tp_real_ = tp_resolve(name);                                                 \
            atomic_store_explicit(&tp_real_cache_, tp_real_, memory_order_relaxed);      \
        }                                                                                \
        (type)tp_real_;                                                                  \
    })

/* ---- CUDA event timing (cuda_timer.c) ---------------------------------- */
int tp_timer_acquire(void *stream, uint32_t *timer);    /* records start; 0: untimed */
void tp_timer_stop(uint32_t timer, void *stream);       /* records stop */
void tp_timer_abandon(uint32_t timer);
/* writer side */
typedef struct tp_gpu_span {
    uint64_t dur_ns;              /* elapsed(start event -> stop event) */
    uint64_t start_ns, end_ns;    /* CLOCK_REALTIME from the device's anchor; 0 when it has none */
} tp_gpu_span;
/* 1 done, 0 pending, -1 failed; `launched_ns`: when the start event was recorded */
int tp_timer_poll(uint32_t timer, uint64_t launched_ns, tp_gpu_span *span);
void tp_timer_release(uint32_t timer);
void tp_timer_fork_child(void);

/* ---- which GEMM calls are timed (gemm_sampling.c) --------------------- */
/* The first TP_GEMM_TIMED_FIRST calls of each shape are timed, then one in a
 * period: by default chosen per shape from its mean kernel time, from
 * TP_GEMM_SAMPLE_EVERY_DEFAULT up to TP_GEMM_SAMPLE_EVERY_ADAPTIVE_MAX; fixed
 * by TUIPROF_GEMM_SAMPLE_EVERY (read once, when the hook starts). */
#define TP_GEMM_TIMED_FIRST 32u
#define TP_GEMM_SAMPLE_EVERY_DEFAULT 16u
#define TP_GEMM_SAMPLE_EVERY_ADAPTIVE_MAX 1024u
#define TP_GEMM_SAMPLE_EVERY_MAX 1000000u
typedef struct tp_shape tp_shape;
void tp_gemm_sampling_init(void);
uint32_t tp_gemm_sample_every(void); /* the fixed period, or the adaptive one's shortest */
uint32_t tp_gemm_sample_max(void);   /* 0: fixed; else the adaptive period's longest */
/* The calling thread's entry for a shape; NULL when it has none (time every call). */
tp_shape *tp_gemm_shape(const char *op, int dtype, int64_t b, int64_t m, int64_t n, int64_t k);
/* Before the call: 0 to only count it; else it is due for timing, standing
 * for this many calls (itself and those that ran since its shape's last
 * timed call), and `period` says by which rule (0: one of the first calls). */
uint32_t tp_gemm_timing_weight(tp_shape *e, uint32_t *period);
uint32_t tp_gemm_first_call(const tp_shape *e); /* TP_FIRST_CALL_* of the call just counted */
enum tp_gemm_outcome { TP_GEMM_COUNTED, TP_GEMM_TIMED, TP_GEMM_DUE_UNTIMED /* no event, capture, no context */ };
/* After the call succeeded (a failed call ran nothing: not reported). */
void tp_gemm_ran(tp_shape *e, enum tp_gemm_outcome how);
uint64_t tp_gemm_shape_key(const tp_shape *e);
/* writer: a timed call's duration (the record of one due call of `shape`) */
void tp_gemm_timing_done(const tp_record *r);
int tp_gemm_harvest_counted(void);        /* writer: fold new counts into slots; 1 if any */
void tp_gemm_sampling_fork_child(void);

/* ---- GEMM calls (gemm_hooks.c) ----------------------------------------- */
typedef struct tp_gemm_call {
    int active, due, timed;
    tp_shape *shape; /* the calling thread's entry for it; NULL: none */
    uint32_t timer;
    void *stream;
    tp_record rec;
} tp_gemm_call;
/* Around the real call (only once tp_ensure_started() said yes): begin
 * says whether the call is due for timing (and what it stands for); if so,
 * tp_gemm_time takes the event pair on the call's stream; end tells the
 * shape how the call went and hands a due one to the writer (a failed call
 * is not an op).  A call with active = 0 is inert. */
int tp_gemm_begin(tp_gemm_call *c, const char *op, int dtype, int64_t b, int64_t m, int64_t n, int64_t k);
void tp_gemm_time(tp_gemm_call *c, void *stream);
void tp_gemm_end(tp_gemm_call *c, int status);
/* A zeroed record with the shape's op, dtype name, b, m, n, k and FLOPs. */
void tp_gemm_shape_record(tp_record *r, const char *op, int dtype, int64_t b, int64_t m, int64_t n, int64_t k);
const char *tp_cuda_dtype_name(int t, char *buf, size_t cap);

/* ---- device memory (memory_hooks.c) ------------------------------------ */
/* writer side: a timed copy finished (its record), or could not be timed */
void tp_memory_copy_timed(const tp_record *r, uint64_t dur_ns);
void tp_memory_copy_untimed(const tp_record *r);
/* PyTorch's caching allocator as the startup hook read it (tuiprof_record_allocator): enum
 * tp_allocator_state, then allocated, reserved, peak allocated bytes, alloc retries, OOMs. */
void tp_memory_allocator(uint32_t state, uint64_t read_ns, const uint64_t figures[5]);
void tp_memory_publish(void); /* writer: the counts into the segment, when they changed */
void tp_memory_fork_child(void);

/* ---- NCCL plugin (nccl_plugin.c; its ABI and the chained plugin: nccl_profiler.h) */
/* ncclDataType_t in its order: NCCL's name ("ncclFloat32"), ours ("fp32"), the element size. */
typedef struct tp_nccl_dtype {
    const char *nccl_name, *name;
    uint64_t size;
} tp_nccl_dtype;
#define TP_NCCL_DTYPES 12
extern const tp_nccl_dtype tp_nccl_dtypes[TP_NCCL_DTYPES];
/* Finish collectives whose channels all stopped but fewer than announced
 * reported (called by the writer every few ms). */
void tp_nccl_sweep(uint64_t now_ns);
/* Channel-accounting anomalies so far (shortfall: finished by the sweep). */
void tp_nccl_anomalies(uint64_t *shortfall, uint64_t *late);
uint32_t tp_nccl_profiler_api(void);                  /* ncclProfiler_vN NCCL took; 0: none yet */
/* nccl_chain.c: what became of the plugin named to chain to, one line: "" when none was named;
 * "chains to <path> (ncclProfiler_v<N>)"; or why it is not chained. */
void tp_chain_status(char *buf, size_t cap);  /* too long for cap: the middle elided with "..." */
int tp_chain_init_failures(void);             /* communicators whose init the chained plugin failed */
void tp_nccl_fork_child(void);

/* ---- segment writer (segment_writer.c; writer thread only) ------------- */
/* Create, reserve and map this process's segment: 0, or -1 with `why` (and
 * nothing left behind). */
int tp_segment_create(char *why, size_t cap);
void tp_segment_detach(void);  /* fork child: forget the parent's mapping and names */
void tp_segment_remove(void);  /* unmap and unlink (the writer could not start) */
tp_segment *tp_segment_get(void);
void tp_segment_fold(const tp_record *r, uint32_t kind);  /* slot + ring */
void tp_segment_count(const tp_record *r, uint32_t kind, uint64_t calls); /* slot count only (GEMMs sampled out) */
void tp_segment_event(const tp_record *r, uint32_t kind); /* ring only */
void tp_counters_begin(void);
void tp_counters_end(void);
void tp_segment_heartbeat(void);

/* ---- how the process ends (exit_notes.c) ------------------------------- */
/* Exit status and fatal signal into the segment header; once per address space. */
void tp_exit_notes_install(void);

/* ---- NCCL API fallback (nccl_fallback.c) ------------------------------- */
/* Interposers on the NCCL collective / p2p / group entry points, recording
 * ops only while NCCL has not accepted the profiler plugin.  Their in-flight
 * tokens follow the plugin's (0..4095). */
#define TP_NCCL_FALLBACK_TOKEN0 4096u
#define TP_NCCL_FALLBACK_OPS 4095u
#define TP_NCCL_UNTRACKED_TOKEN (TP_NCCL_FALLBACK_TOKEN0 + TP_NCCL_FALLBACK_OPS) /* a counted op's DONE */
#define TP_NCCL_TOKENS (TP_NCCL_UNTRACKED_TOKEN + 1u)
/* The size ncclCommInitRank[Config] was given for the communicator NCCL
 * hashes to `hash` (profiler API v1-v3 name no communicator at init); 0 when
 * no such init was seen (ncclCommSplit, ncclCommInitAll). */
uint32_t tp_nccl_comm_size(uint64_t hash);
/* writer side: a TP_REC_NCCL_SPAN record's span, then polled each pass */
void tp_nccl_fallback_track(uint32_t span);
int tp_nccl_fallback_poll(void); /* spans finished (their ops' DONE records submitted) */
void tp_nccl_fallback_fork_child(void);

#endif
