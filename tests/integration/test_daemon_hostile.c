/* test_daemon_hostile - a real sm70d against a raw protocol client: good jobs, and hostile ones. */
/*
 * The client here is written from docs/PROTOCOL.md alone (no SDK), so it also checks that
 * the document is enough. One daemon serves every test; it starts its ring indices near
 * 2^32 so that every index wraps during the run. Tests run in order; the last one drains
 * the daemon with SIGTERM.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "shm_proto/sm70_proto.h"
#include "shm_proto/sm70_validate.h"
#include "sm70/client.h"
#include "tests/integration/daemon_util.h"

#define FIXTURE "tests/fixtures/qwen3-gqa2-d64-tied"

static struct sm70t_daemon dmn;

/* reference.json case 1 */
static uint32_t ref_prompt[64];
static uint32_t ref_tokens[64];
static int ref_n_prompt, ref_n_tokens;

/* ---- a raw client ------------------------------------------------------------------- */

struct rc {
	int sock, bell, evfd;
	void *seg;
	size_t size;
	struct sm70_proto_seg_hdr *h;
	struct sm70_proto_sqe *sq;
	struct sm70_proto_eqe *eq;
	uint32_t *arena;
	struct sm70_proto_welcome w;
	uint32_t sq_tail, eq_head, arena_tail;
};

/* Connects and says hello with the given major. Returns 0 (welcomed), 1 (refused, *ref
 * filled) or -errno. */
static int rc_connect(struct rc *c, int major, uint32_t want_eq, struct sm70_proto_refusal *ref)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct sm70_proto_hello h;
	char buf[SM70_PROTO_MSG_MAX];
	union {
		char b[CMSG_SPACE(sizeof(int) * 3)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			      .msg_controllen = sizeof(ctl.b) };
	struct sm70_proto_seg_hdr copy;
	struct pollfd pfd;
	struct cmsghdr *cm;
	struct stat st;
	char why[128];
	int fds[3], memfd;
	ssize_t n;

	memset(c, 0, sizeof(*c));
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", dmn.sock);
	if (c->sock < 0 || connect(c->sock, (struct sockaddr *)&a, sizeof(a)))
		return -errno;
	memset(&h, 0, sizeof(h));
	h.size = sizeof(h);
	h.magic = SM70_PROTO_MAGIC;
	h.type = SM70_PROTO_MSG_HELLO;
	h.version_major = (uint16_t)major;
	h.eq_entries = want_eq;
	snprintf(h.client_name, sizeof(h.client_name), "test_daemon_hostile");
	if (send(c->sock, &h, sizeof(h), MSG_NOSIGNAL) != sizeof(h))
		return -errno;
	pfd = (struct pollfd){ .fd = c->sock, .events = POLLIN };
	if (poll(&pfd, 1, 5000) != 1)
		return -ETIMEDOUT;
	n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC);
	if (n < 16 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		return -EPROTO;
	if (((struct sm70_proto_refusal *)buf)->type == SM70_PROTO_MSG_REFUSAL) {
		memcpy(ref, buf, sizeof(*ref));
		return 1;
	}
	memcpy(&c->w, buf, sizeof(c->w));
	cm = CMSG_FIRSTHDR(&msg);
	if (c->w.type != SM70_PROTO_MSG_WELCOME || !cm || cm->cmsg_type != SCM_RIGHTS ||
	    cm->cmsg_len != CMSG_LEN(sizeof(fds)) || c->w.n_fds != 3)
		return -EPROTO;
	memcpy(fds, CMSG_DATA(cm), sizeof(fds));
	memfd = fds[SM70_PROTO_FD_MEMFD];
	c->bell = fds[SM70_PROTO_FD_DOORBELL];
	c->evfd = fds[SM70_PROTO_FD_EVENT];
	if (fstat(memfd, &st) || (uint64_t)st.st_size != c->w.segment_size)
		return -EPROTO;
	c->size = c->w.segment_size;
	c->seg = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	close(memfd);
	if (c->seg == MAP_FAILED)
		return -errno;
	memcpy(&copy, c->seg, sizeof(copy));
	if (sm70_proto_layout_check(&copy, c->size, why, sizeof(why))) {
		fprintf(stderr, "layout: %s\n", why);
		return -EPROTO;
	}
	c->h = c->seg;
	c->sq = sm70_proto_sq(c->seg, &copy);
	c->eq = sm70_proto_eq(c->seg, &copy);
	c->arena = sm70_proto_arena(c->seg, &copy);
	c->sq_tail = copy.sq_tail;
	c->eq_head = copy.eq_head;
	c->arena_tail = copy.arena_head;
	return 0;
}

