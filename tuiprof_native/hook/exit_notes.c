/* How the process ended, noted in its segment for the agent (which is not
 * the process's parent, so it cannot wait() for the status):
 *   - the status passed to exit(), through glibc's on_exit();
 *   - the fatal signal, through a handler on SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 *     SIGABRT and SIGTERM that stores the number and then hands the signal on
 *     exactly as before: to the previous handler, or, where the disposition
 *     was the default, by restoring it and raising the signal again, so the
 *     process dies of the same signal with the same core dump.
 * Installed once per address space, when the hook starts (after Python set up
 * its own handlers, so Python's view of the dispositions is unchanged);
 * signals that were ignored are left alone.  The handler only does an atomic
 * store and async-signal-safe calls. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>

#include "hook_internal.h"

static const int k_fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM};
static struct sigaction g_previous[NSIG];
static int g_installed; /* not reset in a fork child: the handlers and on_exit entry live on in it */

static void note_fatal_signal(int sig, siginfo_t *info, void *context)
{
    tp_segment *s = tp_segment_get();
    if (s) __atomic_store_n(&s->header.fatal_signal, sig, __ATOMIC_RELEASE);
    const struct sigaction *prev = &g_previous[sig];
    if (prev->sa_flags & SA_SIGINFO) {
        prev->sa_sigaction(sig, info, context);
    } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
    } else {
        /* Default action: put it back and re-raise; the signal is blocked
         * while this handler runs, so it is delivered as this returns. */
        sigaction(sig, prev, NULL);
        raise(sig);
    }
}

static void note_exit_status(int status, void *arg)
{
    (void)arg;
    tp_segment *s = tp_segment_get();
    if (!s) return;
    __atomic_store_n(&s->header.exit_status, status & 0xff, __ATOMIC_RELEASE);
    tp_set_flag(TP_FLAG_EXIT_STATUS);
}

void tp_exit_notes_install(void)
{
    if (g_installed) return;
    g_installed = 1;
    on_exit(note_exit_status, NULL);
    for (size_t i = 0; i < sizeof(k_fatal) / sizeof(k_fatal[0]); i++) {
        int sig = k_fatal[i];
        struct sigaction prev;
        if (sigaction(sig, NULL, &prev) != 0 || (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler == SIG_IGN))
            continue;
        g_previous[sig] = prev;
        struct sigaction mine = {0};
        mine.sa_sigaction = note_fatal_signal;
        mine.sa_flags = SA_SIGINFO | SA_ONSTACK | (prev.sa_flags & SA_RESTART);
        sigemptyset(&mine.sa_mask);
        sigaction(sig, &mine, NULL);
    }
}
