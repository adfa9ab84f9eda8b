/* CUDA device memory at the runtime API: LD_PRELOAD interposers for
 * cudaMalloc / cudaFree, cudaMallocAsync / cudaFreeAsync, cudaMemcpy and
 * cudaMemcpyAsync (xpu-timer's device memory statistics), and PyTorch's
 * caching allocator figures as the Python startup hook hands them over.
 *
 * Every call that succeeds is counted exactly, with its bytes: the calling
 * thread adds to process-wide atomic counters (no record, no queue: these
 * calls cost microseconds, an uncontended atomic add tens of nanoseconds), and
 * the writer thread copies them into the segment's tp_device_memory each
 * pass.  A free's bytes come from a table of live allocations kept here
 * (pointer -> size, lock-free, open addressing); a pointer it does not hold
 * (allocated before the hook started, or the table full near the pointer's
 * place) is counted as a free of unknown size.
 *
 * Copies are classified by their cudaMemcpyKind; cudaMemcpyDefault stays
 * "default" (resolving it would cost two cudaPointerGetAttributes a copy).
 * Timing: the first TP_COPY_TIMED_FIRST copies of each direction, then one in
 * TP_COPY_SAMPLE_EVERY, take a pooled CUDA event pair on the copy's stream
 * (cuda_timer.c; cudaMemcpy: the legacy default stream, where it runs); the
 * writer folds the elapsed time with the copies it stands for as its weight.
 *
 * Not seen: allocations and copies through the driver API (cuMemAlloc,
 * cuMemcpy*, the cuMemCreate/cuMemMap of PyTorch's expandable segments and of
 * NCCL), per-thread default stream variants (*_ptds / *_ptsz), peer copies
 * (cudaMemcpyPeer*), 2D/3D copies and copies inside CUDA graphs. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "hook_internal.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INITIALIZATION 3 /* cudaErrorInitializationError: no real runtime to call */

/* ---- counters (application threads add, the writer publishes) ---------- */

static tp_device_memory g_counts; /* seq unused; fields updated with atomic adds */
static pthread_mutex_t g_allocator_lock = PTHREAD_MUTEX_INITIALIZER; /* the allocator figures, taken whole */
static _Atomic uint64_t g_copy_attempts[TP_COPY_DIRECTIONS]; /* copies begun: which are due for timing */
static tp_device_memory g_published; /* the writer's last copy in the segment */

static void add(uint64_t *counter, uint64_t n) { __atomic_fetch_add(counter, n, __ATOMIC_RELAXED); }

/* ---- live allocations --------------------------------------------------- */

#define LIVE_BITS 16u
#define LIVE_SLOTS (1u << LIVE_BITS) /* 1 MiB of address space, touched as used */
#define LIVE_PROBES 64u             /* an allocation finds a place within this many entries of its home */
#define LIVE_EMPTY 0u               /* never used: a lookup stops here */
#define LIVE_GONE 1u                /* freed: a lookup probes past it, an insert reuses it (pointers are aligned) */

typedef struct live_alloc {
    _Atomic uintptr_t ptr;
    uint64_t size;
} live_alloc;

static live_alloc g_live[LIVE_SLOTS];

static uint32_t live_home(uintptr_t p) { return (uint32_t)(((uint64_t)p * 0x9E3779B97F4A7C15ULL) >> (64 - LIVE_BITS)); }

/* Remember a new allocation; 0 when no entry near its home is free. */
static int live_insert(uintptr_t p, uint64_t size)
{
    uint32_t home = live_home(p);
    for (uint32_t i = 0; i < LIVE_PROBES; i++) {
        live_alloc *e = &g_live[(home + i) & (LIVE_SLOTS - 1)];
        uintptr_t have = atomic_load_explicit(&e->ptr, memory_order_relaxed);
        if ((have == LIVE_EMPTY || have == LIVE_GONE) &&
            atomic_compare_exchange_strong_explicit(&e->ptr, &have, p, memory_order_acquire, memory_order_relaxed)) {
            /* No lookup of p can run before this returns: the caller has not seen p yet. */
            e->size = size;
            return 1;
        }
    }
    return 0;
}

/* Forget an allocation, giving its size; 0 when the table does not hold it. */
static int live_take(uintptr_t p, uint64_t *size)
{
    uint32_t home = live_home(p);
    for (uint32_t i = 0; i < LIVE_PROBES; i++) {
        live_alloc *e = &g_live[(home + i) & (LIVE_SLOTS - 1)];
        uintptr_t have = atomic_load_explicit(&e->ptr, memory_order_acquire);
        if (have == LIVE_EMPTY) return 0;
        if (have != p) continue;
        *size = e->size;
        return atomic_compare_exchange_strong_explicit(&e->ptr, &have, LIVE_GONE, memory_order_relaxed,
                                                       memory_order_relaxed);
    }
    return 0;
}

