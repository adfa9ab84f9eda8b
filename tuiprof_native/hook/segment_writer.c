/* The writer thread's view of the segment: creation, aggregate slots, the
 * event ring and the counters.  Only the writer thread calls these (and
 * tp_segment_create / tp_segment_remove, from the thread that starts the
 * hook, before the writer runs). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "hook_internal.h"

#define SLOT_INDEX_SIZE 2048u /* open addressing over slot keys, > 2 * TP_MAX_SLOTS */

static tp_segment *g_seg;
/* The segment's file, kept open for the shared lock that says this process still writes it. */
static int g_lock_fd = -1;
static uint32_t g_slot_index[SLOT_INDEX_SIZE]; /* slot number + 1; 0 = empty */
static uint8_t g_first_seen[TP_MAX_SLOTS];     /* a GEMM slot's first call was folded */
/* Per slot, the current block of TP_FINE_BLOCK timed calls: how many so far, how many outside the window. */
static uint8_t g_fine_block_calls[TP_MAX_SLOTS];
static uint8_t g_fine_block_outside[TP_MAX_SLOTS];
/* Slot writes so far, and the data digest (data_digest) the header's data_seq last stood for. */
static uint64_t g_slot_writes;
static uint64_t g_published_digest;

tp_segment *tp_segment_get(void) { return g_seg; }

static int env_int(const char *const *names, int fallback)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end == '\0') return (int)x;
        }
    }
    return fallback;
}

static void env_str(char *dst, size_t cap, const char *const *names)
{
    dst[0] = '\0';
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) {
            tp_copy_name(dst, cap, v);
            return;
        }
    }
}

