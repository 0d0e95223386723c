/*
 * ring.c - the submission ring / prompt arena writer and the event ring reader; see ring.h
 * and docs/PROTOCOL.md sections 5-7 for the rules this follows.
 * Non-goals: locking and eventfds (the callers in submit.c and event.c own those).
 */
#include "sdk/ring.h"

#include <errno.h>
#include <string.h>

void sm70__rings_init(struct sm70__rings *r, void *seg, const struct sm70_proto_seg_hdr *h_copy)
{
	struct sm70_proto_seg_hdr *shared = seg;

	r->hdr = shared;
	r->sq = sm70_proto_sq(seg, h_copy);
	r->eq = sm70_proto_eq(seg, h_copy);
	r->arena = sm70_proto_arena(seg, h_copy);
	r->sq_entries = h_copy->sq_entries;
	r->eq_entries = h_copy->eq_entries;
	r->arena_tokens = h_copy->arena_tokens;
	/* The daemon wrote these before sending the fd; they are ours from now on. */
	r->sq_tail = sm70_ring_load_acquire(&shared->sq_tail);
	r->eq_head = sm70_ring_load_acquire(&shared->eq_head);
	r->arena_tail = sm70_ring_load_acquire(&shared->arena_head);
}

int sm70__arena_place(uint32_t tail, uint32_t head, uint32_t cap, uint32_t n, uint32_t *pos)
{
	uint32_t p = tail, slot;

	if (n == 0)
		return -EINVAL;
	if (n > cap)
		return -E2BIG;
	slot = sm70_ring_slot(p, cap);
	if (slot + (uint64_t)n > cap)
		p += cap - slot; /* the skipped tail end is freed with this prompt */
	/* Modular: the space in use after placing is (p + n) - head; a daemon that moved head
	 * past our tail makes this huge, which reads as "full", never as room. An empty arena
	 * (head == tail) is exempt: it counts the skipped end as used, so a prompt longer than
	 * half the arena could otherwise wait forever for space nobody will free. */
	if (head != tail && (uint32_t)(p + n - head) > cap)
		return -EAGAIN;
	*pos = p;
	return 0;
}

int sm70__sq_push(struct sm70__rings *r, struct sm70_proto_sqe *e, const uint32_t *prompt,
		  uint32_t n)
{
	uint32_t head = sm70_ring_load_acquire(&r->hdr->sq_head);
	uint32_t used = sm70_ring_count(head, r->sq_tail);
	uint32_t pos = 0;
	int ret;

	if (used > r->sq_entries)
		return -EPROTO;
	if (used == r->sq_entries)
		return -EAGAIN;
	if (n) {
		/* Acquire: the daemon's copy-out of older prompts is complete before we
		 * overwrite their tokens. */
		ret = sm70__arena_place(r->arena_tail, sm70_ring_load_acquire(&r->hdr->arena_head),
					r->arena_tokens, n, &pos);
		if (ret)
			return ret;
		memcpy(r->arena + sm70_ring_slot(pos, r->arena_tokens), prompt,
		       sizeof(*prompt) * n);
		e->arena_pos = pos;
		r->arena_tail = pos + n;
	}
	memcpy(&r->sq[sm70_ring_slot(r->sq_tail, r->sq_entries)], e, sizeof(*e));
	r->sq_tail++;
	sm70_ring_store_release(&r->hdr->sq_tail, r->sq_tail);
	return sm70_proto_wake_needed(&r->hdr->daemon_sleeping);
}

int sm70__eq_pending(const struct sm70__rings *r)
{
	uint32_t n = sm70_ring_count(r->eq_head, sm70_ring_load_acquire(&r->hdr->eq_tail));

	return n > r->eq_entries ? -EPROTO : (int)n;
}

int sm70__eq_pop(struct sm70__rings *r, struct sm70_proto_eqe *out, int *ring_doorbell)
{
	int n = sm70__eq_pending(r);

	*ring_doorbell = 0;
	if (n <= 0)
		return n;
	memcpy(out, &r->eq[sm70_ring_slot(r->eq_head, r->eq_entries)], sizeof(*out));
	r->eq_head++;
	/* Release: our copy of the slot is complete before the daemon may reuse it. */
	sm70_ring_store_release(&r->hdr->eq_head, r->eq_head);
	/* A daemon waiting for space needs one wakeup, not one per event: check its flag when
	 * the ring is down to half and when it is empty (a client drains to empty before it
	 * sleeps, so the wakeup is never lost). */
	if (n - 1 == 0 || (uint32_t)(n - 1) == r->eq_entries / 2)
		*ring_doorbell = sm70_proto_wake_needed(&r->hdr->eq_space_wanted);
	return 1;
}
