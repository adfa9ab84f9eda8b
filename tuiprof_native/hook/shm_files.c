/* The files this process owns in TP_SEGMENT_DIR, and how it stays inert.
 *
 * /dev/shm is writable by every local user, and the agent that reads these
 * files runs as root.  So a name there is never trusted: a stale file at our
 * path is removed only when it is this uid's own regular file (a symlink,
 * another user's file or anything else is left exactly as it is, and the hook
 * stays inert); new files are created O_EXCL | O_NOFOLLOW, mode 0600.
 *
 * When the hook cannot record, the process says so once on stderr and leaves
 * a note, <segment path>.inert, with the reason for the agent. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hook_internal.h"

int tp_segment_path(char *buf, size_t cap, const char *suffix)
{
    int n = snprintf(buf, cap, TP_SEGMENT_DIR "/" TP_SEGMENT_PREFIX "%u-%d%s", (unsigned)getuid(), (int)getpid(),
                     suffix);
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

int tp_clear_own_file(const char *path, char *why, size_t cap)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        tp_reason(why, cap, errno, "cannot look at %s", path);
        return -1;
    }
    if (S_ISLNK(st.st_mode)) {
        tp_reason(why, cap, 0, "a symbolic link is in the way at %s (left alone)", path);
        return -1;
    }
    if (st.st_uid != getuid()) {
        tp_reason(why, cap, 0, "a file of uid %u is in the way at %s (left alone)", (unsigned)st.st_uid, path);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        tp_reason(why, cap, 0, "something other than a regular file is in the way at %s (left alone)", path);
        return -1;
    }
    /* Our own file, left by an earlier process with this pid.  In the sticky
     * /dev/shm no other user can swap it between the lstat and the unlink. */
    if (unlink(path) != 0 && errno != ENOENT) {
        tp_reason(why, cap, errno, "cannot remove the stale %s", path);
        return -1;
    }
    return 0;
}

/* The note for the agent: one line, or empty when not even one page of
 * shared memory is left (creating the inode needs none). */
static void write_note(const char *reason)
{
    char path[TP_PATH_MAX], why[TP_REASON_MAX];
    if (tp_segment_path(path, sizeof(path), TP_INERT_SUFFIX) != 0 || tp_clear_own_file(path, why, sizeof(why)) != 0)
        return;
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

void tp_remove_stale_note(void)
{
    char path[TP_PATH_MAX], why[TP_REASON_MAX];
    if (tp_segment_path(path, sizeof(path), TP_INERT_SUFFIX) == 0) tp_clear_own_file(path, why, sizeof(why));
}
