/*
 * prompt_pool.c - a session's bounded pool of queued prompt copies; see prompt_pool.h.
 */
#include "daemon/prompt_pool.h"

#include <stddef.h>
#include <sys/mman.h>

#define FREED 0x80000000u
/* An emptied pool that had written more than this many words (64 kB) gives its pages
 * back: a session's one small job at a time costs no system call, a burst of large
 * prompts does not stay resident. */
#define KEEP_WORDS (16u * 1024)

void sm70__prompt_pool_init(struct sm70__prompt_pool *p, uint32_t max_tokens)
{
	*p = (struct sm70__prompt_pool){ .cap = max_tokens + 1 };
}

/* Words the next block of n tokens takes, with the skipped end of the ring if it would
 * not fit before the end. */
static uint32_t need(const struct sm70__prompt_pool *p, uint32_t n)
{
	uint32_t words = n + 1;

	return p->tail + words > p->cap ? words + (p->cap - p->tail) : words;
}

int sm70__prompt_pool_fits(const struct sm70__prompt_pool *p, uint32_t n)
{
	return n < p->cap && need(p, n) <= p->cap - p->used;
}

int32_t *sm70__prompt_pool_alloc(struct sm70__prompt_pool *p, uint32_t n)
{
	uint32_t at;

	if (!sm70__prompt_pool_fits(p, n))
		return NULL;
	if (!p->mem) {
		/* private and reserved lazily: a session that never queues costs nothing */
		void *m = mmap(NULL, (size_t)p->cap * sizeof(uint32_t), PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (m == MAP_FAILED)
			return NULL;
		p->mem = m;
	}
	if (p->tail + n + 1 > p->cap) {
		/* skip the end: one freed block up to it (the tail is below cap, so the
		 * header word fits) */
		p->mem[p->tail] = (p->cap - p->tail) | FREED;
		if (p->tail + 1 > p->touched)
			p->touched = p->tail + 1;
		p->used += p->cap - p->tail;
		p->tail = 0;
	}
	at = p->tail;
	p->mem[at] = n + 1;
	p->tail += n + 1;
	if (p->tail == p->cap)
		p->tail = 0;
	p->used += n + 1;
	p->live++;
	if (at + n + 1 > p->touched)
		p->touched = at + n + 1;
	return (int32_t *)(p->mem + at + 1);
}

void sm70__prompt_pool_free(struct sm70__prompt_pool *p, int32_t *tokens)
{
	uint32_t *h;

	if (!tokens)
		return;
	h = (uint32_t *)tokens - 1;
	*h |= FREED;
	p->live--;
	/* the oldest end moves past every freed block */
	while (p->used && (p->mem[p->head] & FREED)) {
		uint32_t size = p->mem[p->head] & ~FREED;

		p->used -= size;
		p->head += size;
		if (p->head >= p->cap)
			p->head = 0;
	}
	if (p->used)
		return;
	/* empty: start again at the front, and give back what a burst touched */
	p->head = p->tail = 0;
	if (p->touched > KEEP_WORDS) {
		madvise(p->mem, (size_t)p->touched * sizeof(uint32_t), MADV_DONTNEED);
		p->released++;
	}
	p->touched = 0;
}

void sm70__prompt_pool_destroy(struct sm70__prompt_pool *p)
{
	if (p->mem)
		munmap(p->mem, (size_t)p->cap * sizeof(uint32_t));
	p->mem = NULL;
	p->used = p->live = p->head = p->tail = p->touched = 0;
}
