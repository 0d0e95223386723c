/*
 * ring.h - libsm70client's side of the shared rings: the submission ring and prompt arena
 * writer and the event ring reader, as pure functions over a mapped segment.
 *
 * They hold no locks and make no system calls: they report "ring the doorbell" to the
 * caller instead of writing the eventfd, so tests/integration/test_sdk.c can drive them
 * against a segment in ordinary memory, playing the daemon. Internal to the library
 * (hidden symbols, sm70__ prefix). Non-goals: waiting, job bookkeeping (see client_impl.h).
 */
#ifndef SM70_SDK_RING_H
#define SM70_SDK_RING_H

#include <stdint.h>

#include "shm_proto/sm70_proto.h"

/* The client's view of one session's segment. Shared pointers point into the mapping; the
 * three indices are the client's own, kept privately (PROTOCOL.md section 5). */
struct sm70__rings {
	struct sm70_proto_seg_hdr *hdr; /* shared header */
	struct sm70_proto_sqe *sq;
	struct sm70_proto_eqe *eq;
	uint32_t *arena;
	uint32_t sq_entries;
	uint32_t eq_entries;
	uint32_t arena_tokens;
	uint32_t sq_tail;    /* one past the last entry we published */
	uint32_t eq_head;    /* next event we read */
	uint32_t arena_tail; /* next free arena position (free-running) */
};

/*
 * Binds r to the segment at seg whose header was already checked (h_copy is the private,
 * validated copy) and loads the starting indices from the shared header, which need not be
 * zero.
 */
void sm70__rings_init(struct sm70__rings *r, void *seg, const struct sm70_proto_seg_hdr *h_copy);

/*
 * Where an n-token prompt goes in an arena of cap tokens (a power of two) whose client
 * position is tail and daemon free position is head: contiguous, skipping to the arena start
 * when it would wrap past the end. Stores the free-running start in *pos. An empty arena
 * (head == tail) takes any n <= cap.
 * Returns 0, -E2BIG if n > cap (never fits), -EINVAL if n == 0, -EAGAIN if not enough space
 * is free yet.
 */
int sm70__arena_place(uint32_t tail, uint32_t head, uint32_t cap, uint32_t n, uint32_t *pos);

/*
 * Publishes one entry: for n > 0 first copies the n prompt ids into the arena and sets
 * e->arena_pos, then writes *e into the next SQ slot and release-stores sq_tail, then
 * fences and checks daemon_sleeping. e is the caller's private, fully formed entry.
 * Returns 1 if the caller must ring the doorbell, 0 if not, -EAGAIN when the SQ or the
 * arena is full, -E2BIG for a prompt larger than the arena, -EPROTO if the daemon's sq_head
 * is impossible. Nothing is published on error. Caller serializes producers.
 */
int sm70__sq_push(struct sm70__rings *r, struct sm70_proto_sqe *e, const uint32_t *prompt,
		  uint32_t n);

/*
 * Copies the next event into *out and frees its slot (release-store of eq_head). Sets
 * *ring_doorbell to 1 if the daemon asked to be told about new event space.
 * Returns 1 with an event, 0 if the ring is empty, -EPROTO if the daemon's eq_tail is
 * impossible (more than eq_entries ahead). Single consumer.
 */
int sm70__eq_pop(struct sm70__rings *r, struct sm70_proto_eqe *out, int *ring_doorbell);

/* Events published and not yet read (acquire-load of eq_tail), or -EPROTO as above. */
int sm70__eq_pending(const struct sm70__rings *r);

#endif
