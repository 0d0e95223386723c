/*
 * sm70_validate.c - validation of submission entries and segment headers; see sm70_validate.h.
 *
 * Everything here works on private copies and uses 64-bit arithmetic for every sum of
 * client-supplied values, so no input can overflow a check. The first failing field wins:
 * the message names it so a client author can fix it without reading daemon logs.
 */
#include "shm_proto/sm70_validate.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SEG_ALIGN 4096u

/* Writes the message (if the caller wants one) and returns -code. */
__attribute__((format(printf, 4, 5))) static int fail(char *why, size_t whylen, int code,
						       const char *fmt, ...)
{
	va_list ap;

	if (why && whylen) {
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return -code;
}

/* The SQE's fields by name, for CANCEL (all but size, opcode, tag must be zero). */
struct field {
	const char *name;
	uint16_t off;
	uint16_t len;
};

#define FIELD(f) { #f, offsetof(struct sm70_proto_sqe, f), sizeof(((struct sm70_proto_sqe *)0)->f) }
static const struct field cancel_zero_fields[] = {
	FIELD(priority),       FIELD(flags),	   FIELD(arena_pos),	FIELD(prompt_len),
	FIELD(max_new_tokens), FIELD(temperature), FIELD(top_p),	FIELD(top_k),
	FIELD(seed),	       FIELD(top_logprobs), FIELD(deadline_ms), FIELD(n_stop),
	FIELD(stop),	       FIELD(reserved0),   FIELD(reserved),
};
#undef FIELD

static int all_zero(const void *p, size_t n)
{
	const unsigned char *b = p;
	size_t i;

	for (i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

static int check_cancel(const struct sm70_proto_sqe *e, char *why, size_t whylen)
{
	size_t i;

	for (i = 0; i < sizeof(cancel_zero_fields) / sizeof(cancel_zero_fields[0]); i++) {
		const struct field *f = &cancel_zero_fields[i];

		if (!all_zero((const char *)e + f->off, f->len))
			return fail(why, whylen, SM70_PROTO_E_INVALID,
				    "%s: must be zero in a CANCEL entry", f->name);
	}
	return 0;
}

static int check_submit(const struct sm70_proto_sqe *e, const struct sm70_proto_limits *lim,
			uint32_t cap, char *why, size_t whylen)
{
	uint64_t slot, ctx;
	uint32_t i, max_top;

	if (e->priority > lim->max_priority)
		return fail(why, whylen, SM70_PROTO_E_INVALID, "priority: %u above the limit %u",
			    e->priority, lim->max_priority);
	if (e->flags & ~SM70_PROTO_SQF_KNOWN)
		return fail(why, whylen, SM70_PROTO_E_INVALID, "flags: unknown bits 0x%x",
			    e->flags & ~SM70_PROTO_SQF_KNOWN);

	if (e->prompt_len == 0)
		return fail(why, whylen, SM70_PROTO_E_INVALID, "prompt_len: must be at least 1");
	/* The range check comes before the limit check: a range outside the arena is a broken
	 * client, a long prompt inside it a policy matter. */
	slot = sm70_ring_slot(e->arena_pos, cap);
	if (slot + e->prompt_len > cap)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "arena_pos/prompt_len: tokens %llu..%llu pass the arena end %u",
			    (unsigned long long)slot,
			    (unsigned long long)(slot + e->prompt_len), cap);
	if (e->prompt_len > lim->max_prompt_tokens)
		return fail(why, whylen, SM70_PROTO_E_TOO_LARGE,
			    "prompt_len: %u above the limit %u", e->prompt_len,
			    lim->max_prompt_tokens);

	if (e->max_new_tokens == 0)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "max_new_tokens: must be at least 1");
	if (e->max_new_tokens > lim->max_new_tokens)
		return fail(why, whylen, SM70_PROTO_E_TOO_LARGE,
			    "max_new_tokens: %u above the limit %u", e->max_new_tokens,
			    lim->max_new_tokens);
	ctx = (uint64_t)e->prompt_len + e->max_new_tokens;
	if (ctx > lim->max_context_tokens)
		return fail(why, whylen, SM70_PROTO_E_TOO_LARGE,
			    "prompt_len + max_new_tokens: %llu above the context limit %u",
			    (unsigned long long)ctx, lim->max_context_tokens);

	/* Written so that NaN fails every comparison and lands in the error branch. %.9g:
	 * enough digits to tell any float from its neighbours (1.0000001f is not "1"). */
	if (!isfinite(e->temperature) || !(e->temperature >= 0.0f))
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "temperature: must be finite and >= 0 (got %.9g)",
			    (double)e->temperature);
	if (!(e->top_p > 0.0f && e->top_p <= 1.0f))
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "top_p: must be in (0, 1] (got %.9g)", (double)e->top_p);
	if (e->top_k < 0)
		return fail(why, whylen, SM70_PROTO_E_INVALID, "top_k: must be >= 0 (got %d)",
			    (int)e->top_k);
	if (!(e->flags & SM70_PROTO_SQF_SEED) && e->seed != 0)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "seed: must be 0 without SM70_PROTO_SQF_SEED");

	max_top = lim->max_top_logprobs < SM70_PROTO_MAX_TOP ? lim->max_top_logprobs
							     : SM70_PROTO_MAX_TOP;
	if (e->top_logprobs > max_top)
		return fail(why, whylen,
			    e->top_logprobs > SM70_PROTO_MAX_TOP ? SM70_PROTO_E_INVALID
								 : SM70_PROTO_E_TOO_LARGE,
			    "top_logprobs: %u above the limit %u", e->top_logprobs, max_top);

	if (e->n_stop > SM70_PROTO_MAX_STOP)
		return fail(why, whylen, SM70_PROTO_E_INVALID, "n_stop: %u above the maximum %u",
			    e->n_stop, SM70_PROTO_MAX_STOP);
	for (i = 0; i < SM70_PROTO_MAX_STOP; i++) {
		if (i >= e->n_stop && e->stop[i] != 0)
			return fail(why, whylen, SM70_PROTO_E_INVALID,
				    "stop[%u]: unused slot must be zero", i);
		if (i < e->n_stop && lim->vocab_size && e->stop[i] >= lim->vocab_size)
			return fail(why, whylen, SM70_PROTO_E_INVALID,
				    "stop[%u]: token %u not below the vocab size %u", i,
				    e->stop[i], lim->vocab_size);
	}

	if (e->reserved0 != 0)
		return fail(why, whylen, SM70_PROTO_E_INVALID, "reserved0: must be zero");
	for (i = 0; i < sizeof(e->reserved) / sizeof(e->reserved[0]); i++)
		if (e->reserved[i] != 0)
			return fail(why, whylen, SM70_PROTO_E_INVALID,
				    "reserved[%u]: must be zero", i);
	return 0;
}

