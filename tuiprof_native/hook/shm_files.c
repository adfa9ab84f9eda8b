/* The files this process owns in TP_SEGMENT_DIR, and how it stays inert.
 *
 * /dev/shm is writable by every local user, and the agent that reads these
 * files runs as root.  A name there that others can predict can be taken
 * ahead of us: squatting tuiprof-<uid>-<pid> for the next pids once kept a
 * user's ranks out of every view.  So the names are
 * tuiprof-<uid>-<pid>-<16 hex digits from getrandom> (the "stem"), unknown
 * until the file exists, and every file is created O_EXCL | O_NOFOLLOW,
 * mode 0600 (a name that is taken is never ours: another stem is drawn).
 * The agent finds them by listing the directory and checks each claim
 * against the kernel.
 *
 * When the hook cannot record, the process says so once on stderr and leaves
 * a note, <stem>.inert, with the reason for the agent. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hook_internal.h"

#define STEM_MAX 48 /* tuiprof-<10 digits>-<7 digits>-<16 hex digits> */
_Static_assert(TP_STEM_RANDOM_DIGITS == 2 * sizeof(uint64_t), "the random part is one uint64_t in hex");

/* This process's stem: written before the hook runs (tp_new_stem), read-only while it does. */
static char g_stem[STEM_MAX];
/* The side files this process created (tp_claim_sidecars), the only ones it removes. */
static int g_claimed_exception, g_claimed_flight;

int tp_new_stem(char *why, size_t cap)
{
    uint64_t random;
    ssize_t got;
    do /* never blocks: before the kernel's pool is ready it fails with EAGAIN */
        got = getrandom(&random, sizeof(random), GRND_NONBLOCK);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof(random)) {
        g_stem[0] = '\0';
        tp_reason(why, cap, got < 0 ? errno : 0, "no random bytes for an unpredictable file name (getrandom)");
        return -1;
    }
    snprintf(g_stem, sizeof(g_stem), TP_SEGMENT_PREFIX "%u-%d-%016llx", (unsigned)getuid(), (int)getpid(),
             (unsigned long long)random);
    g_claimed_exception = g_claimed_flight = 0;
    return 0;
}

void tp_forget_stem(void) { g_stem[0] = '\0'; }

int tp_segment_path(char *buf, size_t cap, const char *suffix)
{
    if (!g_stem[0]) return -1;
    int n = snprintf(buf, cap, TP_SEGMENT_DIR "/%s%s", g_stem, suffix);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

void tp_reason(char *why, size_t cap, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    if (err && n >= 0 && (size_t)n < cap) {
        char buf[128];
        snprintf(why + n, cap - (size_t)n, " (%s)", strerror_r(err, buf, sizeof(buf)));
    }
}

/* A new empty file <stem><suffix> of this user: 1 when created, 0 when not. */
static int create_empty(const char *suffix)
{
    char path[TP_PATH_MAX];
    if (tp_segment_path(path, sizeof(path), suffix) != 0) return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

void tp_claim_sidecars(void)
{
    /* An empty file says nothing (the agent reads it as no exception, no progress); the
     * startup hook replaces it whole.  One that cannot be made (taken in the moment since
     * the segment appeared, no inode left) only costs that file: the startup hook finds a
     * file not its own there and leaves it alone, and the agent ignores it. */
    g_claimed_exception = create_empty(TP_EXCEPTION_SUFFIX);
    g_claimed_flight = create_empty(TP_FLIGHT_SUFFIX);
}

static void unlink_suffix(const char *suffix)
{
    char path[TP_PATH_MAX];
    if (tp_segment_path(path, sizeof(path), suffix) == 0) unlink(path);
}

void tp_remove_files(void)
{
    unlink_suffix(""); /* ours: created O_EXCL; in the sticky /dev/shm no one else can swap it */
    if (g_claimed_exception) unlink_suffix(TP_EXCEPTION_SUFFIX);
    if (g_claimed_flight) unlink_suffix(TP_FLIGHT_SUFFIX);
    g_claimed_exception = g_claimed_flight = 0;
}

/* The note for the agent, under a stem of its own (a segment name given up may have been
 * seen): one line, or empty when not even one page of shared memory is left (creating
 * the inode needs none). */
static void write_note(const char *reason)
{
    char path[TP_PATH_MAX], why[TP_REASON_MAX];
    if (tp_new_stem(why, sizeof(why)) != 0 || tp_segment_path(path, sizeof(path), TP_INERT_SUFFIX) != 0) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return;
    char line[TP_REASON_MAX + 1];
    int n = snprintf(line, sizeof(line), "%s\n", reason);
    /* A line this short needs one page: it is written whole or (ENOSPC) not at all. */
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}

void tp_report_inert(const char *reason)
{
    char line[TP_REASON_MAX + 96];
    int n = snprintf(line, sizeof(line), "tuiprof: telemetry off in pid %d: %s; training continues\n", (int)getpid(),
                     reason);
    if (n > 0) {
        size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
        ssize_t w = write(STDERR_FILENO, line, len); /* one write: one line, even among other writers */
        (void)w;
    }
    write_note(reason);
}
