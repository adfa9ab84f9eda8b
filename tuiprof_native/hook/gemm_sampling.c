/* Which GEMM calls are timed, and the exact count of those that are not.
 *
 * Timing a call costs two CUDA event records on its stream (host time and a
 * little GPU time), so only some calls are timed: every call of a shape
 * until TP_GEMM_TIMED_FIRST of them, then one in gemm_sample_every
 * (TUIPROF_GEMM_SAMPLE_EVERY, default TP_GEMM_SAMPLE_EVERY_DEFAULT).  The
 * rule is deterministic per (launching thread, shape).
 *
 * A call that is only counted must stay cheap, so it sends no record: each
 * launching thread owns a table of shapes whose entries are written once
 * (the shape) and then carry a counter that only that thread writes.  The
 * writer thread walks every table and folds what each counter gained since
 * its last visit into the shape's slot (tp_gemm_harvest_counted).  A thread
 * whose table is full, or could not get one, times every call instead
 * (never fewer timed calls, never a lost count).
 *
 * Tables are never freed (the writer may be reading one) but are reused: a
 * thread that exits retires its table, the writer folds its last counts,
 * clears it and frees it for the next thread that launches a GEMM. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hook_internal.h"

#define SHAPE_SETS 64u
#define SHAPE_WAYS 4u

struct tp_shape {
    _Atomic uint64_t key; /* 0 while empty; written once, last (release) */
    _Atomic uint64_t counted; /* calls sampled out that ran: written by the owning thread only */
    uint64_t calls;           /* owning thread only: calls of this shape so far */
    uint64_t harvested;       /* writer thread only: `counted` at its last visit */
    const char *op;           /* the interposer's name (a string literal) */
    int dtype;
    int64_t b, m, n, k;
};

enum { TABLE_OWNED, TABLE_RETIRED /* its thread exited */, TABLE_FREE /* cleared by the writer */ };

typedef struct shape_table {
    struct shape_table *next; /* registry, newest first */
    _Atomic int state;
    tp_shape sets[SHAPE_SETS][SHAPE_WAYS];
} shape_table;

static _Atomic(shape_table *) g_tables;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_table_key; /* its destructor retires the exiting thread's table */
static int g_key_ok;
static __thread shape_table *t_table;
static __thread int t_no_table; /* calloc failed once: this thread times every call */
static uint32_t g_sample_every = TP_GEMM_SAMPLE_EVERY_DEFAULT;

void tp_gemm_sampling_init(void)
{
    const char *v = getenv("TUIPROF_GEMM_SAMPLE_EVERY");
    if (!v || !*v) return;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    if (*end == '\0' && n >= 1 && n <= TP_GEMM_SAMPLE_EVERY_MAX) {
        g_sample_every = (uint32_t)n;
        return;
    }
    fprintf(stderr, "tuiprof: TUIPROF_GEMM_SAMPLE_EVERY=%.32s is not a whole number from 1 to %u; timing 1 GEMM call "
            "in %u\n", v, TP_GEMM_SAMPLE_EVERY_MAX, g_sample_every);
}

uint32_t tp_gemm_sample_every(void) { return g_sample_every; }

static void retire(void *table) { atomic_store_explicit(&((shape_table *)table)->state, TABLE_RETIRED, memory_order_release); }

static void make_key(void) { g_key_ok = pthread_key_create(&g_table_key, retire) == 0; }

/* A table the writer freed, or a new one put in the registry. */
static shape_table *claim_table(void)
{
    for (shape_table *t = atomic_load_explicit(&g_tables, memory_order_acquire); t; t = t->next) {
        int free_state = TABLE_FREE;
        if (atomic_compare_exchange_strong_explicit(&t->state, &free_state, TABLE_OWNED, memory_order_acquire,
                                                    memory_order_relaxed))
            return t;
    }
    shape_table *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    shape_table *head = atomic_load_explicit(&g_tables, memory_order_relaxed);
    do
        t->next = head;
    while (!atomic_compare_exchange_weak_explicit(&g_tables, &head, t, memory_order_release, memory_order_relaxed));
    return t;
}

static shape_table *own_table(void)
{
    if (TP_LIKELY(t_table != NULL) || t_no_table) return t_table;
    pthread_once(&g_key_once, make_key);
    shape_table *t = g_key_ok ? claim_table() : NULL; /* without the key, exits could not retire tables */
    if (!t || pthread_setspecific(g_table_key, t) != 0) {
        if (t) atomic_store_explicit(&t->state, TABLE_FREE, memory_order_release); /* unused: still clear */
        t_no_table = 1;
        return NULL;
    }
    t_table = t;
    return t;
}

