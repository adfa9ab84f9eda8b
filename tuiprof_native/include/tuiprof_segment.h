/*
 * tuiprof_segment.h — THE layout of a rank's telemetry segment,
 * /dev/shm/tuiprof-<uid>-<pid>-<random>.  The writer (libtuiprof_hook.so) and the
 * reader (tuiprof_native.segment) both compile against this file; nothing
 * else may describe the layout.
 *
 * Concurrency: exactly one thread (the hook's background writer thread)
 * writes a segment.  Readers map it read-only and never block the writer.
 * Every mutable record carries a sequence counter (seqlock): the writer makes
 * it odd, writes the record, makes it even again.  A reader copies the record
 * and accepts the copy only if the counter was even and unchanged across the
 * copy; otherwise it retries.  The header's `magic` is written last, so a
 * reader that sees the magic sees a fully initialised segment.
 *
 * Units: times are nanoseconds; absolute times are CLOCK_REALTIME ns.
 * Fixed sizes throughout; the event ring overwrites its oldest entry.
 * Bump TP_LAYOUT_VERSION on any change to a struct below.
 */
#ifndef TUIPROF_SEGMENT_H
#define TUIPROF_SEGMENT_H

#include <stdint.h>

#define TP_MAGIC 0x3146525049555454ULL /* "TTUIPRF1" little-endian */
#define TP_LAYOUT_VERSION 10u
/* Layout 9 is layout 10 without tp_header.data_seq (its bytes were reserved, zero): a
 * reader takes it as a segment whose changes it cannot tell, read in full every time. */
#define TP_LAYOUT_VERSION_NO_DATA_SEQ 9u

#define TP_SEGMENT_DIR "/dev/shm"
/* TP_SEGMENT_DIR/tuiprof-<uid>-<pid>-<random>, the "stem": <random> is 16
 * lowercase hex digits from getrandom, drawn per process, so that no other
 * user can take the name ahead of it (readers find segments by listing the
 * directory and check every claim against the kernel). */
#define TP_SEGMENT_PREFIX "tuiprof-"
#define TP_STEM_RANDOM_DIGITS 16
/* Beside the segment, created empty with it by the hook (so that no one who
 * sees the segment's name can take theirs), written whole and replaced
 * atomically by the Python startup hook, removed together with the segment by
 * the agent:
 *   /dev/shm/<stem>.exception  the last uncaught exception (text)
 *   /dev/shm/<stem>.flight     PyTorch Flight Recorder progress (JSON) */
#define TP_EXCEPTION_SUFFIX ".exception"
#define TP_FLIGHT_SUFFIX ".flight"
/* Written by the hook instead of a segment when it has to stay inert (shared
 * memory full, ...), under a stem of its own, created O_EXCL|O_NOFOLLOW, mode 0600: one
 * line saying why, ending in '\n' -- or empty when not even one page of
 * shared memory was left for the line (statvfs of the directory tells why).
 * Read and removed by the agent once the process is gone. */
#define TP_INERT_SUFFIX ".inert"

#define TP_MAX_SLOTS 512u      /* aggregate slots; the last one collects overflow */
#define TP_MAX_INFLIGHT 128u   /* one entry per stream / communicator with unfinished work */
#define TP_RING_CAPACITY 8192u /* last N events */
#define TP_NCCL_CHAIN_LEN 96u
#define TP_HIST_BUCKETS 40u    /* bucket i counts latencies in [2^i, 2^(i+1)) ns; 0 also holds 0 ns */
/* Each slot's fine window: TP_FINE_OCTAVES consecutive octaves [2^a, 2^(a+TP_FINE_OCTAVES)) ns,
 * a = the slot's fine_octave, each cut into 2^TP_FINE_SUB_BITS equal sub-buckets.  A sub-bucket
 * of octave e is 2^(e - TP_FINE_SUB_BITS) ns wide: at most 1/64 of any value in it, so a
 * quantile that falls in the window is known to 1/64 (1.6 %), to 1/128 (0.8 %) from the
 * sub-bucket's middle.  One op kind and shape has latencies within a few octaves; the window
 * follows them (see tp_slot.fine_octave).  Values outside it are in the log2 buckets only. */
