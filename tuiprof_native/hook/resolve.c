/* Finding the real cuBLAS / CUDA runtime functions.
 *
 * PyTorch wheels load cuBLAS, cuBLASLt and NCCL into a local dlopen scope, so
 * dlsym(RTLD_NEXT) returns NULL for them even though our preloaded definition
 * wins symbol binding.  Instead we walk every loaded object
 * (dl_iterate_phdr), take a handle to it without loading anything
 * (RTLD_NOLOAD) and ask it for the symbol, skipping this library itself.
 * Callers cache the result; this never runs on a hot path twice. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "hook_internal.h"

typedef struct resolve_query {
    const char *name;
    void *self_base;
    void *found;
} resolve_query;

static int visit(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    resolve_query *q = data;
    if (!info->dlpi_name || !info->dlpi_name[0]) return 0; /* main program: would find us */
    if ((void *)info->dlpi_addr == q->self_base) return 0;
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return 0;
    void *sym = dlsym(h, q->name);
    dlclose(h);
    if (!sym) return 0;
    Dl_info where;
    if (dladdr(sym, &where) && where.dli_fbase == q->self_base) return 0;
    q->found = sym;
    return 1;
}

void *tp_resolve(const char *name)
{
    Dl_info self;
    if (!dladdr((void *)&tp_resolve, &self)) return NULL;
    resolve_query q = {name, self.dli_fbase, NULL};
    dl_iterate_phdr(visit, &q);
    return q.found;
}
