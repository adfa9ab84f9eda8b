/* Bounded multi-producer / multi-consumer queue of fixed-size elements
 * (per-cell sequence numbers, after D. Vyukov's design).  Producers never
 * block: a full queue refuses the element. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "hook_internal.h"

typedef struct tp_cell {
    _Atomic uint64_t seq;
} tp_cell;

struct tp_queue {
    _Alignas(64) _Atomic uint64_t head;  /* next cell to push */
    _Alignas(64) _Atomic uint64_t tail;  /* next cell to pop */
    uint64_t mask;
    uint32_t elem_size;
    uint32_t stride;
    unsigned char *cells;
};

static tp_cell *cell_at(tp_queue *q, uint64_t pos)
{
    return (tp_cell *)(q->cells + (pos & q->mask) * q->stride);
}

void tp_queue_reset(tp_queue *q)
{
    for (uint64_t i = 0; i <= q->mask; i++) atomic_store_explicit(&cell_at(q, i)->seq, i, memory_order_relaxed);
    atomic_store(&q->head, 0);
    atomic_store(&q->tail, 0);
}

void tp_queue_free(tp_queue *q)
{
    free(q->cells);
    free(q);
}

tp_queue *tp_queue_create(uint32_t capacity_pow2, uint32_t elem_size)
{
    tp_queue *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->mask = capacity_pow2 - 1;
    q->elem_size = elem_size;
    q->stride = (uint32_t)((sizeof(tp_cell) + elem_size + 7u) & ~7u);
    q->cells = malloc((size_t)q->stride * capacity_pow2);
    if (!q->cells) {
        free(q);
        return NULL;
    }
    tp_queue_reset(q);
    return q;
}

int tp_queue_push(tp_queue *q, const void *elem)
{
    uint64_t pos = atomic_load_explicit(&q->head, memory_order_relaxed);
    for (;;) {
        tp_cell *c = cell_at(q, pos);
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t diff = (int64_t)seq - (int64_t)pos;
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&q->head, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                memcpy(c + 1, elem, q->elem_size);
                atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
                return 1;
            }
        } else if (diff < 0) {
            return 0; /* full */
        } else {
            pos = atomic_load_explicit(&q->head, memory_order_relaxed);
        }
    }
}

int tp_queue_pop(tp_queue *q, void *elem)
{
    uint64_t pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
    for (;;) {
        tp_cell *c = cell_at(q, pos);
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t diff = (int64_t)seq - (int64_t)(pos + 1);
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                memcpy(elem, c + 1, q->elem_size);
                atomic_store_explicit(&c->seq, pos + q->mask + 1, memory_order_release);
                return 1;
            }
        } else if (diff < 0) {
            return 0; /* empty */
        } else {
            pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
        }
    }
}

int tp_queue_empty(tp_queue *q)
{
    uint64_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    return atomic_load_explicit(&q->head, memory_order_acquire) == tail;
}
