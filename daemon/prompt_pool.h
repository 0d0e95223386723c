/*
 * prompt_pool.h - a session's private pool for the prompt copies of its queued jobs.
 *
 * A job's prompt is copied out of the client's arena when its SUBMIT is read and kept until
 * the engine takes the job (or the job ends first). Each session keeps those copies in a
 * pool of its own the size of its arena (one private anonymous mapping, reserved at the
 * first copy): so a session's queued prompts can never take more daemon memory than its own
 * arena holds, and when its queue drains the pages go back to the kernel (MADV_DONTNEED),
 * which freed malloc blocks in the middle of the heap do not. A SUBMIT that does not fit
 * waits in the session's SQ until the pool has room (session.c).
 *
 * A ring of blocks, each one header word (its size in words, and a freed bit) and the
 * tokens; a block never wraps (the end of the ring is skipped, as the client's arena does);
 * blocks may be freed in any order, and the oldest end moves past freed blocks. Non-goals:
 * threads (the daemon's one thread only), sharing between sessions.
 */
#ifndef SM70_DAEMON_PROMPT_POOL_H
#define SM70_DAEMON_PROMPT_POOL_H

#include <stdint.h>

struct sm70__prompt_pool {
	uint32_t *mem;	    /* cap words, or NULL until the first copy */
	uint32_t cap;	    /* words: the arena's tokens + 1 (one header) */
	uint32_t head;	    /* word offset of the oldest block (live or freed) */
	uint32_t tail;	    /* word offset where the next block goes */
	uint32_t used;	    /* words between head and tail, skipped ends included */
	uint32_t live;	    /* blocks not yet freed */
	uint32_t touched;   /* words written since the pages were last given back */
	uint64_t released;  /* times the pages were given back (for tests and logs) */
};

/* An empty pool for prompts of up to max_tokens tokens; nothing is mapped yet. */
void sm70__prompt_pool_init(struct sm70__prompt_pool *p, uint32_t max_tokens);

/* Whether a prompt of n tokens fits now. */
int sm70__prompt_pool_fits(const struct sm70__prompt_pool *p, uint32_t n);

/* Room for n tokens, or NULL: no room now (see fits), or no memory for the mapping. */
int32_t *sm70__prompt_pool_alloc(struct sm70__prompt_pool *p, uint32_t n);

/* Frees a block from alloc (NULL is a no-op). An emptied pool gives its touched pages
 * back if they were more than a few. */
void sm70__prompt_pool_free(struct sm70__prompt_pool *p, int32_t *tokens);

/* Unmaps the pool; every block must have been freed. */
void sm70__prompt_pool_destroy(struct sm70__prompt_pool *p);

#endif
