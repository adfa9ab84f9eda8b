/* cuBLASLt: cublasLtMatmul carries its shapes in descriptors.  Reading them
 * costs ~7 attribute getters, so shapes are cached per (matmul descriptor,
 * A layout, D layout) in a small per-thread table.  A cached shape is only
 * trusted while none of the three descriptors was created, initialised,
 * changed or destroyed since: those calls are interposed too and bump a
 * version counter for the descriptor's address (PyTorch builds fresh
 * descriptors for every call, often at a reused address). */
#include <string.h>

#include "hook_internal.h"

#define VERSION_SLOTS 4096u
#define CACHE_ENTRIES 64u
#define LAYOUT_TYPE 0
#define LAYOUT_ROWS 2
#define LAYOUT_COLS 3
#define LAYOUT_BATCH_COUNT 5
#define DESC_TRANSA 3


static _Atomic uint32_t g_versions[VERSION_SLOTS];

static uint32_t version_slot(const void *p)
{
    return (uint32_t)((((uintptr_t)p >> 4) * 2654435761u) >> 8) & (VERSION_SLOTS - 1);
}

static uint32_t version_of(const void *p)
{
    return atomic_load_explicit(&g_versions[version_slot(p)], memory_order_acquire);
}

static void bump(const void *p) { atomic_fetch_add_explicit(&g_versions[version_slot(p)], 1, memory_order_acq_rel); }

typedef struct lt_shape {
    const void *desc, *a, *d;
    uint32_t vdesc, va, vd;
    int valid, dtype;
    int64_t b, m, n, k;
} lt_shape;

static __thread lt_shape t_cache[CACHE_ENTRIES];

typedef int (*layout_get_fn)(void *layout, int attr, void *buf, size_t size, size_t *written);
typedef int (*desc_get_fn)(void *desc, int attr, void *buf, size_t size, size_t *written);

static int read_shape(lt_shape *s, void *desc, void *a, void *d)
{
    layout_get_fn lget = TP_REAL(layout_get_fn, "cublasLtMatrixLayoutGetAttribute");
    desc_get_fn dget = TP_REAL(desc_get_fn, "cublasLtMatmulDescGetAttribute");
    if (!lget || !dget) return 0;
    int32_t transa = 0, batch = 1;
    uint32_t type = 0;
    uint64_t a_rows = 0, a_cols = 0, d_rows = 0, d_cols = 0;
    size_t w;
    if (dget(desc, DESC_TRANSA, &transa, sizeof(transa), &w) || lget(a, LAYOUT_TYPE, &type, sizeof(type), &w) ||
        lget(a, LAYOUT_ROWS, &a_rows, sizeof(a_rows), &w) || lget(a, LAYOUT_COLS, &a_cols, sizeof(a_cols), &w) ||
        lget(d, LAYOUT_ROWS, &d_rows, sizeof(d_rows), &w) || lget(d, LAYOUT_COLS, &d_cols, sizeof(d_cols), &w) ||
        lget(d, LAYOUT_BATCH_COUNT, &batch, sizeof(batch), &w))
        return 0;
    s->dtype = (int)type;
    s->m = (int64_t)d_rows;
    s->n = (int64_t)d_cols;
    s->k = (int64_t)(transa ? a_rows : a_cols);
    s->b = batch > 0 ? batch : 1;
    return 1;
}

static const lt_shape *shape_of(void *desc, void *a, void *d)
{
    uintptr_t h = ((uintptr_t)desc ^ ((uintptr_t)a << 1) ^ ((uintptr_t)d << 2)) >> 4;
    lt_shape *s = &t_cache[(h * 2654435761u >> 16) & (CACHE_ENTRIES - 1)];
    uint32_t vdesc = version_of(desc), va = version_of(a), vd = version_of(d);
    if (s->valid && s->desc == desc && s->a == a && s->d == d && s->vdesc == vdesc && s->va == va && s->vd == vd)
        return s;
    s->valid = read_shape(s, desc, a, d);
    s->desc = desc, s->a = a, s->d = d;
    s->vdesc = vdesc, s->va = va, s->vd = vd;
    return s->valid ? s : NULL;
}