static void rc_close(struct rc *c)
{
	if (c->seg && c->seg != MAP_FAILED)
		munmap(c->seg, c->size);
	if (c->bell > 0)
		close(c->bell);
	if (c->evfd > 0)
		close(c->evfd);
	if (c->sock > 0)
		close(c->sock);
	memset(c, 0, sizeof(*c));
}

static void rc_ring(int fd)
{
	uint64_t one = 1;

	assert_int_equal(write(fd, &one, sizeof(one)), sizeof(one));
}

/* Publishes the entries written so far. */
static void rc_publish(struct rc *c)
{
	sm70_ring_store_release(&c->h->sq_tail, c->sq_tail);
	if (sm70_proto_wake_needed(&c->h->daemon_sleeping))
		rc_ring(c->bell);
}

/* Writes e (as is) into the next SQ slot without publishing it. */
static void rc_put(struct rc *c, const struct sm70_proto_sqe *e)
{
	assert_true(c->sq_tail - sm70_ring_load_acquire(&c->h->sq_head) < c->w.sq_entries);
	memcpy(&c->sq[sm70_ring_slot(c->sq_tail, c->w.sq_entries)], e, sizeof(*e));
	c->sq_tail++;
}

/* Copies a prompt into the arena (section 7); returns its arena_pos. */
static uint32_t rc_prompt(struct rc *c, const uint32_t *tok, uint32_t n)
{
	uint32_t cap = c->w.arena_tokens, pos = c->arena_tail, slot = pos & (cap - 1);

	if (slot + n > cap)
		pos += cap - slot;
	assert_true((pos + n) - sm70_ring_load_acquire(&c->h->arena_head) <= cap);
	memcpy(&c->arena[pos & (cap - 1)], tok, sizeof(*tok) * n);
	c->arena_tail = pos + n;
	return pos;
}

/* A valid greedy SUBMIT for prompt (copied into the arena). */
static void rc_entry(struct rc *c, struct sm70_proto_sqe *e, uint64_t tag, const uint32_t *p,
		     uint32_t n, uint32_t max_new)
{
	memset(e, 0, sizeof(*e));
	e->size = sizeof(*e);
	e->opcode = SM70_PROTO_OP_SUBMIT;
	e->tag = tag;
	e->arena_pos = rc_prompt(c, p, n);
	e->prompt_len = n;
	e->max_new_tokens = max_new;
	e->temperature = 0.0f;
	e->top_p = 1.0f;
}

/* Next event into *ev within timeout_ms: 0, -ETIMEDOUT, or -EPIPE (daemon hung up). */
static int rc_next(struct rc *c, struct sm70_proto_eqe *ev, int timeout_ms)
{
	long deadline = sm70t_ms_now() + timeout_ms;

	for (;;) {
		struct pollfd p[2] = { { .fd = c->evfd, .events = POLLIN },
				       { .fd = c->sock, .events = POLLRDHUP } };
		uint64_t v;
		long left;

		if (sm70_ring_load_acquire(&c->h->eq_tail) != c->eq_head) {
			memcpy(ev, &c->eq[sm70_ring_slot(c->eq_head, c->w.eq_entries)],
			       sizeof(*ev));
			c->eq_head++;
			sm70_ring_store_release(&c->h->eq_head, c->eq_head);
			if (sm70_proto_wake_needed(&c->h->eq_space_wanted))
				rc_ring(c->bell);
			return 0;
		}
		sm70_proto_sleep_begin(&c->h->client_sleeping);
		if (sm70_ring_load_acquire(&c->h->eq_tail) != c->eq_head) {
			sm70_proto_sleep_end(&c->h->client_sleeping);
			continue;
		}
		left = deadline - sm70t_ms_now();
		if (left <= 0) {
			sm70_proto_sleep_end(&c->h->client_sleeping);
			return -ETIMEDOUT;
		}
		poll(p, 2, (int)left);
		sm70_proto_sleep_end(&c->h->client_sleeping);
		if (p[0].revents & POLLIN)
			(void)!read(c->evfd, &v, sizeof(v));
		if ((p[1].revents & (POLLHUP | POLLRDHUP)) &&
		    sm70_ring_load_acquire(&c->h->eq_tail) == c->eq_head)
			return -EPIPE;
	}
}

struct result {
	uint32_t tokens[4096];
	uint32_t n;
	struct sm70_proto_eqe final;
};

/* Reads events until the final event of tag; checks TOKEN indices run first, first + 1,
 * ... (first: tokens of this tag already read). r->n counts the tokens read here. */
