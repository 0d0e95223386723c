/* test_proto - the shared-memory ABI: record layout, ring index rules, wakeup protocol, and
 * validation of submission entries and segment headers. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

/* Every build of this test proves the ABI header has no implicit padding: -Wpadded is an
 * error while the header is parsed. */
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#include "shm_proto/sm70_proto.h"
#pragma GCC diagnostic pop
#include "shm_proto/sm70_validate.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- static layout facts --------------------------------------------------------------- */

static void test_layout_facts(void **state)
{
	(void)state;
	/* The _Static_asserts in the header already pin every offset; this prints the numbers
	 * a client author would look up, and checks the cache-line rule at run time too. */
	printf("sizeof hello %zu welcome %zu refusal %zu limits %zu seg_hdr %zu sqe %zu eqe %zu\n",
	       sizeof(struct sm70_proto_hello), sizeof(struct sm70_proto_welcome),
	       sizeof(struct sm70_proto_refusal), sizeof(struct sm70_proto_limits),
	       sizeof(struct sm70_proto_seg_hdr), sizeof(struct sm70_proto_sqe),
	       sizeof(struct sm70_proto_eqe));
	printf("seg_hdr: sq_head %zu sq_tail %zu eq_head %zu eq_tail %zu arena_head %zu "
	       "daemon_sleeping %zu client_sleeping %zu eq_space_wanted %zu\n",
	       offsetof(struct sm70_proto_seg_hdr, sq_head),
	       offsetof(struct sm70_proto_seg_hdr, sq_tail),
	       offsetof(struct sm70_proto_seg_hdr, eq_head),
	       offsetof(struct sm70_proto_seg_hdr, eq_tail),
	       offsetof(struct sm70_proto_seg_hdr, arena_head),
	       offsetof(struct sm70_proto_seg_hdr, daemon_sleeping),
	       offsetof(struct sm70_proto_seg_hdr, client_sleeping),
	       offsetof(struct sm70_proto_seg_hdr, eq_space_wanted));
	printf("eqe: token body %zu top[0] %zu finish.ttft_us %zu error.message %zu\n",
	       offsetof(struct sm70_proto_eqe, u.token),
	       offsetof(struct sm70_proto_eqe, u.token.top),
	       offsetof(struct sm70_proto_eqe, u.finish.ttft_us),
	       offsetof(struct sm70_proto_eqe, u.error.message));

	size_t idx[] = {
		offsetof(struct sm70_proto_seg_hdr, sq_head),
		offsetof(struct sm70_proto_seg_hdr, sq_tail),
		offsetof(struct sm70_proto_seg_hdr, eq_head),
		offsetof(struct sm70_proto_seg_hdr, eq_tail),
		offsetof(struct sm70_proto_seg_hdr, arena_head),
		offsetof(struct sm70_proto_seg_hdr, daemon_sleeping),
		offsetof(struct sm70_proto_seg_hdr, client_sleeping),
		offsetof(struct sm70_proto_seg_hdr, eq_space_wanted),
	};
	for (size_t i = 0; i < sizeof(idx) / sizeof(idx[0]); i++) {
		assert_int_equal(idx[i] % SM70_PROTO_CACHELINE, 0);
		if (i)
			assert_int_equal(idx[i] - idx[i - 1], SM70_PROTO_CACHELINE);
	}
	/* the write-once 1.2 fields after the shared lines: model_dir, then the close code
	 * on a line of its own start with its reason behind it */
	assert_int_equal(offsetof(struct sm70_proto_seg_hdr, model_dir), 640);
	assert_int_equal(offsetof(struct sm70_proto_seg_hdr, close_code) % SM70_PROTO_CACHELINE, 0);
	assert_int_equal(offsetof(struct sm70_proto_seg_hdr, close_reason),
			 offsetof(struct sm70_proto_seg_hdr, close_code) + 8);
	assert_int_equal(sizeof(struct sm70_proto_eqe) % SM70_PROTO_CACHELINE, 0);
	assert_int_equal(sizeof(struct sm70_proto_sqe) % SM70_PROTO_CACHELINE, 0);
	assert_true(sizeof(struct sm70_proto_welcome) <= SM70_PROTO_MSG_MAX);

	/* strerror: every code has its own text; unknown and negated codes behave. */
	for (int c = 0; c < SM70_PROTO_E__COUNT; c++) {
		assert_string_not_equal(sm70_proto_strerror(c), "unknown error");
		assert_string_equal(sm70_proto_strerror(c), sm70_proto_strerror(-c));
	}
	assert_string_equal(sm70_proto_strerror(SM70_PROTO_E__COUNT), "unknown error");
	assert_string_equal(sm70_proto_strerror(-2147483647 - 1), "unknown error");
	printf("strerror: %d codes, e.g. -E_SLOW_CONSUMER -> \"%s\"\n", SM70_PROTO_E__COUNT,
	       sm70_proto_strerror(-SM70_PROTO_E_SLOW_CONSUMER));
}