static uint64_t shape_key(const char *op, int dtype, int64_t b, int64_t m, int64_t n, int64_t k)
{
    uint64_t h = (uint64_t)(uintptr_t)op * 0x9E3779B97F4A7C15ULL;
    h = (h ^ (uint64_t)(uint32_t)dtype) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (uint64_t)b) * 0x94D049BB133111EBULL;
    h = (h ^ (uint64_t)m) * 0x9E3779B97F4A7C15ULL;
    h = (h ^ (uint64_t)n) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (uint64_t)k) * 0x94D049BB133111EBULL;
    return (h ^ (h >> 31)) | 1; /* 0 marks an empty entry */
}

tp_shape *tp_gemm_shape(const char *op, int dtype, int64_t b, int64_t m, int64_t n, int64_t k)
{
    shape_table *t = own_table();
    if (!t) return NULL;
    uint64_t key = shape_key(op, dtype, b, m, n, k);
    tp_shape *set = t->sets[(key >> 7) & (SHAPE_SETS - 1)];
    for (uint32_t w = 0; w < SHAPE_WAYS; w++) {
        uint64_t have = atomic_load_explicit(&set[w].key, memory_order_relaxed);
        if (have == key) return &set[w];
        if (have == 0) {
            tp_shape *e = &set[w];
            e->op = op, e->dtype = dtype, e->b = b, e->m = m, e->n = n, e->k = k;
            atomic_store_explicit(&e->key, key, memory_order_release); /* the writer may read it now */
            return e;
        }
    }
    return NULL; /* set full: this shape is timed on every call */
}

uint32_t tp_gemm_timing_weight(tp_shape *e)
{
    if (!e) return 1;
    uint64_t c = ++e->calls;
    if (c <= TP_GEMM_TIMED_FIRST) return 1;
    /* Call TIMED_FIRST + j*N is timed for itself and the N-1 before it. */
    return (c - TP_GEMM_TIMED_FIRST) % g_sample_every == 0 ? g_sample_every : 0;
}

uint32_t tp_gemm_first_call(const tp_shape *e)
{
    if (!e) return TP_FIRST_CALL_UNKNOWN;
    return e->calls == 1 ? TP_FIRST_CALL_YES : TP_FIRST_CALL_NO;
}

void tp_gemm_count_sampled_out(tp_shape *e)
{
    /* One writer (this thread): a plain load and store, no read-modify-write. */
    uint64_t n = atomic_load_explicit(&e->counted, memory_order_relaxed);
    atomic_store_explicit(&e->counted, n + 1, memory_order_release);
}

/* Fold what each shape's counter gained since the last visit into its slot. */
static int harvest_table(shape_table *t)
{
    int work = 0;
    for (uint32_t s = 0; s < SHAPE_SETS; s++)
        for (uint32_t w = 0; w < SHAPE_WAYS; w++) {
            tp_shape *e = &t->sets[s][w];
            if (!atomic_load_explicit(&e->key, memory_order_acquire)) break; /* ways fill in order */
            uint64_t now = atomic_load_explicit(&e->counted, memory_order_acquire);
            if (now == e->harvested) continue;
            tp_record r;
            tp_gemm_shape_record(&r, e->op, e->dtype, e->b, e->m, e->n, e->k);
            tp_segment_count(&r, TP_KIND_GEMM, now - e->harvested);
            e->harvested = now;
            work = 1;
        }
    return work;
}

int tp_gemm_harvest_counted(void)
{
    int work = 0;
    for (shape_table *t = atomic_load_explicit(&g_tables, memory_order_acquire); t; t = t->next) {
        int state = atomic_load_explicit(&t->state, memory_order_acquire);
        if (state == TABLE_FREE) continue;
        work |= harvest_table(t);
        if (state == TABLE_RETIRED) { /* its thread is gone: nothing writes it any more */
            memset(t->sets, 0, sizeof(t->sets));
            atomic_store_explicit(&t->state, TABLE_FREE, memory_order_release);
        }
    }
    return work;
}

void tp_gemm_sampling_fork_child(void)
{
    /* The other threads' tables are gone with their threads; this thread's
     * counts belong to the parent's segment.  Start over (the old tables leak,
     * once per fork); this thread's key value goes with them. */
    atomic_store(&g_tables, NULL);
    if (g_key_ok) pthread_setspecific(g_table_key, NULL);
    t_table = NULL;
    t_no_table = 0;
}
