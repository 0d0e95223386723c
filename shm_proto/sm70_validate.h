/*
 * sm70_validate.h - checks of records that cross the client <-> daemon boundary.
 *
 * The daemon validates every submission entry after copying it out of shared memory, with
 * sm70_proto_validate_submit; that function is also the libFuzzer target. The segment layout
 * helpers let the daemon build a header and a client check the one it mapped.
 * Non-goals: these functions never touch shared memory themselves (callers pass private
 * copies), never allocate, and hold no state; they are safe to call from any thread.
 */
#ifndef SM70_VALIDATE_H
#define SM70_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "shm_proto/sm70_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Checks every field of a submission entry (SUBMIT or CANCEL) against the protocol and the
 * session limits. e_copy must be the daemon's private copy, never the shared slot, so the
 * client cannot change a field after it was checked. arena_capacity_tokens is the session's
 * arena size (a power of two). Token ids inside the prompt are not checked here: they are
 * checked as the prompt is copied out of the arena.
 *
 * Returns 0, or a negated sm70_proto_error (E_INVALID for a malformed field, E_TOO_LARGE for
 * a length above a limit, E_INTERNAL for a bad argument) and then, when why is non-NULL and
 * whylen > 0, writes one NUL-terminated line into why that starts with the field's name,
 * e.g. "top_p: must be in (0, 1] (got 1.5)". Lines fit SM70_PROTO_ERRMSG_LEN.
 */
int sm70_proto_validate_submit(const struct sm70_proto_sqe *e_copy,
			       const struct sm70_proto_limits *lim, uint32_t arena_capacity_tokens,
			       char *why, size_t whylen);

/*
 * Fills the identity and layout part of a segment header for rings of sq_entries and
 * eq_entries and an arena of arena_tokens (each a power of two): the header at offset 0,
 * then the SQ, the event ring and the arena, each starting on a 4096-byte boundary; sets
 * every index to start_index (the daemon may start near 2^32 to exercise wraparound) and
 * clears the flags. The caller fills limits and session_id. Returns 0 or
 * -SM70_PROTO_E_INVALID if a size is not a power of two; h->total_size is the memfd size.
 */
int sm70_proto_layout_init(struct sm70_proto_seg_hdr *h, uint32_t sq_entries,
			   uint32_t eq_entries, uint32_t arena_tokens, uint32_t start_index);

/*
 * Checks a private copy of a mapped segment's header: magic, major version, record sizes,
 * power-of-two capacities, and that the header, SQ, event ring and arena lie inside
 * mapped_size without overlapping (overflow-safe). A client calls it once after mmap before
 * trusting any offset. Returns 0 or -SM70_PROTO_E_VERSION / -SM70_PROTO_E_INVALID with a
 * line in why (as above).
 */
int sm70_proto_layout_check(const struct sm70_proto_seg_hdr *h_copy, uint64_t mapped_size,
			    char *why, size_t whylen);

#ifdef __cplusplus
}
#endif

#endif
