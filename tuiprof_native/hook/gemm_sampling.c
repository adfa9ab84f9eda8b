/* Which GEMM calls are timed, and the exact count of those that are not.
 *
 * Timing a call costs two CUDA event records on its stream (host time, and
 * 3.34 us of GPU time on an H100: bench/gpu/rank_figures_gpu.md), so only some
 * calls are timed: every call of a shape until TP_GEMM_TIMED_FIRST of them,
 * then one in a period.  The period is fixed by TUIPROF_GEMM_SAMPLE_EVERY;
 * by default it is chosen per shape from the shape's mean kernel time so
 * that timing costs at most TIMING_BUDGET_DIVISOR-th of the shape's GPU time
 * (0.05 %): 16 for kernels of 0.42 ms and more, longer for shorter ones, in
 * powers of two up to TP_GEMM_SAMPLE_EVERY_ADAPTIVE_MAX.  The writer thread
 * recomputes it as each timed call of the shape finishes; a call uses the
 * period its thread reads then.  Given the durations the rule is
 * deterministic per (launching thread, shape): no random draws.
 *
 * Weights: a timed call stands for itself and every call of its thread and
 * shape that ran since that pair's previous timed call (a call due for
 * timing that could not be timed passes its calls on to the next timed
 * one; a call that failed ran nothing and counts for nothing).  So the
 * weights of a shape's timed calls add up to its calls exactly, up to those
 * after its last timed call, whatever periods were in force.
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
#define TIMING_GPU_NS 3340u        /* GPU time of a timed call's two event records (H100) */
#define TIMING_BUDGET_DIVISOR 2000u /* adaptive: timing costs at most 1/2000 of the shape's GPU time */

struct tp_shape {
    _Atomic uint64_t key; /* 0 while empty; written once, last (release) */
    _Atomic uint64_t counted; /* calls sampled out that ran: written by the owning thread only */
    _Atomic uint32_t period;  /* one call in this many is timed: the writer's (adaptive), read by the owner */
    /* owning thread only */
    uint64_t calls;           /* calls of this shape so far (also those that failed) */
    uint64_t untimed;         /* calls that ran since the last timed one */
    uint64_t since_due;       /* calls that ran since the last one due for timing */
    /* writer thread only */
    uint64_t harvested;       /* `counted` at its last visit */
    uint64_t timed_ns, timed_n; /* durations of its timed calls (but the first), for the mean */
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
static int g_adaptive = 1; /* no TUIPROF_GEMM_SAMPLE_EVERY: the period follows each shape's kernel time */

void tp_gemm_sampling_init(void)
{
    const char *v = getenv("TUIPROF_GEMM_SAMPLE_EVERY");
    if (!v || !*v) return;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    if (*end == '\0' && n >= 1 && n <= TP_GEMM_SAMPLE_EVERY_MAX) {
        g_sample_every = (uint32_t)n;
        g_adaptive = 0;
        return;
    }
    fprintf(stderr, "tuiprof: TUIPROF_GEMM_SAMPLE_EVERY=%.32s is not a whole number from 1 to %u; timing 1 GEMM call "
            "in %u to %u per shape, by its kernel time\n", v, TP_GEMM_SAMPLE_EVERY_MAX, g_sample_every,
            TP_GEMM_SAMPLE_EVERY_ADAPTIVE_MAX);
}

uint32_t tp_gemm_sample_every(void) { return g_sample_every; }

uint32_t tp_gemm_sample_max(void) { return g_adaptive ? TP_GEMM_SAMPLE_EVERY_ADAPTIVE_MAX : 0; }

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
            atomic_store_explicit(&e->period, g_sample_every, memory_order_relaxed);
            atomic_store_explicit(&e->key, key, memory_order_release); /* the writer may read it now */
            return e;
        }
    }
    return NULL; /* set full: this shape is timed on every call */
}

uint32_t tp_gemm_timing_weight(tp_shape *e, uint32_t *period)
{
    *period = 0;
    if (!e) return 1;
    if (++e->calls > TP_GEMM_TIMED_FIRST) {
        *period = atomic_load_explicit(&e->period, memory_order_relaxed);
        if (e->since_due + 1 < *period) return 0;
    }
    return (uint32_t)(e->untimed + 1 < UINT32_MAX ? e->untimed + 1 : UINT32_MAX);
}

uint32_t tp_gemm_first_call(const tp_shape *e)
{
    if (!e) return TP_FIRST_CALL_UNKNOWN;
    return e->calls == 1 ? TP_FIRST_CALL_YES : TP_FIRST_CALL_NO;
}

uint64_t tp_gemm_shape_key(const tp_shape *e) { return e ? atomic_load_explicit(&e->key, memory_order_relaxed) : 0; }

void tp_gemm_ran(tp_shape *e, enum tp_gemm_outcome how)
{
    if (!e) return;
    if (how == TP_GEMM_TIMED) {
        e->untimed = e->since_due = 0;
        return;
    }
    e->untimed++;
    if (how == TP_GEMM_DUE_UNTIMED) {
        e->since_due = 0; /* tried: the next try is a period on */
        return;
    }
    e->since_due++;
    /* One writer (this thread): a plain load and store, no read-modify-write. */
    uint64_t n = atomic_load_explicit(&e->counted, memory_order_relaxed);
    atomic_store_explicit(&e->counted, n + 1, memory_order_release);
}

/* The shortest power-of-two period, from TP_GEMM_SAMPLE_EVERY_DEFAULT up to
 * TP_GEMM_SAMPLE_EVERY_ADAPTIVE_MAX, at which timing one call in it costs
 * at most 1/TIMING_BUDGET_DIVISOR of calls of `mean_ns`. */
static uint32_t adaptive_period(uint64_t mean_ns)
{
    uint32_t p = TP_GEMM_SAMPLE_EVERY_DEFAULT;
    while (p < TP_GEMM_SAMPLE_EVERY_ADAPTIVE_MAX && (uint64_t)p * mean_ns < (uint64_t)TIMING_GPU_NS * TIMING_BUDGET_DIVISOR)
        p <<= 1;
    return p;
}

void tp_gemm_timing_done(const tp_record *r)
{
    tp_shape *e = r->shape;
    if (!g_adaptive || !e || r->first_call == TP_FIRST_CALL_YES || r->dur_ns == UINT64_MAX) return;
    if (atomic_load_explicit(&e->key, memory_order_acquire) != r->shape_key) return; /* table reused since */
    e->timed_ns += r->dur_ns;
    e->timed_n++;
    atomic_store_explicit(&e->period, adaptive_period(e->timed_ns / e->timed_n), memory_order_relaxed);
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
