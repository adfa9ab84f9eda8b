/* Small helpers every part of the hook uses: the clock and bounded name copies. */
#include <string.h>
#include <time.h>

#include "hook_internal.h"

uint64_t tp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void tp_copy_name(char *dst, size_t cap, const char *src)
{
    if (!src) src = "";
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}