static void counted_malloc(tp_alloc_stats *stats, void *p, uint64_t size)
{
    add(&stats->malloc_calls, 1);
    add(&stats->malloc_bytes, size);
    live_insert((uintptr_t)p, size); /* not held: its free counts as one of unknown size */
}

/* Before the real free: the allocation's entry is taken out first, so an
 * allocation of the same address by another thread right after the free
 * cannot be the one removed.  Returns whether it was held. */
static int free_begin(void *p, uint64_t *size) { return live_take((uintptr_t)p, size); }

static void free_end(tp_alloc_stats *stats, void *p, int held, uint64_t size, int status)
{
    if (status != CUDA_SUCCESS) { /* nothing freed (or the error of earlier work): keep it live */
        if (held) live_insert((uintptr_t)p, size);
        return;
    }
    add(&stats->free_calls, 1);
    if (held)
        add(&stats->free_bytes, size);
    else
        add(&stats->free_unknown, 1);
}

typedef int (*malloc_fn)(void **p, size_t size);
typedef int (*free_fn)(void *p);
typedef int (*malloc_async_fn)(void **p, size_t size, void *stream);
typedef int (*free_async_fn)(void *p, void *stream);
typedef int (*memcpy_fn)(void *dst, const void *src, size_t count, int kind);
typedef int (*memcpy_async_fn)(void *dst, const void *src, size_t count, int kind, void *stream);

TP_EXPORT int cudaMalloc(void **p, size_t size)
{
    malloc_fn real = TP_REAL(malloc_fn, "cudaMalloc");
    if (TP_UNLIKELY(!real)) return CUDA_ERROR_INITIALIZATION;
    int status = real(p, size);
    if (status == CUDA_SUCCESS && tp_ensure_started()) counted_malloc(&g_counts.malloc, *p, size);
    return status;
}

TP_EXPORT int cudaFree(void *p)
{
    free_fn real = TP_REAL(free_fn, "cudaFree");
    if (TP_UNLIKELY(!real)) return CUDA_ERROR_INITIALIZATION;
    if (!p || !tp_ensure_started()) return real(p); /* cudaFree(NULL) frees nothing (PyTorch's context set-up) */
    uint64_t size = 0;
    int held = free_begin(p, &size);
    int status = real(p);
    free_end(&g_counts.malloc, p, held, size, status);
    return status;
}

TP_EXPORT int cudaMallocAsync(void **p, size_t size, void *stream)
{
    malloc_async_fn real = TP_REAL(malloc_async_fn, "cudaMallocAsync");
    if (TP_UNLIKELY(!real)) return CUDA_ERROR_INITIALIZATION;
    int status = real(p, size, stream);
    if (status == CUDA_SUCCESS && tp_ensure_started()) counted_malloc(&g_counts.malloc_async, *p, size);
    return status;
}

TP_EXPORT int cudaFreeAsync(void *p, void *stream)
{
    free_async_fn real = TP_REAL(free_async_fn, "cudaFreeAsync");
    if (TP_UNLIKELY(!real)) return CUDA_ERROR_INITIALIZATION;
    if (!p || !tp_ensure_started()) return real(p, stream);
    uint64_t size = 0;
    int held = free_begin(p, &size);
    int status = real(p, stream);
    free_end(&g_counts.malloc_async, p, held, size, status);
    return status;
}

/* ---- copies -------------------------------------------------------------- */

typedef struct copy_call {
    int direction;   /* -1: not counted (hook inert, or a kind CUDA will refuse) */
    uint32_t weight; /* due for timing: the copies it stands for; 0: only counted */
    int timed;
    uint32_t timer;
    void *stream;
    uint64_t launched_ns;
} copy_call;

static void copy_begin(copy_call *c, int kind, void *stream)
{
    c->direction = -1;
    c->timed = 0;
    if (kind < 0 || kind >= (int)TP_COPY_DIRECTIONS || !tp_ensure_started()) return;
    c->direction = kind;
    uint64_t n = atomic_fetch_add_explicit(&g_copy_attempts[kind], 1, memory_order_relaxed);
    if (n < TP_COPY_TIMED_FIRST)
        c->weight = 1;
    else
        c->weight = (n - TP_COPY_TIMED_FIRST) % TP_COPY_SAMPLE_EVERY == 0 ? TP_COPY_SAMPLE_EVERY : 0;
    if (!c->weight) return;
    c->stream = stream;
    c->launched_ns = tp_now_ns();
    c->timed = tp_timer_acquire(stream, &c->timer);
}

static void copy_end(copy_call *c, const char *op, size_t count, int status)
{
    if (c->direction < 0) return;
    if (status != CUDA_SUCCESS) { /* nothing copied: not a copy */
        if (c->timed) tp_timer_abandon(c->timer);
        return;
    }
    tp_copy_stats *stats = &g_counts.copies[c->direction];
    add(&stats->calls, 1);
    add(&stats->bytes, count);
    if (!c->weight) return;
    if (!c->timed) {
        add(&stats->untimed, 1);
        return;
    }
    tp_timer_stop(c->timer, c->stream);
    tp_record r;
    memset(&r, 0, sizeof(r));
    r.type = TP_REC_COPY_LAUNCH;
    r.timer = c->timer;
    tp_copy_name(r.op, sizeof(r.op), op);
    r.stream = (uint64_t)(uintptr_t)c->stream;
    r.launched_ns = c->launched_ns;
    r.bytes = count;
    r.weight = c->weight;
    r.copy_direction = (uint32_t)c->direction;
    tp_submit(&r);
}