/* ---- segment layout ---------------------------------------------------------------------- */

struct layout_case {
	const char *field;
	int code;
	void (*mut)(struct sm70_proto_seg_hdr *h, uint64_t *mapped);
};

#define LMUT(n, stmt) \
	static void lmut_##n(struct sm70_proto_seg_hdr *h, uint64_t *mapped) \
	{ \
		(void)h; \
		(void)mapped; \
		stmt; \
	}
LMUT(magic, h->magic ^= 1)
LMUT(version, h->version_major++)
LMUT(header_size, h->header_size = 512)
LMUT(mapped, *mapped -= 4096)
LMUT(sqe_size, h->sqe_size = 192)
LMUT(eqe_size, h->eqe_size = 64)
LMUT(sq_entries, h->sq_entries = 48)
LMUT(eq_entries, h->eq_entries = 0)
LMUT(arena_tokens, h->arena_tokens = 3)
LMUT(max_top, h->limits.max_top_logprobs = SM70_PROTO_MAX_TOP + 1)
LMUT(sq_misaligned, h->sq_offset += 8)
LMUT(sq_in_header, h->sq_offset = 512)
LMUT(eq_past_end, h->eq_offset = h->total_size - 64)
LMUT(arena_wrap, h->arena_offset = UINT64_MAX - 63)
LMUT(overlap, h->eq_offset = h->sq_offset)
#undef LMUT

static void test_layout_check(void **state)
{
	static const struct layout_case cases[] = {
		{ "magic", SM70_PROTO_E_INVALID, lmut_magic },
		{ "version_major", SM70_PROTO_E_VERSION, lmut_version },
		{ "header_size", SM70_PROTO_E_INVALID, lmut_header_size },
		{ "total_size", SM70_PROTO_E_INVALID, lmut_mapped },
		{ "sqe_size", SM70_PROTO_E_INVALID, lmut_sqe_size },
		{ "eqe_size", SM70_PROTO_E_INVALID, lmut_eqe_size },
		{ "sq_entries", SM70_PROTO_E_INVALID, lmut_sq_entries },
		{ "eq_entries", SM70_PROTO_E_INVALID, lmut_eq_entries },
		{ "arena_tokens", SM70_PROTO_E_INVALID, lmut_arena_tokens },
		{ "limits.max_top_logprobs", SM70_PROTO_E_INVALID, lmut_max_top },
		{ "sq_offset", SM70_PROTO_E_INVALID, lmut_sq_misaligned },
		{ "sq_offset", SM70_PROTO_E_INVALID, lmut_sq_in_header },
		{ "eq_offset", SM70_PROTO_E_INVALID, lmut_eq_past_end },
		{ "arena_offset", SM70_PROTO_E_INVALID, lmut_arena_wrap },
		{ "sq_offset/eq_offset/arena_offset", SM70_PROTO_E_INVALID, lmut_overlap },
	};
	struct sm70_proto_seg_hdr h0, h;
	char why[SM70_PROTO_ERRMSG_LEN];
	uint64_t mapped;

	(void)state;
	assert_int_equal(sm70_proto_layout_init(&h0, 6, 64, 4096, 0), -SM70_PROTO_E_INVALID);
	assert_int_equal(sm70_proto_layout_init(&h0, 64, 256, 1u << 16, 0), 0);
	printf("layout 64 sqe / 256 eqe / 65536 tokens: sq@%llu eq@%llu arena@%llu total %llu\n",
	       (unsigned long long)h0.sq_offset, (unsigned long long)h0.eq_offset,
	       (unsigned long long)h0.arena_offset, (unsigned long long)h0.total_size);
	assert_int_equal(h0.sq_offset % 4096, 0);
	assert_int_equal(h0.eq_offset % 4096, 0);
	assert_int_equal(h0.arena_offset % 4096, 0);
	assert_int_equal(sm70_proto_layout_check(&h0, h0.total_size, why, sizeof(why)), 0);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int ret;

		h = h0;
		mapped = h0.total_size;
		cases[i].mut(&h, &mapped);
		ret = sm70_proto_layout_check(&h, mapped, why, sizeof(why));
		printf("  layout case %-34s -> %d \"%s\"\n", cases[i].field, ret, why);
		assert_int_equal(ret, -cases[i].code);
		assert_int_equal(strncmp(why, cases[i].field, strlen(cases[i].field)), 0);
		assert_int_equal(why[strlen(cases[i].field)], ':');
	}
}