static void rc_collect_from(struct rc *c, uint64_t tag, uint32_t first, struct result *r,
			    int timeout_ms)
{
	struct sm70_proto_eqe ev;

	memset(r, 0, sizeof(*r));
	for (;;) {
		assert_int_equal(rc_next(c, &ev, timeout_ms), 0);
		if (ev.tag != tag)
			continue;
		if (ev.type == SM70_PROTO_EV_TOKEN) {
			assert_int_equal(ev.index, first + r->n);
			if (r->n < 4096)
				r->tokens[r->n] = ev.u.token.token;
			r->n++;
			continue;
		}
		r->final = ev;
		return;
	}
}

static void rc_collect(struct rc *c, uint64_t tag, struct result *r, int timeout_ms)
{
	rc_collect_from(c, tag, 0, r, timeout_ms);
}

/* ---- fixture -------------------------------------------------------------------------- */

static int load_reference(void)
{
	json_error_t je;
	json_t *root = json_load_file(FIXTURE "/reference.json", 0, &je), *c1, *v;
	size_t i;

	if (!root)
		return -1;
	c1 = json_array_get(json_object_get(root, "cases"), 1);
	json_array_foreach(json_object_get(c1, "prompt"), i, v)
		if (i < 64)
			ref_prompt[ref_n_prompt++] = (uint32_t)json_integer_value(v);
	json_array_foreach(json_object_get(c1, "tokens"), i, v)
		if (i < 64)
			ref_tokens[ref_n_tokens++] = (uint32_t)json_integer_value(v);
	json_decref(root);
	return ref_n_prompt > 0 && ref_n_tokens > 0 ? 0 : -1;
}

static int setup(void **state)
{
	static const char cfg[] =
		"{ \"engine\": { \"n_threads\": 1, \"max_seqs\": 8, \"kv_bytes\": 16777216 },\n"
		"  \"limits\": { \"max_jobs_in_flight\": 4, \"max_new_tokens\": 4000 },\n"
		"  \"rings\": { \"start_index\": 4294967280 },\n"
		"  \"slow_consumer_ms\": 300, \"drain_grace_ms\": 300,\n"
		"  \"hello_timeout_ms\": 2000 }\n";

	if (load_reference())
		return -1;
	return sm70t_daemon_start(&dmn, cfg, NULL);
}

static int teardown(void **state)
{
	if (!dmn.exited)
		sm70t_daemon_stop(&dmn, SIGKILL, 5000);
	return 0;
}

