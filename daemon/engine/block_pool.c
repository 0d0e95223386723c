/* block_pool.c - free list and reference counts of KV cache blocks; see block_pool.h. */
#include "daemon/engine/block_pool.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

int sm70_block_pool_init(struct sm70_block_pool *p, int n_blocks)
{
	if (n_blocks <= 0)
		return -EINVAL;
	p->free_ids = malloc(sizeof(*p->free_ids) * (size_t)n_blocks);
	p->refs = calloc((size_t)n_blocks, sizeof(*p->refs));
	if (!p->free_ids || !p->refs) {
		free(p->free_ids);
		free(p->refs);
		return -ENOMEM;
	}
	p->n_blocks = n_blocks;
	p->n_free = n_blocks;
	/* Hand out low ids first: easier to read in dumps, no other reason. */
	for (int i = 0; i < n_blocks; i++)
		p->free_ids[i] = n_blocks - 1 - i;
	return 0;
}

void sm70_block_pool_fini(struct sm70_block_pool *p)
{
	free(p->free_ids);
	free(p->refs);
	p->free_ids = NULL;
	p->refs = NULL;
	p->n_blocks = p->n_free = 0;
}

int32_t sm70_block_pool_alloc(struct sm70_block_pool *p)
{
	int32_t id;

	if (p->n_free == 0)
		return -ENOSPC;
	id = p->free_ids[--p->n_free];
	p->refs[id] = 1;
	return id;
}

void sm70_block_pool_ref(struct sm70_block_pool *p, int32_t id)
{
	assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
	p->refs[id]++;
}

void sm70_block_pool_unref(struct sm70_block_pool *p, int32_t id)
{
	assert(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
	if (--p->refs[id] == 0)
		p->free_ids[p->n_free++] = id;
}