/* ---- ring helpers, one thread ------------------------------------------------------------ */

static void test_ring_wraparound(void **state)
{
	struct sm70_proto_seg_hdr *h;
	struct sm70_proto_sqe *sq;
	const uint32_t cap = 8;
	/* Start so the indices cross 2^32 within the first few laps. */
	const uint32_t start = UINT32_MAX - 12;
	uint32_t head, tail, produced = 0, consumed = 0;
	void *seg;

	(void)state;
	{
		struct sm70_proto_seg_hdr tmp;

		assert_int_equal(sm70_proto_layout_init(&tmp, cap, 8, 64, start), 0);
		seg = aligned_alloc(4096, tmp.total_size);
		assert_non_null(seg);
		memset(seg, 0, tmp.total_size);
		memcpy(seg, &tmp, sizeof(tmp));
	}
	h = seg;
	sq = sm70_proto_sq(seg, h);

	assert_int_equal(sm70_ring_cap_ok(0), 0);
	assert_int_equal(sm70_ring_cap_ok(12), 0);
	assert_int_equal(sm70_ring_cap_ok(1u << 31), 1);
	assert_int_equal(sm70_ring_count(start, start), 0);
	assert_int_equal(sm70_ring_space(start, start, cap), cap);
	/* Modular arithmetic across the 2^32 boundary. */
	assert_int_equal(sm70_ring_count(UINT32_MAX - 1, 2), 4);
	assert_int_equal(sm70_ring_space(UINT32_MAX - 1, 2, cap), cap - 4);
	assert_int_equal(sm70_ring_slot(UINT32_MAX, cap), cap - 1);
	assert_int_equal(sm70_ring_slot(UINT32_MAX + 1u, cap), 0);

	/* Alternate fill-to-full and drain-to-empty, with uneven batch sizes, for 10 laps. */
	for (int lap = 0; lap < 10; lap++) {
		uint32_t want = lap % 2 ? cap : 3;

		tail = sm70_ring_load_relaxed(&h->sq_tail);
		head = sm70_ring_load_acquire(&h->sq_head);
		while (want-- && sm70_ring_space(head, tail, cap)) {
			sq[sm70_ring_slot(tail, cap)].tag = produced++;
			tail++;
		}
		sm70_ring_store_release(&h->sq_tail, tail);
		if (lap % 2)
			assert_int_equal(sm70_ring_space(head, tail, cap), 0);

		head = sm70_ring_load_relaxed(&h->sq_head);
		tail = sm70_ring_load_acquire(&h->sq_tail);
		while (sm70_ring_count(head, tail)) {
			assert_int_equal(sq[sm70_ring_slot(head, cap)].tag, consumed);
			consumed++;
			head++;
		}
		sm70_ring_store_release(&h->sq_head, head);
		assert_int_equal(sm70_ring_count(head, tail), 0);
	}
	printf("ring cap %u from index %u: %u entries in order, final index %u (wrapped past "
	       "2^32)\n", cap, start, consumed, sm70_ring_load_relaxed(&h->sq_head));
	assert_int_equal(produced, consumed);
	assert_true(sm70_ring_load_relaxed(&h->sq_head) < start);

	/* A hostile tail more than cap ahead is visible as count > cap. */
	assert_true(sm70_ring_count(head, head + cap + 1) > cap);
	free(seg);
}