static void expect_ref_job(struct rc *c, uint64_t tag)
{
	struct sm70_proto_sqe e;
	struct result *r = malloc(sizeof(*r));

	assert_non_null(r);
	rc_entry(c, &e, tag, ref_prompt, (uint32_t)ref_n_prompt, (uint32_t)ref_n_tokens);
	e.top_logprobs = 3;
	rc_put(c, &e);
	rc_publish(c);
	rc_collect(c, tag, r, 10000);
	assert_int_equal(r->final.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(r->final.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
	assert_int_equal(r->n, ref_n_tokens);
	assert_int_equal(r->final.u.finish.completion_tokens, ref_n_tokens);
	assert_int_equal(r->final.u.finish.prompt_tokens, ref_n_prompt);
	assert_memory_equal(r->tokens, ref_tokens, sizeof(uint32_t) * (size_t)ref_n_tokens);
	free(r);
}

/* ---- a bystander: a well-behaved SDK client in another process ------------------------ */

/*
 * While a hostile client does its worst, a forked child runs the reference job through
 * libsm70client again and again until the parent closes its stop pipe, then reports how
 * many runs matched reference.json and how many did not. (A child, not a thread, and no
 * cmocka calls in it: it only reports.) An sm70t_child: its report is the two counters.
 */

static int bystander_cb(void *ctx, const struct sm70_event *ev)
{
	struct result *r = ctx;

	if (r->n < 4096)
		r->tokens[r->n] = ev->token;
	r->n++;
	return 0;
}

static void bystander_body(int stop_r, int res_w)
{
	struct sm70_client *c = NULL;
	struct result *r = malloc(sizeof(*r));
	int counts[2] = { 0, 0 }; /* equal, different */
	struct pollfd p = { .fd = stop_r, .events = POLLIN };

	if (!r || sm70_client_connect(&c, dmn.sock, NULL))
		_exit(2);
	do {
		if (counts[0] + counts[1] == 1 && write(res_w, "r", 1) != 1)
			_exit(3); /* one run done: the parent may start */
		struct sm70_job job;
		struct sm70_result res = { .size = sizeof(res) };
		int ret;

		sm70_job_init(&job);
		job.prompt = ref_prompt;
		job.prompt_len = (uint32_t)ref_n_prompt;
		job.max_tokens = (uint32_t)ref_n_tokens;
		memset(r, 0, sizeof(*r));
		ret = sm70_generate(c, &job, bystander_cb, r, &res);
		if (!ret && res.finish_reason == SM70_REASON_LENGTH &&
		    r->n == (uint32_t)ref_n_tokens &&
		    !memcmp(r->tokens, ref_tokens, sizeof(uint32_t) * (size_t)ref_n_tokens))
			counts[0]++;
		else
			counts[1]++;
	} while (poll(&p, 1, 0) == 0);
	sm70_client_close(c);
	if (write(res_w, counts, sizeof(counts)) != (ssize_t)sizeof(counts))
		_exit(3);
	_exit(counts[1] ? 1 : 0);
}

static void bystander_start(struct sm70t_child *b)
{
	char ready = 0;

	/* start the hostile part only once the bystander is streaming */
	assert_int_equal(sm70t_child_start(b, bystander_body, -1, &ready), 0);
	assert_int_equal(ready, 'r');
}

/* Stops the bystander; fails the test unless every run equalled the reference. Returns the
 * number of runs. */
static int bystander_stop(struct sm70t_child *b)
{
	int counts[2] = { 0, -1 }, status;

	assert_int_equal(sm70t_child_stop(b, counts, sizeof(counts), -1, &status), 0);
	assert_int_equal(counts[1], 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_true(counts[0] >= 1);
	return counts[0];
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_valid_job_matches_reference(void **state)
{
	struct rc c;
	struct sm70_proto_refusal ref;
	struct sm70_proto_sqe e;
	struct sm70_proto_eqe ev;
	int n_top_ok = 0, i;

	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	assert_string_equal(c.w.model_name, "qwen3-gqa2-d64-tied");
	assert_int_equal(c.w.limits.vocab_size, 512);
	/* the first job: check every TOKEN carries 3 alternatives, best first */
	rc_entry(&c, &e, 77, ref_prompt, (uint32_t)ref_n_prompt, (uint32_t)ref_n_tokens);
	e.top_logprobs = 3;
	rc_put(&c, &e);
	rc_publish(&c);
	for (i = 0;; i++) {
		assert_int_equal(rc_next(&c, &ev, 10000), 0);
		assert_int_equal(ev.tag, 77);
		if (ev.type != SM70_PROTO_EV_TOKEN)
			break;
		assert_int_equal(ev.u.token.token, ref_tokens[i]);
		n_top_ok += ev.u.token.n_top == 3 && ev.u.token.top[0].logprob >=
			ev.u.token.top[1].logprob && isfinite(ev.u.token.logprob);
	}
	assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
	assert_int_equal(i, ref_n_tokens);
	assert_int_equal(n_top_ok, ref_n_tokens);
	printf("valid job: %d tokens equal to reference.json case 1, ttft %llu us, "
	       "decode %llu us\n",
	       i, (unsigned long long)ev.u.finish.ttft_us,
	       (unsigned long long)ev.u.finish.decode_us);
	/* twice more on the same session: indices keep wrapping around 2^32 */
	expect_ref_job(&c, 78);
	expect_ref_job(&c, 79);
	printf("valid job: 3 runs on one session, ring indices now sq %u eq %u (started at "
	       "4294967280)\n", c.sq_tail, c.eq_head);
	rc_close(&c);
}

static void test_version_mismatch_refused(void **state)
{
	struct rc c;
	struct sm70_proto_refusal ref;

	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR + 1, 0, &ref), 1);
	assert_int_equal(ref.result, SM70_PROTO_E_VERSION);
	assert_non_null(strstr(ref.reason, "upgrade sm70d"));
	printf("newer client refused: \"%s\"\n", ref.reason);
	rc_close(&c);

	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR - 1, 0, &ref), 1);
	assert_int_equal(ref.result, SM70_PROTO_E_VERSION);
	assert_non_null(strstr(ref.reason, "upgrade libsm70client"));
	printf("older client refused: \"%s\"\n", ref.reason);
	rc_close(&c);
}

enum garbage {
	G_OPCODE,
	G_SIZE,
	G_ARENA,
	G_HUGE_LEN,
	G_HUGE_NEW,
	G_NAN_TEMP,
	G_TOP_P,
	G_BAD_TOKEN,
	G_STOP,
	G_RESERVED,
	G_CANCEL_JUNK,
	G_COUNT
};