#define TP_FINE_OCTAVES 4u
#define TP_FINE_SUB_BITS 6u
#define TP_FINE_BUCKETS (TP_FINE_OCTAVES << TP_FINE_SUB_BITS)
#define TP_FINE_BLOCK 64u /* calls the writer judges its window over (tp_slot.fine_octave) */
#define TP_COPY_TIMED_FIRST 32u  /* copies of a direction all timed, then ... */
#define TP_COPY_SAMPLE_EVERY 16u /* ... one in this many (tp_copy_stats) */

#define TP_NAME_LEN 32u
#define TP_DTYPE_LEN 16u
#define TP_ALGO_LEN 16u
#define TP_PROTO_LEN 8u
#define TP_JOB_ID_LEN 64u
#define TP_HOSTNAME_LEN 64u

/* What a slot, in-flight entry or event is about. */
enum tp_kind {
    TP_KIND_NONE = 0,
    TP_KIND_GEMM = 1,
    TP_KIND_NCCL = 2,
    TP_KIND_STEP = 3,
    TP_KIND_GC = 4,
    TP_KIND_DATALOADER = 5,
    TP_KIND_MEMCPY = 6, /* in-flight only: a timed cudaMemcpy(Async) not yet finished on its stream */
};

/* Header flags. */
#define TP_FLAG_CUDA_TIMING 1u   /* CUDA events resolved: GEMMs are timed */
#define TP_FLAG_NCCL_PLUGIN 2u   /* NCCL loaded us as its profiler plugin */
#define TP_FLAG_NCCL_GPU_TIME 4u /* NCCL kernel-channel (GPU timer) events seen */
#define TP_FLAG_EXITED 8u        /* the process ran its exit handlers (exit(), return from main) */
#define TP_FLAG_EXIT_STATUS 16u  /* exit_status holds the status the process passed to exit() */
#define TP_FLAG_NCCL_API 32u     /* no profiler plugin: NCCL ops counted at the API (nccl_fallback.c) */
#define TP_FLAG_NCCL_API_EVENTS 64u /* ... and timed by CUDA events on the op's stream (stream time, not kernel time) */
/* The writer holds a shared flock(2) on the file for as long as its process lives (the kernel drops it
 * however the process ends): a segment with this flag that can be locked exclusively has no writer. */
#define TP_FLAG_LOCKED 128u

/* Event flags. */
#define TP_EVENT_FIRST_CALL 1u /* a GEMM slot's first call: includes lazy module loading, not kernel time */

/* Process-wide counters (steps, GC pauses, DataLoader waits, drops). */
typedef struct tp_counters {
    uint64_t seq;                 /* seqlock */
    uint64_t step_count;          /* optimizer steps finished */
    uint64_t step_time_total_ns;  /* sum of step-to-step intervals */
    uint64_t last_step_ns;        /* CLOCK_REALTIME of the last step */
    uint64_t last_step_time_ns;   /* the last step-to-step interval */
    uint64_t gc_count;            /* collections observed */
    uint64_t gc_pause_total_ns;
    uint64_t dataloader_count;    /* DataLoader next() calls observed */
    uint64_t dataloader_wait_total_ns;
    uint64_t gemm_untimed;        /* GEMMs due for timing but not timed (no event free, no CUDA,
                                   * graph capture, no current CUDA context); calls sampled out
                                   * are not counted here */
    uint64_t nccl_untimed;        /* collectives finished without GPU timestamps */
    uint64_t dropped_records;     /* records lost because an internal queue was full */
    uint64_t slot_overflow;       /* records folded into the overflow slot */
    uint64_t nccl_channel_shortfall; /* ops finished with fewer kernel channels than NCCL announced */
    uint64_t nccl_late_channels;  /* kernel-channel events for ops already finished (ignored) */
    uint64_t reserved[1];
} tp_counters;