TP_EXPORT int cudaMemcpy(void *dst, const void *src, size_t count, int kind)
{
    memcpy_fn real = TP_REAL(memcpy_fn, "cudaMemcpy");
    if (TP_UNLIKELY(!real)) return CUDA_ERROR_INITIALIZATION;
    copy_call c;
    copy_begin(&c, kind, NULL);
    int status = real(dst, src, count, kind);
    copy_end(&c, "cudaMemcpy", count, status);
    return status;
}

TP_EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream)
{
    memcpy_async_fn real = TP_REAL(memcpy_async_fn, "cudaMemcpyAsync");
    if (TP_UNLIKELY(!real)) return CUDA_ERROR_INITIALIZATION;
    copy_call c;
    copy_begin(&c, kind, stream);
    int status = real(dst, src, count, kind, stream);
    copy_end(&c, "cudaMemcpyAsync", count, status);
    return status;
}

/* ---- writer side ----------------------------------------------------------- */

void tp_memory_copy_timed(const tp_record *r, uint64_t dur_ns)
{
    tp_copy_stats *stats = &g_counts.copies[r->copy_direction % TP_COPY_DIRECTIONS];
    /* The writer alone writes these fields; atomic so that the publishing load pairs with them. */
    add(&stats->timed_calls, 1);
    add(&stats->timed_ns, dur_ns);
    add(&stats->weighted_calls, r->weight);
    add(&stats->weighted_ns, r->weight * dur_ns);
}

void tp_memory_copy_untimed(const tp_record *r) { add(&g_counts.copies[r->copy_direction % TP_COPY_DIRECTIONS].untimed, 1); }

void tp_memory_allocator(uint32_t state, uint64_t read_ns, const uint64_t figures[5])
{
    pthread_mutex_lock(&g_allocator_lock);
    g_counts.allocator_state = state;
    g_counts.allocator_read_ns = read_ns;
    g_counts.allocated_bytes = figures[0];
    g_counts.reserved_bytes = figures[1];
    g_counts.peak_allocated_bytes = figures[2];
    g_counts.alloc_retries = figures[3];
    g_counts.ooms = figures[4];
    pthread_mutex_unlock(&g_allocator_lock);
}

static void load_counters(const uint64_t *from, uint64_t *to, size_t bytes)
{
    for (size_t i = 0; i < bytes / sizeof(uint64_t); i++) to[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
}

void tp_memory_publish(void)
{
    tp_device_memory now = g_published;
    load_counters((const uint64_t *)&g_counts.malloc, (uint64_t *)&now.malloc, sizeof(now.malloc));
    load_counters((const uint64_t *)&g_counts.malloc_async, (uint64_t *)&now.malloc_async, sizeof(now.malloc_async));
    load_counters((const uint64_t *)g_counts.copies, (uint64_t *)now.copies, sizeof(now.copies));
    /* The writer never waits on an application thread: figures being replaced are taken next pass. */
    if (pthread_mutex_trylock(&g_allocator_lock) == 0) {
        now.allocator_state = g_counts.allocator_state;
        now.allocator_read_ns = g_counts.allocator_read_ns;
        now.allocated_bytes = g_counts.allocated_bytes;
        now.reserved_bytes = g_counts.reserved_bytes;
        now.peak_allocated_bytes = g_counts.peak_allocated_bytes;
        now.alloc_retries = g_counts.alloc_retries;
        now.ooms = g_counts.ooms;
        pthread_mutex_unlock(&g_allocator_lock);
    }
    if (memcmp(&now, &g_published, sizeof(now)) == 0) return;
    tp_device_memory *out = &tp_segment_get()->device_memory;
    const size_t after_seq = sizeof(out->seq);
    tp_write_begin(&out->seq);
    memcpy((char *)out + after_seq, (const char *)&now + after_seq, sizeof(now) - after_seq);
    tp_write_end(&out->seq);
    g_published = now;
}

void tp_memory_fork_child(void)
{
    /* The child's segment is its own, and so are its counts.  The table of live allocations
     * is left as it is: clearing it would touch its megabyte in every forked child (DataLoader
     * workers), and a child cannot use CUDA its parent initialized, so it frees none of them. */
    memset(&g_counts, 0, sizeof(g_counts));
    memset(&g_published, 0, sizeof(g_published));
    for (uint32_t d = 0; d < TP_COPY_DIRECTIONS; d++) atomic_store(&g_copy_attempts[d], 0);
    pthread_mutex_init(&g_allocator_lock, NULL);
}