static void fill_identity(tp_header *h)
{
    static const char *const rank_env[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", NULL};
    static const char *const local_env[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", NULL};
    static const char *const world_env[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    static const char *const job_env[] = {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "TUIPROF_JOB_ID", NULL};
    h->pid = (int32_t)getpid();
    h->rank = env_int(rank_env, -1);
    h->local_rank = env_int(local_env, -1);
    h->world_size = env_int(world_env, -1);
    env_str(h->job_id, sizeof(h->job_id), job_env);
    if (gethostname(h->hostname, sizeof(h->hostname) - 1) != 0) h->hostname[0] = '\0';
}

/* Pages reserved up front, so that a full /dev/shm is an error here and
 * never a SIGBUS on a later write into the mapping. */
static void *reserve_and_map(int fd, char *why, size_t cap)
{
    const double mib = (double)sizeof(tp_segment) / (1024.0 * 1024.0);
    int err;
    int tries = 0;
    do /* tmpfs gives up on a pending signal; try again */
        err = posix_fallocate(fd, 0, (off_t)sizeof(tp_segment));
    while (err == EINTR && ++tries < 8);
    if (err) {
        tp_reason(why, cap, err, "%sposix_fallocate of %.1f MiB in " TP_SEGMENT_DIR " failed",
                  err == ENOSPC ? "shared memory full: " : "", mib);
        return NULL;
    }
    void *p = mmap(NULL, sizeof(tp_segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        tp_reason(why, cap, errno, "mmap of the %.1f MiB segment failed", mib);
        return NULL;
    }
    return p;
}

static void init_header(tp_header *h)
{
    h->layout_version = TP_LAYOUT_VERSION;
    h->header_size = sizeof(tp_header);
    h->segment_size = sizeof(tp_segment);
    h->slot_size = sizeof(tp_slot);
    h->inflight_size = sizeof(tp_inflight);
    h->event_size = sizeof(tp_event);
    h->max_slots = TP_MAX_SLOTS;
    h->max_inflight = TP_MAX_INFLIGHT;
    h->ring_capacity = TP_RING_CAPACITY;
    h->hist_buckets = TP_HIST_BUCKETS;
    h->gemm_timed_first = TP_GEMM_TIMED_FIRST;
    h->gemm_sample_every = tp_gemm_sample_every();
    h->gemm_sample_max = tp_gemm_sample_max();
    fill_identity(h);
    h->start_ns = tp_now_ns();
    h->heartbeat_ns = h->start_ns;
    h->flags = tp_flags();
}

#define NAME_TRIES 4 /* a random name taken already: someone saw it; draw another */

int tp_segment_create(char *why, size_t cap)
{
    char path[TP_PATH_MAX];
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < NAME_TRIES; tries++) {
        if (tp_new_stem(why, cap) != 0) return -1;
        if (tp_segment_path(path, sizeof(path), "") != 0) {
            tp_reason(why, cap, 0, "the segment path does not fit in %d bytes", TP_PATH_MAX);
            return -1;
        }
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int err = errno;
        struct statvfs vfs;
        if (err == ENOSPC && statvfs(TP_SEGMENT_DIR, &vfs) == 0 && vfs.f_ffree == 0)
            tp_reason(why, cap, 0, "shared memory has no free inode: all %llu files of " TP_SEGMENT_DIR
                      " are taken, so %s cannot be created", (unsigned long long)vfs.f_files, path);
        else
            tp_reason(why, cap, err, "cannot create %s", path);
        return -1;
    }
    /* Held until the process ends, however it ends (Ctrl-C, SIGKILL: no exit handler runs), so that
     * `tuiprof run`'s watcher can tell a segment nobody writes any more (tuiprof_native/stale_segments.py).
     * Without it the segment is only never removed by that watcher. */
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) tp_set_flag(TP_FLAG_LOCKED);
    tp_claim_sidecars(); /* the name is visible now: its side files are taken at once, before the slow part */
    void *p = reserve_and_map(fd, why, cap);
    if (!p) {
        close(fd);
        tp_remove_files();
        return -1;
    }
    g_lock_fd = fd;
    tp_segment *s = p; /* fresh file: zero-filled */
    init_header(&s->header);
    memset(g_slot_index, 0, sizeof(g_slot_index));
    memset(g_first_seen, 0, sizeof(g_first_seen));
    g_slot_writes = 0;
    g_published_digest = 0; /* a fresh file: every counter below is zero */
    __atomic_store_n(&s->header.magic, TP_MAGIC, __ATOMIC_RELEASE);
    g_seg = s;
    return 0;
}

void tp_segment_detach(void)
{
    if (g_seg) munmap(g_seg, sizeof(tp_segment));
    g_seg = NULL;
    /* A fork child's copy of the descriptor shares the parent's lock: closing it leaves the lock to the parent. */
    if (g_lock_fd >= 0) close(g_lock_fd);
    g_lock_fd = -1;
    tp_forget_stem();
}

void tp_segment_remove(void)
{
    tp_remove_files();
    tp_segment_detach();
}

/* Every record a reader's figures come from changes only under its seqlock, whose counter
 * grows by 2 a write and never goes down, and so do the slot writes and the ring head: their
 * sum changes exactly when one of them did.  The in-flight table is written by the worker and
 * the device memory block by memory_hooks.c, so they are looked at here, not counted where
 * written.  Flags only gain bits, the profiler API is set once and the chain's failures only grow
 * (the header's NCCL profiler lines): summed in too. */
static uint64_t data_digest(const tp_segment *s)
{
    uint64_t d = g_slot_writes + __atomic_load_n(&s->header.ring_head, __ATOMIC_RELAXED) +
                 __atomic_load_n(&s->header.counters.seq, __ATOMIC_RELAXED) +
                 __atomic_load_n(&s->device_memory.seq, __ATOMIC_RELAXED) +
                 __atomic_load_n(&s->header.flags, __ATOMIC_RELAXED) +
                 __atomic_load_n(&s->header.nccl_profiler_api, __ATOMIC_RELAXED) + (uint64_t)tp_chain_init_failures();
    for (uint32_t i = 0; i < TP_MAX_INFLIGHT; i++) d += __atomic_load_n(&s->inflight[i].seq, __ATOMIC_RELAXED);
    return d;
}

void tp_segment_heartbeat(void)
{
    tp_header *h = &g_seg->header;
    uint64_t digest = data_digest(g_seg);
    if (digest != g_published_digest) { /* after this pass's writes: a reader that sees it sees them */
        __atomic_store_n(&h->data_seq, h->data_seq + 1, __ATOMIC_RELEASE);
        g_published_digest = digest;
    }
    __atomic_store_n(&h->heartbeat_ns, tp_now_ns(), __ATOMIC_RELEASE);
    __atomic_store_n(&h->writer_seq, h->writer_seq + 1, __ATOMIC_RELEASE);
}

void tp_counters_begin(void) { tp_write_begin(&g_seg->header.counters.seq); }
void tp_counters_end(void) { tp_write_end(&g_seg->header.counters.seq); }

static uint64_t fnv(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static int slot_matches(const tp_slot *s, const tp_record *r, uint32_t kind)
{
    return s->kind == kind && s->b == r->b && s->m == r->m && s->n == r->n && s->k == r->k &&
           s->comm_hash == (kind == TP_KIND_NCCL ? r->stream : 0) && strcmp(s->op, r->op) == 0 &&
           strcmp(s->dtype, r->dtype) == 0 && strcmp(s->algo, r->algo) == 0 && strcmp(s->proto, r->proto) == 0;
}

/* The slot for this record's key; a new one if unseen; the overflow slot
 * (last) once all others are taken. */
static tp_slot *slot_for(const tp_record *r, uint32_t kind)
{
    tp_header *h = &g_seg->header;
    uint64_t comm = kind == TP_KIND_NCCL ? r->stream : 0;
    uint64_t key = fnv(14695981039346656037ULL, &kind, sizeof(kind));
    key = fnv(key, r->op, strlen(r->op));
    key = fnv(key, r->dtype, strlen(r->dtype));
    key = fnv(key, r->algo, strlen(r->algo));
    key = fnv(key, r->proto, strlen(r->proto));
    int64_t shape[4] = {r->b, r->m, r->n, r->k};
    key = fnv(key, shape, sizeof(shape));
    key = fnv(key, &comm, sizeof(comm));
    for (uint32_t probe = 0; probe < SLOT_INDEX_SIZE; probe++) {
        uint32_t i = (uint32_t)((key + probe) & (SLOT_INDEX_SIZE - 1));
        uint32_t idx = g_slot_index[i];
        if (idx == 0) {
            if (h->slots_used >= TP_MAX_SLOTS - 1) break;
            uint32_t n = h->slots_used;
            tp_slot *s = &g_seg->slots[n];
            tp_write_begin(&s->seq);
            s->kind = kind;
            s->nranks = r->nranks;
            tp_copy_name(s->op, sizeof(s->op), r->op);
            tp_copy_name(s->dtype, sizeof(s->dtype), r->dtype);
            tp_copy_name(s->algo, sizeof(s->algo), r->algo);
            tp_copy_name(s->proto, sizeof(s->proto), r->proto);
            s->b = r->b, s->m = r->m, s->n = r->n, s->k = r->k;
            s->comm_hash = comm;
            s->min_ns = UINT64_MAX;
            tp_write_end(&s->seq);
            g_slot_writes++;
            g_slot_index[i] = n + 1;
            __atomic_store_n(&h->slots_used, n + 1, __ATOMIC_RELEASE);
            return s;
        }
        if (slot_matches(&g_seg->slots[idx - 1], r, kind)) return &g_seg->slots[idx - 1];
    }
    tp_slot *o = &g_seg->slots[TP_MAX_SLOTS - 1];
    if (o->kind == TP_KIND_NONE) {
        tp_write_begin(&o->seq);
        o->kind = kind;
        tp_copy_name(o->op, sizeof(o->op), "other");
        o->min_ns = UINT64_MAX;
        tp_write_end(&o->seq);
        g_slot_writes++;
    }
    tp_counters_begin();
    h->counters.slot_overflow++;
    tp_counters_end();
    return o;
}

static void write_event(const tp_record *r, uint32_t kind, uint32_t flags)
{
    tp_header *h = &g_seg->header;
    uint64_t i = h->ring_head;
    tp_event *e = &g_seg->ring[i % TP_RING_CAPACITY];
    __atomic_store_n(&e->seq, 2 * i + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    e->kind = kind;
    e->rank = kind == TP_KIND_NCCL ? r->rank : h->rank;
    tp_copy_name(e->op, sizeof(e->op), r->op);
    tp_copy_name(e->dtype, sizeof(e->dtype), r->dtype);
    e->start_ns = r->start_ns;
    e->end_ns = r->end_ns;
    e->bytes = r->bytes;
    e->flops = r->flops;
    e->op_seq = r->op_seq;
    e->comm_hash = kind == TP_KIND_NCCL ? r->stream : 0;
    e->b = r->b, e->m = r->m, e->n = r->n, e->k = r->k;
    e->flags = flags;
    e->stream = kind == TP_KIND_GEMM ? r->stream : 0;
    __atomic_store_n(&e->seq, 2 * i + 2, __ATOMIC_RELEASE);
    __atomic_store_n(&h->ring_head, i + 1, __ATOMIC_RELEASE);
}

void tp_segment_event(const tp_record *r, uint32_t kind) { write_event(r, kind, 0); }

void tp_segment_count(const tp_record *r, uint32_t kind, uint64_t calls)
{
    tp_slot *s = slot_for(r, kind);
    tp_write_begin(&s->seq);
    s->count += calls;
    s->bytes += calls * r->bytes;
    s->flops += calls * r->flops;
    tp_write_end(&s->seq);
    g_slot_writes++;
}

/* Puts slot n's fine window around `ns` (inside the slot's write section). */
static void place_fine_window(tp_slot *s, uint32_t n, uint64_t ns)
{
    s->fine_octave = tp_fine_anchor(ns);
    s->fine_anchors++;
    memset(s->fine, 0, sizeof(s->fine));
    g_fine_block_calls[n] = 0;
    g_fine_block_outside[n] = 0;
}

/* Counts a timed call of slot n in its fine window; places the window at the
 * slot's first call, and moves it to this call once more than half of the
 * current block of calls fell outside it (the latencies moved: warm-up ended,
 * a new regime).  Inside the slot's write section. */
static void add_fine(tp_slot *s, uint32_t n, uint64_t ns)
{
    if (s->fine_octave == 0) place_fine_window(s, n, ns);
    int32_t i = tp_fine_bucket(ns, s->fine_octave);
    if (i < 0 && ++g_fine_block_outside[n] > TP_FINE_BLOCK / 2) {
        place_fine_window(s, n, ns);
        i = tp_fine_bucket(ns, s->fine_octave);
    }
    if (i >= 0) s->fine[i]++;
    if (++g_fine_block_calls[n] == TP_FINE_BLOCK) g_fine_block_calls[n] = 0, g_fine_block_outside[n] = 0;
}

void tp_segment_fold(const tp_record *r, uint32_t kind)
{
    tp_slot *s = slot_for(r, kind);
    uint32_t n = (uint32_t)(s - g_seg->slots);
    /* The overflow slot mixes keys: no first call of its own. */
    int first = kind == TP_KIND_GEMM && n != TP_MAX_SLOTS - 1 && !g_first_seen[n] &&
                (r->first_call == TP_FIRST_CALL_YES || (r->first_call == TP_FIRST_CALL_UNKNOWN && s->count == 0));
    if (first) g_first_seen[n] = 1;
    tp_write_begin(&s->seq);
    s->count++;
    s->bytes += r->bytes;
    s->flops += r->flops;
    if (kind == TP_KIND_GEMM && r->period) s->sample_every = r->period;
    if (first) {
        if (r->dur_ns != UINT64_MAX) s->first_ns = r->dur_ns;
    } else if (r->dur_ns != UINT64_MAX) {
        s->timed_count++;
        s->total_ns += r->dur_ns;
        s->timed_bytes += r->bytes;
        s->timed_flops += r->flops;
        uint64_t w = kind == TP_KIND_GEMM ? r->weight : 1; /* NCCL: every op is timed */
        s->weighted_timed_count += w;
        s->weighted_total_ns += w * r->dur_ns;
        s->weighted_timed_bytes += w * r->bytes;
        s->weighted_timed_flops += w * r->flops;
        if (r->dur_ns < s->min_ns) s->min_ns = r->dur_ns, s->min_at_timed = s->timed_count;
        if (r->dur_ns > s->max_ns) s->max_ns = r->dur_ns, s->max_at_timed = s->timed_count;
        s->hist[tp_hist_bucket(r->dur_ns)]++;
        add_fine(s, n, r->dur_ns);
    }
    tp_write_end(&s->seq);
    g_slot_writes++;
    write_event(r, kind, first ? TP_EVENT_FIRST_CALL : 0);
}