static const struct {
	const char *field; /* the ERROR message must start with it */
	int code;
} garbage_expect[G_COUNT] = {
	[G_OPCODE] = { "opcode", SM70_PROTO_E_INVALID },
	[G_SIZE] = { "size", SM70_PROTO_E_INVALID },
	[G_ARENA] = { "arena_pos", SM70_PROTO_E_INVALID },
	[G_HUGE_LEN] = { "arena_pos/prompt_len", SM70_PROTO_E_INVALID },
	[G_HUGE_NEW] = { "max_new_tokens", SM70_PROTO_E_TOO_LARGE },
	[G_NAN_TEMP] = { "temperature", SM70_PROTO_E_INVALID },
	[G_TOP_P] = { "top_p", SM70_PROTO_E_INVALID },
	[G_BAD_TOKEN] = { "prompt[1]", SM70_PROTO_E_INVALID },
	[G_STOP] = { "stop[0]", SM70_PROTO_E_INVALID },
	[G_RESERVED] = { "reserved[2]", SM70_PROTO_E_INVALID },
	[G_CANCEL_JUNK] = { "arena_pos", SM70_PROTO_E_INVALID },
};

static void test_garbage_entries_get_errors(void **state)
{
	static const uint32_t bad_prompt[3] = { 5, 9999, 7 };
	struct rc c;
	struct sm70_proto_refusal ref;
	struct sm70_proto_sqe e;
	struct sm70_proto_eqe ev;
	int seen[G_COUNT] = { 0 }, g;

	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	for (g = 0; g < G_COUNT; g++) {
		rc_entry(&c, &e, 1000 + (uint64_t)g, ref_prompt, 3, 4);
		switch (g) {
		case G_OPCODE: e.opcode = 7; break;
		case G_SIZE: e.size = 64; break;
		case G_ARENA: e.arena_pos = c.w.arena_tokens - 1; break;
		case G_HUGE_LEN: e.prompt_len = 0xffffffffu; break;
		case G_HUGE_NEW: e.max_new_tokens = 0x7fffffffu; break;
		case G_NAN_TEMP: e.temperature = NAN; break;
		case G_TOP_P: e.top_p = 1.5f; break;
		case G_BAD_TOKEN: e.arena_pos = rc_prompt(&c, bad_prompt, 3); break;
		case G_STOP: e.n_stop = 1; e.stop[0] = 100000; break;
		case G_RESERVED: e.reserved[2] = 1; break;
		case G_CANCEL_JUNK: e.opcode = SM70_PROTO_OP_CANCEL; break;
		}
		rc_put(&c, &e);
	}
	rc_publish(&c); /* all of them at once */
	for (g = 0; g < G_COUNT; g++) {
		int k;

		assert_int_equal(rc_next(&c, &ev, 5000), 0);
		assert_int_equal(ev.type, SM70_PROTO_EV_ERROR);
		k = (int)(ev.tag - 1000);
		assert_true(k >= 0 && k < G_COUNT);
		seen[k]++;
		if (strncmp(ev.u.error.message, garbage_expect[k].field,
			    strlen(garbage_expect[k].field)) ||
		    ev.u.error.error != garbage_expect[k].code)
			fail_msg("entry %d: got error %d \"%s\", wanted %d \"%s...\"", k,
				 ev.u.error.error, ev.u.error.message, garbage_expect[k].code,
				 garbage_expect[k].field);
		printf("garbage %-2d -> ERROR %-2d opcode %u \"%s\"\n", k, ev.u.error.error,
		       ev.u.error.opcode, ev.u.error.message);
	}
	for (g = 0; g < G_COUNT; g++)
		assert_int_equal(seen[g], 1);
	/* the session and the daemon still serve */
	expect_ref_job(&c, 2000);
	printf("after %d garbage entries the same session still generates the reference\n",
	       G_COUNT);
	rc_close(&c);
}