typedef struct tp_header {
    uint64_t magic;               /* TP_MAGIC; written last */
    uint32_t layout_version;      /* TP_LAYOUT_VERSION */
    uint32_t header_size;         /* sizeof(tp_header) */
    uint64_t segment_size;        /* sizeof(tp_segment) */
    uint32_t slot_size, inflight_size, event_size, max_slots;
    uint32_t max_inflight, ring_capacity, hist_buckets, flags;
    int32_t pid;
    int32_t rank;                 /* -1 when the environment does not say */
    int32_t local_rank;
    int32_t world_size;
    char job_id[TP_JOB_ID_LEN];   /* SLURM_JOB_ID / TORCHELASTIC_RUN_ID / "" */
    char hostname[TP_HOSTNAME_LEN];
    uint64_t start_ns;            /* when the segment was created */
    uint64_t heartbeat_ns;        /* written by the writer thread every loop */
    uint64_t writer_seq;          /* bumped after every batch of writes */
    uint32_t slots_used;          /* slots[0 .. slots_used) are valid */
    /* Written by the dying thread, not the writer: the last fatal signal
     * (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM) the process
     * received, 0 for none; and, with TP_FLAG_EXIT_STATUS, the status it
     * passed to exit() (& 0xff, as its parent sees it). */
    int32_t fatal_signal;
    uint64_t ring_head;           /* events ever written; event i is ring[i % cap] */
    tp_counters counters;
    int32_t exit_status;
    /* GEMM timing sampling, set once at creation: every call of a GEMM shape
     * (per launching thread) is timed until gemm_timed_first calls, then one
     * call in a period: gemm_sample_every (1: every call) when
     * gemm_sample_max is 0; else chosen per shape from its mean kernel time,
     * from gemm_sample_every to gemm_sample_max (each slot's sample_every
     * says which).  The others are counted exactly (slot count, flops) but
     * not timed and not in the ring. */
    uint32_t gemm_timed_first;
    uint32_t gemm_sample_every;
    uint32_t gemm_sample_max;
    /* Bumped by the writer thread, after its writes, at the end of every pass that changed
     * anything a reader's figures come from: slots, counters, device memory, the in-flight
     * table, the event ring or the flags.  Heartbeats alone leave it as it is, so a reader
     * that finds it equal to what it was before its previous reading knows the rank did
     * nothing since (a change made by a pass still under way shows at that pass's end). */
    uint64_t data_seq;
    /* NCCL's profiler plugin API version NCCL initialised the hook with (0: none, yet or at all),
     * and, once it is set, what became of a plugin the user had named (nccl_chain.c): "chains to
     * <path> (ncclProfiler_vN)", "not chained to <path>: <why>", or "" when none was named.
     * Written by the writer thread: the text first, then the version. */
    uint32_t nccl_profiler_api;
    char nccl_chain[TP_NCCL_CHAIN_LEN];
    uint8_t reserved[4];
} tp_header;

/* Directions of a CUDA copy: cudaMemcpyKind's values, which index tp_device_memory.copies.
 * cudaMemcpyDefault (unified addressing: the driver tells the direction from the pointers) is
 * counted as such, not resolved: resolving it would cost two cudaPointerGetAttributes a copy. */
enum tp_copy_direction {
    TP_COPY_HOST_TO_HOST = 0,
    TP_COPY_HOST_TO_DEVICE = 1,
    TP_COPY_DEVICE_TO_HOST = 2,
    TP_COPY_DEVICE_TO_DEVICE = 3,
    TP_COPY_DEFAULT = 4,
    TP_COPY_DIRECTIONS = 5,
};