typedef int (*lt_matmul_fn)(void *handle, void *desc, const void *alpha, const void *A, void *Adesc, const void *B,
                            void *Bdesc, const void *beta, const void *C, void *Cdesc, void *D, void *Ddesc,
                            const void *algo, void *workspace, size_t workspace_size, void *stream);

TP_EXPORT int cublasLtMatmul(void *handle, void *desc, const void *alpha, const void *A, void *Adesc, const void *B,
                             void *Bdesc, const void *beta, const void *C, void *Cdesc, void *D, void *Ddesc,
                             const void *algo, void *workspace, size_t workspace_size, void *stream)
{
    lt_matmul_fn real = TP_REAL(lt_matmul_fn, "cublasLtMatmul");
    if (TP_UNLIKELY(!real)) return 1; /* CUBLAS_STATUS_NOT_INITIALIZED */
    tp_gemm_call c;
    c.active = 0;
    if (tp_ensure_started()) {
        const lt_shape *s = shape_of(desc, Adesc, Ddesc);
        /* descriptors unreadable: still counted, shape unknown */
        int timed = s ? tp_gemm_begin(&c, "cublasLtMatmul", s->dtype, s->b, s->m, s->n, s->k)
                      : tp_gemm_begin(&c, "cublasLtMatmul", -1, 0, 0, 0, 0);
        if (timed) tp_gemm_time(&c, stream);
    }
    int status = real(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                      workspace_size, stream);
    tp_gemm_end(&c, status);
    return status;
}

/* Descriptor lifecycle interposers: pass through, then invalidate cached
 * shapes for that address. */
#define VERSIONED_CREATE(NAME, PARAMS, ARGS, OBJ)                                          \
    typedef int (*NAME##_fn) PARAMS;                                                        \
    TP_EXPORT int NAME PARAMS                                                               \
    {                                                                                       \
        NAME##_fn real = TP_REAL(NAME##_fn, #NAME);                                         \
        if (TP_UNLIKELY(!real)) return 1;                                                   \
        int status = real ARGS;                                                             \
        if (status == 0) bump(OBJ);                                                         \
        return status;                                                                      \
    }

#define VERSIONED_CHANGE(NAME, PARAMS, ARGS, OBJ)                                          \
    typedef int (*NAME##_fn) PARAMS;                                                        \
    TP_EXPORT int NAME PARAMS                                                               \
    {                                                                                       \
        NAME##_fn real = TP_REAL(NAME##_fn, #NAME);                                         \
        if (TP_UNLIKELY(!real)) return 1;                                                   \
        bump(OBJ);                                                                          \
        return real ARGS;                                                                   \
    }

VERSIONED_CREATE(cublasLtMatrixLayoutCreate, (void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld),
                 (layout, type, rows, cols, ld), *layout)
VERSIONED_CREATE(cublasLtMatmulDescCreate, (void **desc, int compute, int scale), (desc, compute, scale), *desc)
VERSIONED_CHANGE(cublasLtMatrixLayoutInit_internal,
                 (void *layout, size_t size, int type, uint64_t rows, uint64_t cols, int64_t ld),
                 (layout, size, type, rows, cols, ld), layout)
VERSIONED_CHANGE(cublasLtMatmulDescInit_internal, (void *desc, size_t size, int compute, int scale),
                 (desc, size, compute, scale), desc)
VERSIONED_CHANGE(cublasLtMatrixLayoutSetAttribute, (void *layout, int attr, const void *buf, size_t size),
                 (layout, attr, buf, size), layout)
VERSIONED_CHANGE(cublasLtMatmulDescSetAttribute, (void *desc, int attr, const void *buf, size_t size),
                 (desc, attr, buf, size), desc)
VERSIONED_CHANGE(cublasLtMatrixLayoutDestroy, (void *layout), (layout), layout)
VERSIONED_CHANGE(cublasLtMatmulDescDestroy, (void *desc), (desc), desc)