static void test_limits_busy_cancel_deadline(void **state)
{
	struct rc c;
	struct sm70_proto_refusal ref;
	struct sm70_proto_sqe e;
	struct sm70_proto_eqe ev;
	struct result *r = malloc(sizeof(*r));
	int busy = 0, finished = 0, i;

	assert_non_null(r);
	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	/* max_jobs_in_flight is 4: the fifth of five entries published together is BUSY */
	for (i = 0; i < 5; i++) {
		rc_entry(&c, &e, 3000 + (uint64_t)i, ref_prompt, 2, 8);
		rc_put(&c, &e);
	}
	rc_publish(&c);
	while (busy + finished < 5) {
		assert_int_equal(rc_next(&c, &ev, 5000), 0);
		if (ev.type == SM70_PROTO_EV_ERROR) {
			assert_int_equal(ev.u.error.error, SM70_PROTO_E_BUSY);
			assert_int_equal(ev.tag, 3004);
			busy++;
		} else if (ev.type == SM70_PROTO_EV_FINISH) {
			finished++;
		}
	}
	assert_int_equal(busy, 1);
	printf("limits: 4 jobs finished, the 5th got E_BUSY\n");

	/* CANCEL a long job after its second token */
	rc_entry(&c, &e, 3100, ref_prompt, 5, 4000);
	e.flags = SM70_PROTO_SQF_IGNORE_EOS;
	rc_put(&c, &e);
	rc_publish(&c);
	for (i = 0; i < 2;) {
		assert_int_equal(rc_next(&c, &ev, 5000), 0);
		i += ev.type == SM70_PROTO_EV_TOKEN;
	}
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_CANCEL;
	e.tag = 3100;
	rc_put(&c, &e);
	rc_publish(&c);
	rc_collect_from(&c, 3100, 2, r, 5000);
	assert_int_equal(r->final.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(r->final.u.finish.reason, SM70_PROTO_FINISH_CANCELLED);
	assert_int_equal(r->final.u.finish.completion_tokens, r->n + 2);
	printf("cancel: FINISH(CANCELLED) after %u tokens\n", r->final.u.finish.completion_tokens);

	/* a 100 ms deadline on a job that would take seconds */
	rc_entry(&c, &e, 3200, ref_prompt, 5, 4000);
	e.flags = SM70_PROTO_SQF_IGNORE_EOS;
	e.deadline_ms = 100;
	rc_put(&c, &e);
	rc_publish(&c);
	rc_collect(&c, 3200, r, 5000);
	assert_int_equal(r->final.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(r->final.u.finish.reason, SM70_PROTO_FINISH_DEADLINE);
	assert_true(r->n < 4000);
	printf("deadline: FINISH(DEADLINE) after %u tokens\n", r->n);
	free(r);
	rc_close(&c);
}

static void test_sq_tail_out_of_range(void **state)
{
	struct rc c, ok;
	struct sm70_proto_refusal ref;
	struct sm70_proto_eqe ev;

	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	c.sq_tail += 100000; /* far past sq_head */
	rc_publish(&c);
	rc_ring(c.bell);
	assert_int_equal(rc_next(&c, &ev, 3000), -EPIPE);
	printf("sq_tail 100000 ahead: the daemon hung up on that client only\n");
	rc_close(&c);

	assert_int_equal(rc_connect(&ok, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	expect_ref_job(&ok, 1);
	rc_close(&ok);
}

static void test_slow_consumer(void **state)
{
	struct rc slow, good;
	struct sm70_proto_refusal ref;
	struct sm70_proto_sqe e;
	struct result *r = malloc(sizeof(*r));

	assert_non_null(r);
	assert_int_equal(rc_connect(&slow, SM70_PROTO_VERSION_MAJOR, 16, &ref), 0);
	assert_int_equal(slow.w.eq_entries, 16);
	rc_entry(&slow, &e, 42, ref_prompt, 5, 3000);
	e.flags = SM70_PROTO_SQF_IGNORE_EOS;
	rc_put(&slow, &e);
	rc_publish(&slow);

	/* meanwhile another client is served normally */
	assert_int_equal(rc_connect(&good, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	expect_ref_job(&good, 5);

	usleep(600 * 1000); /* twice slow_consumer_ms without reading */
	rc_collect(&slow, 42, r, 5000);
	assert_int_equal(r->final.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(r->final.u.finish.reason, SM70_PROTO_FINISH_ERROR);
	assert_int_equal(r->final.u.finish.error, SM70_PROTO_E_SLOW_CONSUMER);
	assert_int_equal(r->final.u.finish.completion_tokens, r->n);
	assert_true(r->n < 3000);
	printf("slow consumer: FINISH(ERROR, E_SLOW_CONSUMER) after %u delivered tokens; "
	       "the other client got the reference meanwhile\n", r->n);
	/* the session stays usable once it reads again */
	expect_ref_job(&slow, 43);
	expect_ref_job(&good, 6);
	free(r);
	rc_close(&slow);
	rc_close(&good);
}

static void test_client_dies_midstream(void **state)
{
	struct rc dead, ok;
	struct sm70_proto_refusal ref;
	struct sm70_proto_sqe e;
	struct sm70_proto_eqe ev;
	long t0;
	int i;

	assert_int_equal(rc_connect(&dead, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	for (i = 0; i < 2; i++) {
		rc_entry(&dead, &e, 10 + (uint64_t)i, ref_prompt, 5, 4000);
		e.flags = SM70_PROTO_SQF_IGNORE_EOS;
		rc_put(&dead, &e);
	}
	rc_publish(&dead);
	for (i = 0; i < 3;) {
		assert_int_equal(rc_next(&dead, &ev, 5000), 0);
		i += ev.type == SM70_PROTO_EV_TOKEN;
	}
	rc_close(&dead); /* socket closed and segment unmapped mid-stream */

	t0 = sm70t_ms_now();
	while (!sm70t_log_contains(&dmn, "closed: the client hung up (2 jobs to cancel)") &&
	       sm70t_ms_now() - t0 < 3000)
		usleep(10000);
	assert_true(sm70t_log_contains(&dmn, "closed: the client hung up (2 jobs to cancel)"));
	assert_int_equal(rc_connect(&ok, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	expect_ref_job(&ok, 1);
	printf("client died with 2 jobs running: the daemon cancelled them (log) and still "
	       "serves\n");
	rc_close(&ok);
}

static void test_flood_submissions(void **state)
{
	enum { N = 2000, TAG0 = 50000 };
	struct rc c;
	struct sm70_proto_refusal ref;
	struct sm70_proto_sqe e;
	struct sm70_proto_eqe ev;
	struct sm70t_child b;
	uint8_t *finals = calloc(N, 1);
	uint32_t *toks = calloc(N, sizeof(*toks));
	int sent = 0, n_final = 0, busy = 0, finished = 0, runs;
	long t0 = sm70t_ms_now();

	assert_non_null(finals);
	assert_non_null(toks);
	bystander_start(&b);
	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR, 4096, &ref), 0);
	/* max_jobs_in_flight is 4: publish N entries as fast as the SQ takes them, reading
	 * events in between, never waiting while there is something to send */
	while (n_final < N) {
		int put = 0, ret;
		uint64_t k;

		while (sent < N && c.sq_tail - sm70_ring_load_acquire(&c.h->sq_head) <
					   c.w.sq_entries) {
			rc_entry(&c, &e, TAG0 + (uint64_t)sent, ref_prompt, 2, 2);
			e.flags = SM70_PROTO_SQF_IGNORE_EOS;
			rc_put(&c, &e);
			sent++;
			put++;
		}
		if (put)
			rc_publish(&c);
		ret = rc_next(&c, &ev, sent < N ? 0 : 5000);
		if (ret == -ETIMEDOUT && sent < N)
			continue;
		assert_int_equal(ret, 0);
		k = ev.tag - TAG0;
		assert_true(ev.tag >= TAG0 && k < N);
		assert_int_equal(finals[k], 0); /* nothing after a job's final event */
		if (ev.type == SM70_PROTO_EV_TOKEN) {
			toks[k]++;
			continue;
		}
		finals[k]++;
		n_final++;
		if (ev.type == SM70_PROTO_EV_ERROR) {
			assert_int_equal(ev.u.error.error, SM70_PROTO_E_BUSY);
			assert_int_equal(toks[k], 0);
			busy++;
		} else {
			assert_int_equal(ev.type, SM70_PROTO_EV_FINISH);
			assert_int_equal(ev.u.finish.reason, SM70_PROTO_FINISH_LENGTH);
			assert_int_equal(ev.u.finish.completion_tokens, 2);
			assert_int_equal(toks[k], 2);
			finished++;
		}
	}
	for (int i = 0; i < N; i++)
		assert_int_equal(finals[i], 1);
	assert_true(busy > 0);
	assert_true(finished >= 4);
	assert_int_equal(busy + finished, N);
	runs = bystander_stop(&b);
	printf("flood: %d submissions in %ld ms against a limit of 4 in flight: %d finished "
	       "(2 tokens each), %d E_BUSY, every tag exactly one final event; a bystander "
	       "client got the reference %d times meanwhile\n", N, sm70t_ms_now() - t0,
	       finished, busy, runs);
	/* the flooding session itself still works */
	expect_ref_job(&c, 1);
	free(finals);
	free(toks);
	rc_close(&c);
}

/* A raw connection to the daemon (no hello yet). */
static int raw_connect(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", dmn.sock);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

static void test_hangup_mid_handshake(void **state)
{
	struct sm70_proto_hello h;
	struct sm70_proto_refusal rf;
	struct sm70_proto_refusal ref;
	struct pollfd p;
	struct sm70t_child b;
	struct rc ok;
	int fd, runs;
	ssize_t n;

	memset(&h, 0, sizeof(h));
	h.size = sizeof(h);
	h.magic = SM70_PROTO_MAGIC;
	h.type = SM70_PROTO_MSG_HELLO;
	h.version_major = SM70_PROTO_VERSION_MAJOR;
	snprintf(h.client_name, sizeof(h.client_name), "half-hello");
	bystander_start(&b);
	for (int i = 0; i < 100; i++) /* connect, hang up before any hello */
		close(raw_connect());
	for (int i = 0; i < 100; i++) { /* half a hello, then hang up */
		fd = raw_connect();
		assert_int_equal(send(fd, &h, sizeof(h) / 2, MSG_NOSIGNAL), sizeof(h) / 2);
		close(fd);
	}
	for (int i = 0; i < 100; i++) { /* a whole hello, gone before the welcome and its fds */
		fd = raw_connect();
		assert_int_equal(send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
		close(fd);
	}
	/* half a hello from a client that waits: refused as malformed, then closed */
	fd = raw_connect();
	assert_int_equal(send(fd, &h, sizeof(h) / 2, MSG_NOSIGNAL), sizeof(h) / 2);
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 5000), 1);
	memset(&rf, 0, sizeof(rf));
	n = recv(fd, &rf, sizeof(rf), 0);
	assert_int_equal(n, sizeof(rf));
	assert_int_equal(rf.type, SM70_PROTO_MSG_REFUSAL);
	assert_int_equal(rf.result, SM70_PROTO_E_INVALID);
	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(recv(fd, &rf, sizeof(rf), 0), 0);
	printf("half a hello (%zu bytes) refused: \"%s\"\n", sizeof(h) / 2, rf.reason);
	close(fd);
	runs = bystander_stop(&b);
	/* the daemon still admits and serves a proper client */
	assert_int_equal(rc_connect(&ok, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	expect_ref_job(&ok, 1);
	rc_close(&ok);
	printf("handshake hang-ups: 100 before the hello, 100 after half a hello, 100 before the "
	       "welcome; a bystander got the reference %d times meanwhile, a new session "
	       "still gets it\n", runs);
}

static void test_sigterm_drains(void **state)
{
	struct rc c, late;
	struct sm70_proto_refusal ref;
	struct sm70_proto_sqe e;
	struct sm70_proto_eqe ev;
	struct result *r = malloc(sizeof(*r));
	int st, i;

	assert_non_null(r);
	assert_int_equal(rc_connect(&c, SM70_PROTO_VERSION_MAJOR, 0, &ref), 0);
	rc_entry(&c, &e, 1, ref_prompt, 5, 4000);
	e.flags = SM70_PROTO_SQF_IGNORE_EOS;
	rc_put(&c, &e);
	rc_publish(&c);
	for (i = 0; i < 2;) {
		assert_int_equal(rc_next(&c, &ev, 5000), 0);
		i += ev.type == SM70_PROTO_EV_TOKEN;
	}
	kill(dmn.pid, SIGTERM);
	usleep(100 * 1000);
	/* a new job during the drain: E_SHUTDOWN */
	rc_entry(&c, &e, 2, ref_prompt, 5, 4);
	rc_put(&c, &e);
	rc_publish(&c);
	/* a new session during the drain: refused with E_SHUTDOWN */
	assert_int_equal(rc_connect(&late, SM70_PROTO_VERSION_MAJOR, 0, &ref), 1);
	assert_int_equal(ref.result, SM70_PROTO_E_SHUTDOWN);
	rc_close(&late);

	memset(r, 0, sizeof(*r));
	for (int finals = 0; finals < 2;) {
		assert_int_equal(rc_next(&c, &ev, 5000), 0);
		if (ev.tag == 2) {
			assert_int_equal(ev.type, SM70_PROTO_EV_ERROR);
			assert_int_equal(ev.u.error.error, SM70_PROTO_E_SHUTDOWN);
			finals++;
		} else if (ev.type != SM70_PROTO_EV_TOKEN) {
			r->final = ev;
			finals++;
		}
	}
	/* the long job outlived the 300 ms grace */
	assert_int_equal(r->final.type, SM70_PROTO_EV_FINISH);
	assert_int_equal(r->final.u.finish.reason, SM70_PROTO_FINISH_ERROR);
	assert_int_equal(r->final.u.finish.error, SM70_PROTO_E_SHUTDOWN);
	st = sm70t_daemon_wait(&dmn, 5000);
	if (st != 0)
		sm70t_daemon_dump_log(&dmn);
	assert_int_equal(st, 0);
	assert_int_equal(rc_next(&c, &ev, 1000), -EPIPE);
	printf("SIGTERM: new job E_SHUTDOWN, new session refused, running job "
	       "FINISH(ERROR, E_SHUTDOWN) after the grace, exit status 0\n");
	free(r);
	rc_close(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid_job_matches_reference),
		cmocka_unit_test(test_version_mismatch_refused),
		cmocka_unit_test(test_garbage_entries_get_errors),
		cmocka_unit_test(test_limits_busy_cancel_deadline),
		cmocka_unit_test(test_sq_tail_out_of_range),
		cmocka_unit_test(test_slow_consumer),
		cmocka_unit_test(test_client_dies_midstream),
		cmocka_unit_test(test_flood_submissions),
		cmocka_unit_test(test_hangup_mid_handshake),
		cmocka_unit_test(test_sigterm_drains),
	};
	int ret = cmocka_run_group_tests(tests, setup, teardown);

	if (ret)
		sm70t_daemon_dump_log(&dmn);
	sm70t_daemon_cleanup(&dmn);
	return ret;
}