int sm70_proto_validate_submit(const struct sm70_proto_sqe *e_copy,
			       const struct sm70_proto_limits *lim, uint32_t arena_capacity_tokens,
			       char *why, size_t whylen)
{
	if (why && whylen)
		why[0] = '\0';
	if (!e_copy || !lim || !sm70_ring_cap_ok(arena_capacity_tokens))
		return fail(why, whylen, SM70_PROTO_E_INTERNAL,
			    "validator called with a bad argument");

	if (e_copy->size != sizeof(struct sm70_proto_sqe))
		return fail(why, whylen, SM70_PROTO_E_INVALID, "size: must be %zu (got %u)",
			    sizeof(struct sm70_proto_sqe), e_copy->size);
	switch (e_copy->opcode) {
	case SM70_PROTO_OP_SUBMIT:
		return check_submit(e_copy, lim, arena_capacity_tokens, why, whylen);
	case SM70_PROTO_OP_CANCEL:
		return check_cancel(e_copy, why, whylen);
	default:
		return fail(why, whylen, SM70_PROTO_E_INVALID, "opcode: unknown value %u",
			    e_copy->opcode);
	}
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

int sm70_proto_layout_init(struct sm70_proto_seg_hdr *h, uint32_t sq_entries,
			   uint32_t eq_entries, uint32_t arena_tokens, uint32_t start_index)
{
	if (!sm70_ring_cap_ok(sq_entries) || !sm70_ring_cap_ok(eq_entries) ||
	    !sm70_ring_cap_ok(arena_tokens))
		return -SM70_PROTO_E_INVALID;

	memset(h, 0, sizeof(*h));
	h->magic = SM70_PROTO_MAGIC;
	h->version_major = SM70_PROTO_VERSION_MAJOR;
	h->version_minor = SM70_PROTO_VERSION_MINOR;
	h->header_size = sizeof(*h);
	h->sqe_size = sizeof(struct sm70_proto_sqe);
	h->eqe_size = sizeof(struct sm70_proto_eqe);
	h->sq_entries = sq_entries;
	h->eq_entries = eq_entries;
	h->arena_tokens = arena_tokens;
	/* Each term is below 2^32 * 2^7, so none of these sums can overflow 64 bits. */
	h->sq_offset = align_up(sizeof(*h), SEG_ALIGN);
	h->eq_offset = align_up(h->sq_offset + (uint64_t)sq_entries * h->sqe_size, SEG_ALIGN);
	h->arena_offset = align_up(h->eq_offset + (uint64_t)eq_entries * h->eqe_size, SEG_ALIGN);
	h->total_size = align_up(h->arena_offset + (uint64_t)arena_tokens * sizeof(uint32_t),
				 SEG_ALIGN);
	h->sq_head = h->sq_tail = start_index;
	h->eq_head = h->eq_tail = start_index;
	h->arena_head = start_index;
	return 0;
}

/* Checks that [off, off + n * size) lies in [lo, total) and is 64-byte aligned; returns the
 * end through *end. n and size are at most 2^32 and 2^16, so n * size cannot overflow. */
static int check_region(const char *name, uint64_t off, uint32_t n, uint32_t size, uint64_t lo,
			uint64_t total, uint64_t *end, char *why, size_t whylen)
{
	uint64_t len = (uint64_t)n * size;

	if (off % SM70_PROTO_CACHELINE)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "%s_offset: %llu not 64-byte aligned", name, (unsigned long long)off);
	if (off < lo || off > total || len > total - off)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "%s_offset: region %llu+%llu outside the segment "
			    "(header %llu, size %llu)",
			    name, (unsigned long long)off, (unsigned long long)len,
			    (unsigned long long)lo, (unsigned long long)total);
	*end = off + len;
	return 0;
}