/* The copies of one direction (cudaMemcpy and cudaMemcpyAsync that succeeded). */
typedef struct tp_copy_stats {
    uint64_t calls;
    uint64_t bytes;
    /* Timed copies: the GPU time between CUDA events recorded on the copy's stream right
     * before and after it (the copy's own time on its stream, earlier work excluded), for
     * the first TP_COPY_TIMED_FIRST copies of the direction, then one in TP_COPY_SAMPLE_EVERY;
     * each weighted by the copies it stands for (1, then TP_COPY_SAMPLE_EVERY): all copies'
     * time is estimated as weighted_ns * calls / weighted_calls. */
    uint64_t timed_calls;
    uint64_t timed_ns;
    uint64_t weighted_calls;
    uint64_t weighted_ns;
    uint64_t untimed;             /* due for timing but not timed (no event free, no CUDA context,
                                   * graph capture, too many streams) */
} tp_copy_stats;

/* The allocations of one CUDA runtime allocator API (cudaMalloc/cudaFree, or the stream-ordered
 * cudaMallocAsync/cudaFreeAsync), calls that succeeded.  Freed bytes come from the hook's own
 * table of live allocations: a free of a pointer it did not see allocated (before the hook
 * started, or its table full) is counted in free_unknown and not in free_bytes. */
typedef struct tp_alloc_stats {
    uint64_t malloc_calls;
    uint64_t malloc_bytes;
    uint64_t free_calls;          /* frees of NULL (a no-op) are not counted */
    uint64_t free_bytes;
    uint64_t free_unknown;
} tp_alloc_stats;

/* What PyTorch's CUDA caching allocator says (torch.cuda.memory_stats() of the current device),
 * as the Python startup hook last published it (tuiprof_record_allocator). */
enum tp_allocator_state {
    TP_ALLOCATOR_NONE = 0,        /* never published: not a Python job, no torch, no step yet */
    TP_ALLOCATOR_READ = 1,        /* the figures below are PyTorch's */
    TP_ALLOCATOR_NO_CUDA = 2,     /* this torch has no CUDA (a CPU build) */
    TP_ALLOCATOR_UNINITIALIZED = 3, /* torch.cuda is not initialized in this process (yet) */
};

typedef struct tp_device_memory {
    uint64_t seq;                 /* seqlock */
    tp_alloc_stats malloc;        /* cudaMalloc / cudaFree */
    tp_alloc_stats malloc_async;  /* cudaMallocAsync / cudaFreeAsync */
    tp_copy_stats copies[TP_COPY_DIRECTIONS];
    uint32_t allocator_state;     /* enum tp_allocator_state */
    uint32_t reserved0;
    uint64_t allocator_read_ns;   /* CLOCK_REALTIME when the startup hook read them */
    uint64_t allocated_bytes;     /* allocated_bytes.all.current */
    uint64_t reserved_bytes;      /* reserved_bytes.all.current */
    uint64_t peak_allocated_bytes; /* allocated_bytes.all.peak */
    uint64_t alloc_retries;       /* num_alloc_retries: cudaMalloc failed, caches freed, retried */
    uint64_t ooms;                /* num_ooms: out-of-memory errors the allocator raised */
    uint64_t reserved[8];
} tp_device_memory;

