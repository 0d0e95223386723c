/* fuzz_validate - libFuzzer target: arbitrary bytes as an entry for sm70_proto_validate_submit. */
/*
 * The first 128 bytes are the entry (shorter inputs are zero-padded, as if the client left
 * the rest of its slot zero); byte 128, when present, picks the message buffer length and
 * byte 129 the arena capacity (a power of two). The limits are fixed. Besides the
 * sanitizers' checks, every verdict is checked against an independent reading of
 * PROTOCOL.md section 4.5: an accepted entry satisfies every rule, a refused one has a
 * known code and a NUL-terminated message that starts with a field name. A violation
 * aborts, which libFuzzer reports as a crash.
 * Built and run by tests/fuzz/run.sh (clang -fsanitize=fuzzer,address,undefined).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shm_proto/sm70_proto.h"
#include "shm_proto/sm70_validate.h"

static const struct sm70_proto_limits lim = {
	.max_jobs_in_flight = 64,
	.max_prompt_tokens = 32768,
	.max_new_tokens = 8192,
	.max_context_tokens = 40960,
	.max_top_logprobs = 5,
	.max_priority = 3,
	.vocab_size = 151936,
	.slow_consumer_ms = 5000,
};

/* Field names a refusal may start with (the name before ':' or '['). */
static const char *const fields[] = {
	"size", "opcode", "priority", "flags", "tag", "arena_pos", "prompt_len",
	"max_new_tokens", "temperature", "top_p", "top_k", "seed", "top_logprobs",
	"deadline_ms", "n_stop", "stop", "reserved0", "reserved",
};

static void violation(const char *what)
{
	fprintf(stderr, "fuzz_validate: %s\n", what);
	abort();
}

/* The protocol's rules for an accepted entry, written from PROTOCOL.md, not the code. */
static void check_accepted(const struct sm70_proto_sqe *e, uint32_t cap)
{
	uint32_t max_top = lim.max_top_logprobs < SM70_PROTO_MAX_TOP ? lim.max_top_logprobs :
								       SM70_PROTO_MAX_TOP;

	if (e->size != sizeof(*e))
		violation("accepted an entry with a wrong size");
	if (e->reserved0 || e->reserved[0] || e->reserved[1] || e->reserved[2] || e->reserved[3])
		violation("accepted nonzero reserved fields");
	if (e->opcode == SM70_PROTO_OP_CANCEL) {
		struct sm70_proto_sqe z;

		memset(&z, 0, sizeof(z));
		z.size = e->size;
		z.opcode = e->opcode;
		z.tag = e->tag;
		if (memcmp(&z, e, sizeof(z)))
			violation("accepted a CANCEL with nonzero fields");
		return;
	}
	if (e->opcode != SM70_PROTO_OP_SUBMIT)
		violation("accepted an unknown opcode");
	if (e->priority > lim.max_priority || (e->flags & ~SM70_PROTO_SQF_KNOWN))
		violation("accepted a bad priority or flags");
	if (e->prompt_len < 1 || e->prompt_len > lim.max_prompt_tokens ||
	    (uint64_t)(e->arena_pos & (cap - 1)) + e->prompt_len > cap)
		violation("accepted a prompt outside the arena or the limit");
	if (e->max_new_tokens < 1 || e->max_new_tokens > lim.max_new_tokens ||
	    (uint64_t)e->prompt_len + e->max_new_tokens > lim.max_context_tokens)
		violation("accepted max_new_tokens above a limit");
	if (!isfinite(e->temperature) || e->temperature < 0.0f)
		violation("accepted a bad temperature");
	if (!(e->top_p > 0.0f) || e->top_p > 1.0f || e->top_k < 0)
		violation("accepted a bad top_p or top_k");
	if (!(e->flags & SM70_PROTO_SQF_SEED) && e->seed)
		violation("accepted a seed without SQF_SEED");
	if (e->top_logprobs > max_top || e->n_stop > SM70_PROTO_MAX_STOP)
		violation("accepted top_logprobs or n_stop above a limit");
	for (uint32_t i = 0; i < SM70_PROTO_MAX_STOP; i++)
		if (i < e->n_stop ? e->stop[i] >= lim.vocab_size : e->stop[i] != 0)
			violation("accepted a bad stop slot");
}

static void check_refused(int ret, const char *why, size_t whylen)
{
	size_t n, k;

	if (ret != -SM70_PROTO_E_INVALID && ret != -SM70_PROTO_E_TOO_LARGE)
		violation("refused with an unexpected code");
	if (!whylen)
		return;
	n = strnlen(why, whylen);
	if (n == whylen)
		violation("message not NUL-terminated within its buffer");
	if (whylen < 24)
		return; /* too short to hold a whole field name */
	for (k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
		size_t fl = strlen(fields[k]);

		if (!strncmp(why, fields[k], fl) && (why[fl] == ':' || why[fl] == '[' ||
						     why[fl] == '/' || why[fl] == ' '))
			return;
	}
	fprintf(stderr, "message: \"%s\"\n", why);
	violation("message does not start with a field name");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sm70_proto_sqe e;
	char why[SM70_PROTO_ERRMSG_LEN + 8];
	size_t whylen = sizeof(why) - 8;
	uint32_t cap = 65536;
	int ret;

	memset(&e, 0, sizeof(e));
	memcpy(&e, data, size < sizeof(e) ? size : sizeof(e));
	if (size > sizeof(e))
		whylen = data[sizeof(e)] % (SM70_PROTO_ERRMSG_LEN + 1);
	if (size > sizeof(e) + 1)
		cap = 1u << (data[sizeof(e) + 1] % 32);
	memset(why, 0x5a, sizeof(why));
	ret = sm70_proto_validate_submit(&e, &lim, cap, whylen ? why : NULL, whylen);
	for (size_t i = whylen; i < sizeof(why); i++)
		if ((unsigned char)why[i] != 0x5a)
			violation("message written past its buffer");
	if (ret == 0)
		check_accepted(&e, cap);
	else
		check_refused(ret, why, whylen);
	return 0;
}