/* ---- two-thread stress of the event ring with the need-wakeup protocol ------------------- */

#define STRESS_N 300000u
#define STRESS_CAP 64u

struct stress {
	struct sm70_proto_seg_hdr *h;
	struct sm70_proto_eqe *eq;
	int event_fd;	 /* producer ("daemon") -> consumer ("client") */
	int doorbell_fd; /* consumer -> producer, for event-ring space */
	unsigned long producer_sleeps, consumer_sleeps, producer_rings, consumer_rings;
	const char *producer_error;
};

static uint32_t token_of(uint32_t i)
{
	return i * 2654435761u;
}

static void ring(int fd, unsigned long *count)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) == sizeof(one))
		(*count)++;
}

/* Blocks until fd is readable, then drains its counter. Returns 0, or -ETIMEDOUT after 2 s,
 * which here can only mean a lost wakeup. */
static int wait_fd(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	uint64_t v;
	int n;

	do
		n = poll(&p, 1, 2000);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return -ETIMEDOUT;
	if (read(fd, &v, sizeof(v)) != sizeof(v) && errno != EAGAIN)
		return -errno;
	return 0;
}

static void *stress_producer(void *arg)
{
	struct stress *s = arg;
	struct sm70_proto_seg_hdr *h = s->h;
	uint32_t tail = sm70_ring_load_relaxed(&h->eq_tail);

	for (uint32_t i = 0; i < STRESS_N; i++) {
		uint32_t head = sm70_ring_load_acquire(&h->eq_head);

		while (sm70_ring_space(head, tail, STRESS_CAP) == 0) {
			/* Full: announce we want space, then re-check before sleeping. */
			sm70_proto_sleep_begin(&h->eq_space_wanted);
			head = sm70_ring_load_acquire(&h->eq_head);
			if (sm70_ring_space(head, tail, STRESS_CAP) == 0) {
				s->producer_sleeps++;
				if (wait_fd(s->doorbell_fd)) {
					s->producer_error =
						"producer: lost wakeup (no doorbell in 2 s)";
					sm70_proto_sleep_end(&h->eq_space_wanted);
					return NULL;
				}
			}
			sm70_proto_sleep_end(&h->eq_space_wanted);
			head = sm70_ring_load_acquire(&h->eq_head);
		}

		struct sm70_proto_eqe *e = &s->eq[sm70_ring_slot(tail, STRESS_CAP)];

		memset(e, 0, sizeof(*e));
		e->type = SM70_PROTO_EV_TOKEN;
		e->index = i;
		e->tag = 0x5eed000000000000ull | i;
		e->u.token.token = token_of(i);
		tail++;
		sm70_ring_store_release(&h->eq_tail, tail);
		if (sm70_proto_wake_needed(&h->client_sleeping))
			ring(s->event_fd, &s->producer_rings);
	}
	return NULL;
}

