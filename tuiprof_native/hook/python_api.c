/* C entry points for the Python startup hook (called through ctypes):
 * optimizer steps, GC pauses, DataLoader waits, PyTorch's caching allocator
 * figures, uncaught exceptions.  Steps
 * and DataLoader waits start the hook (they mark a training process); GC
 * pauses and exceptions are only recorded once it runs, so helper Python
 * processes (a launcher such as torchrun among them) never get a segment. */
#include "hook_internal.h"

static void submit_interval(uint32_t type, const char *op, uint64_t start_ns, uint64_t end_ns)
{
    tp_record r = {0};
    r.type = type;
    tp_copy_name(r.op, sizeof(r.op), op);
    r.start_ns = start_ns;
    r.end_ns = end_ns;
    r.dur_ns = end_ns - start_ns;
    tp_submit(&r);
}

TP_EXPORT int tuiprof_record_step(void)
{
    if (!tp_ensure_started()) return 0;
    uint64_t now = tp_now_ns();
    submit_interval(TP_REC_STEP, "step", now, now);
    return 1;
}

TP_EXPORT int tuiprof_record_gc(uint64_t start_ns, uint64_t end_ns)
{
    if (!tp_is_running() || end_ns < start_ns) return 0;
    submit_interval(TP_REC_GC, "gc", start_ns, end_ns);
    return 1;
}

TP_EXPORT int tuiprof_record_dataloader(uint64_t start_ns, uint64_t end_ns)
{
    if (end_ns < start_ns || !tp_ensure_started()) return 0;
    submit_interval(TP_REC_DATALOADER, "dataloader", start_ns, end_ns);
    return 1;
}

/* PyTorch's CUDA caching allocator (enum tp_allocator_state, and with
 * TP_ALLOCATOR_READ its figures: allocated, reserved and peak allocated bytes,
 * allocation retries, OOMs); only once the hook runs. */
TP_EXPORT int tuiprof_record_allocator(uint32_t state, uint64_t allocated, uint64_t reserved, uint64_t peak,
                                       uint64_t retries, uint64_t ooms)
{
    if (!tp_is_running() || state > TP_ALLOCATOR_UNINITIALIZED) return 0;
    const uint64_t figures[5] = {allocated, reserved, peak, retries, ooms};
    tp_memory_allocator(state, tp_now_ns(), figures);
    return 1;
}

/* The segment path of this process (+ suffix) once the hook runs, else "". */
static const char *sidecar_path(char *buf, size_t cap, const char *suffix)
{
    if (!tp_is_running() || tp_segment_path(buf, cap, suffix) != 0) return "";
    return buf;
}

TP_EXPORT const char *tuiprof_segment_path(void)
{
    static __thread char path[TP_PATH_MAX];
    return sidecar_path(path, sizeof(path), "");
}

/* Where the startup hook writes this process's last uncaught exception and
 * its Flight Recorder progress (beside the segment); "" when the process has
 * no segment. */
TP_EXPORT const char *tuiprof_exception_path(void)
{
    static __thread char path[TP_PATH_MAX];
    return sidecar_path(path, sizeof(path), TP_EXCEPTION_SUFFIX);
}

TP_EXPORT const char *tuiprof_flight_path(void)
{
    static __thread char path[TP_PATH_MAX];
    return sidecar_path(path, sizeof(path), TP_FLIGHT_SUFFIX);
}