static int overlap(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1)
{
	return a0 < b1 && b0 < a1;
}

int sm70_proto_layout_check(const struct sm70_proto_seg_hdr *h, uint64_t mapped_size, char *why,
			    size_t whylen)
{
	uint64_t sq_end, eq_end, ar_end;
	int ret;

	if (why && whylen)
		why[0] = '\0';
	if (!h)
		return fail(why, whylen, SM70_PROTO_E_INTERNAL, "no header");
	if (h->magic != SM70_PROTO_MAGIC)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "magic: 0x%08x is not an sm70 segment", h->magic);
	if (h->version_major != SM70_PROTO_VERSION_MAJOR)
		return fail(why, whylen, SM70_PROTO_E_VERSION,
			    "version_major: segment is protocol %u, this client speaks %u",
			    h->version_major, SM70_PROTO_VERSION_MAJOR);
	if (h->header_size < sizeof(*h))
		return fail(why, whylen, SM70_PROTO_E_INVALID, "header_size: %u below %zu",
			    h->header_size, sizeof(*h));
	if (h->total_size != mapped_size)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "total_size: %llu but %llu bytes are mapped",
			    (unsigned long long)h->total_size, (unsigned long long)mapped_size);
	if (h->header_size > mapped_size)
		return fail(why, whylen, SM70_PROTO_E_INVALID, "header_size: %u past the segment",
			    h->header_size);
	if (h->sqe_size != sizeof(struct sm70_proto_sqe))
		return fail(why, whylen, SM70_PROTO_E_INVALID, "sqe_size: %u, expected %zu",
			    h->sqe_size, sizeof(struct sm70_proto_sqe));
	if (h->eqe_size != sizeof(struct sm70_proto_eqe))
		return fail(why, whylen, SM70_PROTO_E_INVALID, "eqe_size: %u, expected %zu",
			    h->eqe_size, sizeof(struct sm70_proto_eqe));
	if (!sm70_ring_cap_ok(h->sq_entries))
		return fail(why, whylen, SM70_PROTO_E_INVALID, "sq_entries: %u not a power of two",
			    h->sq_entries);
	if (!sm70_ring_cap_ok(h->eq_entries))
		return fail(why, whylen, SM70_PROTO_E_INVALID, "eq_entries: %u not a power of two",
			    h->eq_entries);
	if (!sm70_ring_cap_ok(h->arena_tokens))
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "arena_tokens: %u not a power of two", h->arena_tokens);
	if (h->limits.max_top_logprobs > SM70_PROTO_MAX_TOP)
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "limits.max_top_logprobs: %u above %u", h->limits.max_top_logprobs,
			    SM70_PROTO_MAX_TOP);

	ret = check_region("sq", h->sq_offset, h->sq_entries, h->sqe_size, h->header_size,
			   mapped_size, &sq_end, why, whylen);
	if (!ret)
		ret = check_region("eq", h->eq_offset, h->eq_entries, h->eqe_size, h->header_size,
				   mapped_size, &eq_end, why, whylen);
	if (!ret)
		ret = check_region("arena", h->arena_offset, h->arena_tokens, sizeof(uint32_t),
				   h->header_size, mapped_size, &ar_end, why, whylen);
	if (ret)
		return ret;
	if (overlap(h->sq_offset, sq_end, h->eq_offset, eq_end) ||
	    overlap(h->sq_offset, sq_end, h->arena_offset, ar_end) ||
	    overlap(h->eq_offset, eq_end, h->arena_offset, ar_end))
		return fail(why, whylen, SM70_PROTO_E_INVALID,
			    "sq_offset/eq_offset/arena_offset: regions overlap");
	return 0;
}