/* Aggregate of one (kind, op, dtype, shape / communicator+algorithm) key. */
typedef struct tp_slot {
    uint64_t seq;                 /* seqlock */
    uint32_t kind;                /* enum tp_kind */
    uint32_t nranks;              /* NCCL communicator size */
    char op[TP_NAME_LEN];         /* "cublasGemmEx", "AllReduce", ... */
    char dtype[TP_DTYPE_LEN];     /* "bf16", "fp32", ... */
    char algo[TP_ALGO_LEN];       /* NCCL algorithm ("RING"), "" for GEMMs */
    char proto[TP_PROTO_LEN];     /* NCCL protocol ("LL", "SIMPLE") */
    int64_t b, m, n, k;           /* GEMM shape (exact); 0 in the overflow slot */
    uint64_t comm_hash;           /* NCCL communicator */
    uint64_t count;               /* calls */
    uint64_t timed_count;         /* calls with a measured duration */
    /* Over timed calls, except a GEMM slot's first call: it includes lazy module
     * loading (127 ms against 1.38 ms seen on an H100), so it is kept apart in
     * first_ns and out of total_ns, min/max, hist and timed_*. */
    uint64_t total_ns, min_ns, max_ns;
    /* timed_count right after the call that set min_ns / max_ns: a reader whose
     * previous reading's timed_count is lower knows that extreme fell in its
     * interval, so the interval's min / max is exact, not a histogram edge. */
    uint64_t min_at_timed, max_at_timed;
    uint64_t first_ns;            /* GEMM: the first call's duration when timed, else 0 */
    uint64_t bytes;               /* NCCL: nccl-tests "size" summed over calls */
    uint64_t flops;               /* GEMM: 2*b*m*n*k summed over calls */
    uint64_t timed_bytes;         /* bytes / flops of the timed calls only */
    uint64_t timed_flops;
    /* The same timed calls, each weighted by the calls it stands for: 1 while
     * every call of its shape is timed, then the calls its thread made of
     * that shape since its previous timed one (NCCL: always 1).  A Horvitz-Thompson estimate of all calls' figures: mean
     * latency = weighted_total_ns / weighted_timed_count, TFLOPS =
     * weighted_timed_flops / weighted_total_ns.  Without the weights the first
     * gemm_timed_first calls (all timed) would count as much as
     * gemm_sample_every later calls each.  hist, min/max and timed_count stay
     * per timed call. */
    uint64_t weighted_timed_count;
    uint64_t weighted_total_ns;
    uint64_t weighted_timed_bytes;
    uint64_t weighted_timed_flops;
    uint64_t hist[TP_HIST_BUCKETS];
    uint32_t sample_every;        /* GEMM: the period of its latest call due for timing past its shape's
                                   * first gemm_timed_first calls; 0 while there was none */
    /* The fine window's lowest octave a (>= TP_FINE_SUB_BITS), 0 before the slot's first
     * call into hist.  Set from that call (its octave - 1), then moved by the writer when
     * most of a block of TP_FINE_BLOCK calls fell outside it (to the octave - 1 of the call
     * that decided it); every move zeroes fine[] and bumps fine_anchors.  A reader takes
     * the difference of two readings' fine[] only when both have the same fine_anchors. */
    uint32_t fine_octave;
    uint32_t fine_anchors;
    uint32_t reserved0;
    /* The same timed calls as hist, those inside the window: fine[(e - a) << TP_FINE_SUB_BITS |
     * sub] counts values in octave e's sub-th sub-bucket.  32-bit counts that wrap: a
     * reader takes differences modulo 2^32 (fewer than 2^32 calls between two readings). */
    uint32_t fine[TP_FINE_BUCKETS];
} tp_slot;

/* Oldest unfinished work on one stream (GEMM) or communicator (NCCL). */
typedef struct tp_inflight {
    uint64_t seq;                 /* seqlock */
    uint32_t kind;                /* TP_KIND_NONE when the entry is free */
    uint32_t pending;             /* unfinished ops on this stream / communicator */
    char op[TP_NAME_LEN];
    uint64_t key;                 /* stream pointer or communicator hash */
    uint64_t op_seq;              /* NCCL sequence number; GEMM launch counter */
    uint64_t launched_ns;         /* CLOCK_REALTIME when the oldest op was launched */
} tp_inflight;