static void test_ring_stress(void **state)
{
	struct sm70_proto_seg_hdr tmp, *h;
	struct stress s;
	pthread_t th;
	uint32_t head, expect = 0, bad = 0;
	unsigned long spins_before_sleep = 0;
	double t0, dt;
	void *seg;
	int memfd;

	(void)state;
	memset(&s, 0, sizeof(s));
	/* A real memfd mapping, as the daemon would create it; the start index makes the stress
	 * run cross 2^32 half way through. */
	assert_int_equal(sm70_proto_layout_init(&tmp, 8, STRESS_CAP, 64,
						UINT32_MAX - STRESS_N / 2), 0);
	memfd = memfd_create("sm70-test", MFD_CLOEXEC);
	assert_true(memfd >= 0);
	assert_int_equal(ftruncate(memfd, (off_t)tmp.total_size), 0);
	seg = mmap(NULL, tmp.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	assert_true(seg != MAP_FAILED);
	memcpy(seg, &tmp, sizeof(tmp));
	h = seg;
	s.h = h;
	s.eq = sm70_proto_eq(seg, h);
	s.event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s.doorbell_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	assert_true(s.event_fd >= 0 && s.doorbell_fd >= 0);

	t0 = now_s();
	assert_int_equal(pthread_create(&th, NULL, stress_producer, &s), 0);
	head = sm70_ring_load_relaxed(&h->eq_head);
	while (expect < STRESS_N) {
		uint32_t tail = sm70_ring_load_acquire(&h->eq_tail);

		if (tail == head) {
			/* Spin a little (as the SDK does), then sleep with the protocol. */
			if (++spins_before_sleep % 64)
				continue;
			sm70_proto_sleep_begin(&h->client_sleeping);
			tail = sm70_ring_load_acquire(&h->eq_tail);
			if (tail == head) {
				s.consumer_sleeps++;
				if (wait_fd(s.event_fd)) {
					sm70_proto_sleep_end(&h->client_sleeping);
					break;
				}
			}
			sm70_proto_sleep_end(&h->client_sleeping);
			continue;
		}
		if (sm70_ring_count(head, tail) > STRESS_CAP) {
			bad++;
			break;
		}
		while (head != tail) {
			const struct sm70_proto_eqe *e = &s.eq[sm70_ring_slot(head, STRESS_CAP)];

			if (e->index != expect || e->tag != (0x5eed000000000000ull | expect) ||
			    e->u.token.token != token_of(expect))
				bad++;
			expect++;
			head++;
		}
		sm70_ring_store_release(&h->eq_head, head);
		if (sm70_proto_wake_needed(&h->eq_space_wanted))
			ring(s.doorbell_fd, &s.consumer_rings);
		/* Now and then be a slow consumer, so the producer fills the ring and sleeps. */
		if (expect % 8192 < 64)
			usleep(20);
	}
	pthread_join(th, NULL);
	dt = now_s() - t0;

	printf("stress: %u/%u events in order, %u mismatches, %.3f s; consumer slept %lu "
	       "(producer rang %lu), producer slept %lu (consumer rang %lu); final index %u\n",
	       expect, STRESS_N, bad, dt, s.consumer_sleeps, s.producer_rings, s.producer_sleeps,
	       s.consumer_rings, head);
	if (s.producer_error)
		printf("%s\n", s.producer_error);
	assert_null(s.producer_error);
	assert_int_equal(expect, STRESS_N);
	assert_int_equal(bad, 0);
	assert_true(s.consumer_sleeps > 0);
	assert_true(s.producer_sleeps > 0);
	assert_true(dt < 10.0); /* typically well under 1 s; 10 s only guards against hangs */

	close(s.event_fd);
	close(s.doorbell_fd);
	munmap(seg, tmp.total_size);
	close(memfd);
}

/* ---- submission validation ----------------------------------------------------------------- */

#define ARENA 4096u

static const struct sm70_proto_limits test_limits = {
	.max_jobs_in_flight = 16,
	.max_prompt_tokens = 1000,
	.max_new_tokens = 1000,
	.max_context_tokens = 1536,
	.max_top_logprobs = 5,
	.max_priority = 3,
	.vocab_size = 151936,
	.slow_consumer_ms = 5000,
};

static struct sm70_proto_sqe valid_submit(void)
{
	struct sm70_proto_sqe e;

	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_SUBMIT;
	e.priority = 1;
	e.flags = SM70_PROTO_SQF_SEED;
	e.tag = 42;
	e.arena_pos = 7u * ARENA + 100; /* free-running: slot 100 */
	e.prompt_len = 500;
	e.max_new_tokens = 500;
	e.temperature = 0.7f;
	e.top_p = 0.95f;
	e.top_k = 40;
	e.seed = 1234;
	e.top_logprobs = 5;
	e.deadline_ms = 30000;
	e.n_stop = 2;
	e.stop[0] = 151643;
	e.stop[1] = 151645;
	return e;
}

struct submit_case {
	const char *field; /* the message must start with this, then ':' */
	int code;
	void (*mut)(struct sm70_proto_sqe *e);
};

#define MUT(n, stmt) \
	static void mut_##n(struct sm70_proto_sqe *e) \
	{ \
		stmt; \
	}
MUT(size, e->size = 127)
MUT(opcode, e->opcode = 9)
MUT(opcode_zero, e->opcode = 0)
MUT(priority, e->priority = 4)
MUT(flags, e->flags |= 1u << 9)
MUT(prompt_zero, e->prompt_len = 0)
MUT(arena_end, { e->arena_pos = ARENA - 2; e->prompt_len = 5; })
MUT(arena_overflow, { e->arena_pos = UINT32_MAX; e->prompt_len = UINT32_MAX; })
MUT(prompt_limit, e->prompt_len = 1001)
MUT(new_zero, e->max_new_tokens = 0)
MUT(new_limit, e->max_new_tokens = 1001)
MUT(context, { e->prompt_len = 1000; e->max_new_tokens = 1000; })
MUT(temp_nan, e->temperature = NAN)
MUT(temp_inf, e->temperature = INFINITY)
MUT(temp_neg, e->temperature = -0.5f)
MUT(top_p_zero, e->top_p = 0.0f)
MUT(top_p_big, e->top_p = 1.5f)
MUT(top_p_nan, e->top_p = NAN)
MUT(top_k, e->top_k = -1)
MUT(seed, e->flags &= ~SM70_PROTO_SQF_SEED)
MUT(top_logprobs_limit, e->top_logprobs = 6)
MUT(top_logprobs_max, e->top_logprobs = SM70_PROTO_MAX_TOP + 1)
MUT(n_stop, e->n_stop = SM70_PROTO_MAX_STOP + 1)
MUT(stop_unused, e->stop[2] = 5)
MUT(stop_vocab, e->stop[1] = 151936)
MUT(reserved0, e->reserved0 = 1)
MUT(reserved3, e->reserved[3] = 1)
#define CANCEL_MUT(n, stmt) \
	MUT(cancel_##n, { \
		struct sm70_proto_sqe c; \
		memset(&c, 0, sizeof(c)); \
		c.size = sizeof(c); \
		c.opcode = SM70_PROTO_OP_CANCEL; \
		c.tag = 42; \
		stmt; \
		*e = c; \
	})