/* One finished GEMM, collective, step, GC pause or DataLoader wait. */
typedef struct tp_event {
    uint64_t seq;                 /* 2*i+1 while writing event i, 2*i+2 when done */
    uint32_t kind;
    int32_t rank;                 /* NCCL: rank in its communicator; else the global rank */
    char op[TP_NAME_LEN];
    char dtype[TP_DTYPE_LEN];
    /* CLOCK_REALTIME.  A timed GEMM's are placed from the GPU's own clock:
     * an anchor CUDA event paired with a CPU clock read, plus the elapsed
     * GPU time from the anchor to the call's start / stop event. */
    uint64_t start_ns, end_ns;
    uint64_t bytes;
    uint64_t flops;
    uint64_t op_seq;              /* NCCL sequence number */
    uint64_t comm_hash;
    int64_t b, m, n, k;
    uint32_t flags;               /* TP_EVENT_* */
    uint32_t reserved0;
    uint64_t stream;              /* GEMM: the CUDA stream it ran on (one timeline lane each) */
} tp_event;

typedef struct tp_segment {
    tp_header header;
    tp_device_memory device_memory;
    tp_slot slots[TP_MAX_SLOTS];
    tp_inflight inflight[TP_MAX_INFLIGHT];
    tp_event ring[TP_RING_CAPACITY];
} tp_segment;

/* Latency histogram bucket of a duration (floor(log2(ns)), clamped). */
static inline uint32_t tp_hist_bucket(uint64_t ns)
{
    if (ns < 2) return 0;
    uint32_t b = 63u - (uint32_t)__builtin_clzll(ns);
    return b < TP_HIST_BUCKETS ? b : TP_HIST_BUCKETS - 1;
}

/* The fine-window index of a duration for a window starting at octave `a`
 * (a >= TP_FINE_SUB_BITS), or -1 when the duration is outside the window. */
static inline int32_t tp_fine_bucket(uint64_t ns, uint32_t a)
{
    if (ns < (1ULL << a)) return -1;
    uint32_t e = 63u - (uint32_t)__builtin_clzll(ns);
    if (e >= a + TP_FINE_OCTAVES) return -1;
    uint32_t sub = (uint32_t)(ns >> (e - TP_FINE_SUB_BITS)) & ((1u << TP_FINE_SUB_BITS) - 1u);
    return (int32_t)(((e - a) << TP_FINE_SUB_BITS) | sub);
}

/* The fine window's lowest octave for a slot whose calls take about `ns`: one
 * octave below ns's, kept inside [TP_FINE_SUB_BITS, TP_HIST_BUCKETS - 1) so that
 * sub-buckets are whole nanoseconds and the last, clamped log2 bucket stays out. */
static inline uint32_t tp_fine_anchor(uint64_t ns)
{
    uint32_t a = tp_hist_bucket(ns);
    a = a > TP_FINE_SUB_BITS ? a - 1 : TP_FINE_SUB_BITS;
    return a < TP_HIST_BUCKETS - 1 - TP_FINE_OCTAVES ? a : TP_HIST_BUCKETS - 1 - TP_FINE_OCTAVES;
}

/* Writer side of a seqlock (single writer). */
static inline void tp_write_begin(uint64_t *seq)
{
    uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
    __atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void tp_write_end(uint64_t *seq)
{
    uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
    __atomic_store_n(seq, s + 1, __ATOMIC_RELEASE);
}

/* Reader side: copy `size` bytes of a record whose first field is its
 * sequence counter.  When `expect` is nonzero the counter must equal it
 * (ring entries).  Returns 0 on a consistent copy, -1 after `tries` torn
 * reads (the writer is mid-update), -2 when the counter does not match
 * `expect` (the ring entry was overwritten or not yet written). */
static inline int tp_read_record(const void *rec, void *out, uint64_t size, uint64_t expect, int tries)
{
    const uint64_t *seq = (const uint64_t *)rec;
    for (int i = 0; i < tries; i++) {
        uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (s1 & 1u) continue;
        if (expect && s1 != expect) return -2;
        __builtin_memcpy(out, rec, size);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint64_t s2 = __atomic_load_n(seq, __ATOMIC_RELAXED);
        if (s1 == s2) return 0;
    }
    return -1;
}

#endif /* TUIPROF_SEGMENT_H */