CANCEL_MUT(priority, c.priority = 1)
CANCEL_MUT(prompt_len, c.prompt_len = 1)
CANCEL_MUT(temperature, c.temperature = -0.0f)
CANCEL_MUT(stop, c.stop[7] = 1)
CANCEL_MUT(reserved, c.reserved[0] = 1)
#undef CANCEL_MUT
#undef MUT

static void test_validate_submit(void **state)
{
	static const struct submit_case cases[] = {
		{ "size", SM70_PROTO_E_INVALID, mut_size },
		{ "opcode", SM70_PROTO_E_INVALID, mut_opcode },
		{ "opcode", SM70_PROTO_E_INVALID, mut_opcode_zero },
		{ "priority", SM70_PROTO_E_INVALID, mut_priority },
		{ "flags", SM70_PROTO_E_INVALID, mut_flags },
		{ "prompt_len", SM70_PROTO_E_INVALID, mut_prompt_zero },
		{ "arena_pos/prompt_len", SM70_PROTO_E_INVALID, mut_arena_end },
		{ "arena_pos/prompt_len", SM70_PROTO_E_INVALID, mut_arena_overflow },
		{ "prompt_len", SM70_PROTO_E_TOO_LARGE, mut_prompt_limit },
		{ "max_new_tokens", SM70_PROTO_E_INVALID, mut_new_zero },
		{ "max_new_tokens", SM70_PROTO_E_TOO_LARGE, mut_new_limit },
		{ "prompt_len + max_new_tokens", SM70_PROTO_E_TOO_LARGE, mut_context },
		{ "temperature", SM70_PROTO_E_INVALID, mut_temp_nan },
		{ "temperature", SM70_PROTO_E_INVALID, mut_temp_inf },
		{ "temperature", SM70_PROTO_E_INVALID, mut_temp_neg },
		{ "top_p", SM70_PROTO_E_INVALID, mut_top_p_zero },
		{ "top_p", SM70_PROTO_E_INVALID, mut_top_p_big },
		{ "top_p", SM70_PROTO_E_INVALID, mut_top_p_nan },
		{ "top_k", SM70_PROTO_E_INVALID, mut_top_k },
		{ "seed", SM70_PROTO_E_INVALID, mut_seed },
		{ "top_logprobs", SM70_PROTO_E_TOO_LARGE, mut_top_logprobs_limit },
		{ "top_logprobs", SM70_PROTO_E_INVALID, mut_top_logprobs_max },
		{ "n_stop", SM70_PROTO_E_INVALID, mut_n_stop },
		{ "stop[2]", SM70_PROTO_E_INVALID, mut_stop_unused },
		{ "stop[1]", SM70_PROTO_E_INVALID, mut_stop_vocab },
		{ "reserved0", SM70_PROTO_E_INVALID, mut_reserved0 },
		{ "reserved[3]", SM70_PROTO_E_INVALID, mut_reserved3 },
		{ "priority", SM70_PROTO_E_INVALID, mut_cancel_priority },
		{ "prompt_len", SM70_PROTO_E_INVALID, mut_cancel_prompt_len },
		{ "temperature", SM70_PROTO_E_INVALID, mut_cancel_temperature },
		{ "stop", SM70_PROTO_E_INVALID, mut_cancel_stop },
		{ "reserved", SM70_PROTO_E_INVALID, mut_cancel_reserved },
	};
	struct sm70_proto_sqe e;
	char why[SM70_PROTO_ERRMSG_LEN];
	int ret;

	(void)state;
	e = valid_submit();
	ret = sm70_proto_validate_submit(&e, &test_limits, ARENA, why, sizeof(why));
	printf("valid SUBMIT -> %d \"%s\"\n", ret, why);
	assert_int_equal(ret, 0);
	assert_string_equal(why, "");

	/* Edges that must pass: range ending exactly at the arena end, greedy, top_p 1,
	 * context exactly at the limit, no seed, no stop tokens, and a plain CANCEL. */
	e = valid_submit();
	e.temperature = 0.0f;
	e.top_p = 1.0f;
	e.top_k = 0;
	e.prompt_len = 536;
	e.arena_pos = ARENA - 536;
	e.max_new_tokens = 1000;
	e.flags = 0;
	e.seed = 0;
	e.n_stop = 0;
	memset(e.stop, 0, sizeof(e.stop));
	assert_int_equal(sm70_proto_validate_submit(&e, &test_limits, ARENA, why, sizeof(why)), 0);
	mut_cancel_reserved(&e);
	e.reserved[0] = 0;
	assert_int_equal(sm70_proto_validate_submit(&e, &test_limits, ARENA, why, sizeof(why)), 0);
	printf("edge cases (range to arena end, greedy, context at limit, CANCEL) pass\n");

	/* One failing field per case; the message starts with the field's name. */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *f = cases[i].field;

		e = valid_submit();
		cases[i].mut(&e);
		ret = sm70_proto_validate_submit(&e, &test_limits, ARENA, why, sizeof(why));
		printf("  case %-2zu %-28s -> %3d \"%s\"\n", i, f, ret, why);
		assert_int_equal(ret, -cases[i].code);
		assert_int_equal(strncmp(why, f, strlen(f)), 0);
		assert_int_equal(why[strlen(f)], ':');
		assert_true(strlen(why) < SM70_PROTO_ERRMSG_LEN - 1);
	}
	printf("%zu invalid entries rejected, each naming its field\n",
	       sizeof(cases) / sizeof(cases[0]));

	/* Bad arguments, and callers that want no message. */
	e = valid_submit();
	assert_int_equal(sm70_proto_validate_submit(&e, &test_limits, 3000, why, sizeof(why)),
			 -SM70_PROTO_E_INTERNAL);
	assert_int_equal(sm70_proto_validate_submit(NULL, &test_limits, ARENA, NULL, 0),
			 -SM70_PROTO_E_INTERNAL);
	e.top_k = -5;
	assert_int_equal(sm70_proto_validate_submit(&e, &test_limits, ARENA, NULL, 0),
			 -SM70_PROTO_E_INVALID);
	assert_int_equal(sm70_proto_validate_submit(&e, &test_limits, ARENA, why, 4),
			 -SM70_PROTO_E_INVALID);
	assert_string_equal(why, "top");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout_facts),
		cmocka_unit_test(test_layout_check),
		cmocka_unit_test(test_ring_wraparound),
		cmocka_unit_test(test_ring_stress),
		cmocka_unit_test(test_validate_submit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
