/*
 * test_sdk - libsm70client end to end against a real sm70d (CPU backend, tiny fixture),
 * plus its ring/arena logic and a version refusal without one.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sdk/ring.h"
#include "shm_proto/sm70_proto.h"
#include "shm_proto/sm70_validate.h"
#include "sm70/client.h"

#define FIXTURE "tests/fixtures/qwen3-gqa2-d64-tied"
#define MAX_CASES 8
#define MAX_TOK 64

/* ---- helpers: the daemon under test -------------------------------------------------------- */

static const char *build_dir(void)
{
	const char *b = getenv("SM70_BUILD");

	return b && *b ? b : "build";
}

struct env {
	char dir[64];
	char sock[100];
	char log[128];
	char config[128];
	pid_t pid;
	/* reference.json */
	int n_cases;
	uint32_t prompt[MAX_CASES][256];
	uint32_t prompt_len[MAX_CASES];
	uint32_t tokens[MAX_CASES][MAX_TOK];
	uint32_t n_tokens[MAX_CASES];
};

static struct env E;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* True once something accepts connections on path. */
static int socket_accepts(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), ok;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Starts sm70d on E.sock and waits (up to 20 s) until it accepts. Returns 0 or -1. */
static int daemon_start(void)
{
	char bin[256];
	double t0 = now_s();
	int status;

	snprintf(bin, sizeof(bin), "%s/bin/sm70d", build_dir());
	unlink(E.sock); /* a stale file from a killed daemon */
	E.pid = fork();
	if (E.pid < 0)
		return -1;
	if (E.pid == 0) {
		int fd = open(E.log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		/* not under systemd, whatever the test runner's environment says */
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		execl(bin, bin, "--model", FIXTURE, "--backend", "cpu", "--socket", E.sock,
		      "--config", E.config, (char *)NULL);
		_exit(127);
	}
	while (now_s() - t0 < 20) {
		if (socket_accepts(E.sock))
			return 0;
		if (waitpid(E.pid, &status, WNOHANG) == E.pid) {
			fprintf(stderr, "sm70d exited early (status %d); see %s\n", status, E.log);
			E.pid = 0;
			return -1;
		}
		usleep(10000);
	}
	fprintf(stderr, "sm70d did not accept on %s within 20 s\n", E.sock);
	return -1;
}

static void daemon_stop(int sig)
{
	double t0 = now_s();

	if (E.pid <= 0)
		return;
	kill(E.pid, sig);
	while (waitpid(E.pid, NULL, WNOHANG) != E.pid) {
		if (now_s() - t0 > 10) {
			kill(E.pid, SIGKILL);
			waitpid(E.pid, NULL, 0);
			break;
		}
		usleep(5000);
	}
	E.pid = 0;
}

static int load_reference(void)
{
	json_error_t jerr;
	json_t *root = json_load_file(FIXTURE "/reference.json", 0, &jerr), *cases, *c;
	size_t i, k;

	if (!root)
		return -1;
	cases = json_object_get(root, "cases");
	json_array_foreach(cases, i, c) {
		json_t *p = json_object_get(c, "prompt"), *t = json_object_get(c, "tokens"), *x;

		if (i >= MAX_CASES || json_array_size(p) > 256 || json_array_size(t) > MAX_TOK)
			break;
		json_array_foreach(p, k, x)
			E.prompt[i][k] = (uint32_t)json_integer_value(x);
		json_array_foreach(t, k, x)
			E.tokens[i][k] = (uint32_t)json_integer_value(x);
		E.prompt_len[i] = (uint32_t)json_array_size(p);
		E.n_tokens[i] = (uint32_t)json_array_size(t);
		E.n_cases = (int)i + 1;
	}
	json_decref(root);
	return E.n_cases >= 3 ? 0 : -1;
}

static int make_dir(void)
{
	char tmpl[] = "/tmp/sm70-sdk-XXXXXX";

	if (!mkdtemp(tmpl))
		return -1;
	snprintf(E.dir, sizeof(E.dir), "%s", tmpl);
	snprintf(E.sock, sizeof(E.sock), "%s/s.sock", E.dir);
	snprintf(E.log, sizeof(E.log), "%s/sm70d.log", E.dir);
	snprintf(E.config, sizeof(E.config), "%s/config.json", E.dir);
	return 0;
}

static int remove_dir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", E.dir);
	return system(cmd) == 0 ? 0 : -1;
}

static int offline_setup(void **state)
{
	return make_dir();
}

static int offline_teardown(void **state)
{
	return remove_dir();
}

/* Small rings whose indices start 256 below 2^32, so that the tests cross the wrap and fill
 * the event ring (8 jobs x 24 tokens > 64 events) through the real daemon. */
static const char daemon_config[] =
	"{\"rings\": {\"sq_entries\": 16, \"eq_entries\": 64, \"arena_tokens\": 1024,"
	" \"start_index\": 4294967040}}\n";

static int group_setup(void **state)
{
	FILE *f;

	if (make_dir() || load_reference())
		return -1;
	f = fopen(E.config, "w");
	if (!f)
		return -1;
	fputs(daemon_config, f);
	fclose(f);
	return daemon_start();
}

static int group_teardown(void **state)
{
	daemon_stop(SIGTERM);
	if (getenv("SM70_KEEP_LOG")) {
		fprintf(stderr, "sm70d log kept in %s\n", E.log);
		return 0;
	}
	return remove_dir();
}

static struct sm70_client *connect_ok(void)
{
	struct sm70_client *c = NULL;
	int ret = sm70_client_connect(&c, E.sock, NULL);

	if (ret)
		fprintf(stderr, "connect: %s (%s)\n", sm70_strerror(ret),
			sm70_client_last_error(c));
	assert_int_equal(ret, 0);
	return c;
}

static void greedy_job(struct sm70_job *j, int k, uint64_t tag)
{
	sm70_job_init(j);
	j->prompt = E.prompt[k];
	j->prompt_len = E.prompt_len[k];
	j->max_tokens = E.n_tokens[k];
	j->flags = SM70_JOB_IGNORE_EOS;
	j->top_logprobs = 3;
	j->user_tag = tag;
}

/* ---- without a daemon: the ring and arena logic --------------------------------------------- */

/* The daemon's half, as PROTOCOL.md section 7 describes it: copy one entry out, free its
 * arena space and its slot. */
static void fake_daemon_consume(struct sm70_proto_seg_hdr *h, void *seg, struct sm70_proto_sqe *out)
{
	uint32_t head = h->sq_head;

	memcpy(out, &sm70_proto_sq(seg, h)[sm70_ring_slot(head, h->sq_entries)], sizeof(*out));
	if (out->opcode == SM70_PROTO_OP_SUBMIT)
		sm70_ring_store_release(&h->arena_head, out->arena_pos + out->prompt_len);
	sm70_ring_store_release(&h->sq_head, head + 1);
}

static void test_ring_logic(void **state)
{
	const uint32_t start = 0xfffffffeu; /* indices wrap at 2^32 during the test */
	struct sm70_proto_seg_hdr h;
	struct sm70_proto_sqe e, got;
	struct sm70_proto_eqe ev;
	struct sm70__rings r;
	uint32_t p5[5] = { 1, 2, 3, 4, 5 }, pos = 0, i;
	void *seg;
	int ring;

	assert_int_equal(sm70_proto_layout_init(&h, 4, 4, 16, start), 0);
	seg = aligned_alloc(4096, h.total_size);
	assert_non_null(seg);
	memset(seg, 0, h.total_size);
	memcpy(seg, &h, sizeof(h));
	struct sm70_proto_seg_hdr *sh = seg;
	sm70__rings_init(&r, seg, &h);
	assert_int_equal(r.sq_tail, start);
	assert_int_equal(r.arena_tail, start);

	/* pure placement rules */
	assert_int_equal(sm70__arena_place(0, 0, 16, 17, &pos), -E2BIG);
	assert_int_equal(sm70__arena_place(0, 0, 16, 0, &pos), -EINVAL);
	assert_int_equal(sm70__arena_place(0, 0, 16, 16, &pos), 0);
	assert_int_equal(pos, 0);
	assert_int_equal(sm70__arena_place(3, 0, 16, 14, &pos), -EAGAIN); /* skip to 16 */
	assert_int_equal(sm70__arena_place(5, 3, 16, 14, &pos), -EAGAIN);
	/* an empty arena takes a prompt longer than half of it, skip or not */
	assert_int_equal(sm70__arena_place(3, 3, 16, 14, &pos), 0);
	assert_int_equal(pos, 16);

	/* a 5-token prompt at slot 14 would wrap: it goes to the arena start (position 2^32) */
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_SUBMIT;
	e.tag = 7;
	e.prompt_len = 5;
	assert_int_equal(sm70__sq_push(&r, &e, p5, 5), 0); /* daemon awake: no doorbell */
	assert_int_equal(e.arena_pos, 0);
	assert_memory_equal(sm70_proto_arena(seg, &h), p5, sizeof(p5));
	assert_int_equal(sh->sq_tail, start + 1);
	assert_int_equal(sm70__sq_push(&r, &e, p5, 5), 0);
	assert_int_equal(e.arena_pos, 5);
	/* 7 skipped + 10 used: the third prompt needs 17 of 16 */
	assert_int_equal(sm70__sq_push(&r, &e, p5, 5), -EAGAIN);
	assert_int_equal(sh->sq_tail, start + 2); /* nothing published on failure */

	/* fill the SQ with CANCELs (no arena), then one more is refused */
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_CANCEL;
	e.tag = 7;
	assert_int_equal(sm70__sq_push(&r, &e, NULL, 0), 0);
	assert_int_equal(sm70__sq_push(&r, &e, NULL, 0), 0);
	assert_int_equal(sm70__sq_push(&r, &e, NULL, 0), -EAGAIN);

	/* the daemon reads the first entry: the skipped tokens and the prompt are free */
	fake_daemon_consume(sh, seg, &got);
	assert_int_equal(got.opcode, SM70_PROTO_OP_SUBMIT);
	assert_int_equal(got.arena_pos, 0);
	assert_int_equal(sh->arena_head, 5);
	/* it sleeps: the next push asks for the doorbell */
	sh->daemon_sleeping = 1;
	memset(&e, 0, sizeof(e));
	e.size = sizeof(e);
	e.opcode = SM70_PROTO_OP_SUBMIT;
	e.prompt_len = 5;
	assert_int_equal(sm70__sq_push(&r, &e, p5, 5), 1);
	assert_int_equal(e.arena_pos, 10);
	for (i = 0; i < 4; i++)
		fake_daemon_consume(sh, seg, &got);
	assert_int_equal(sh->sq_head, sh->sq_tail);
	assert_int_equal(sh->arena_head, 15);

	/* event ring: the daemon posts three events across the 2^32 wrap */
	struct sm70_proto_eqe *eq = sm70_proto_eq(seg, &h);
	for (i = 0; i < 3; i++) {
		memset(&eq[sm70_ring_slot(start + i, 4)], 0, sizeof(ev));
		eq[sm70_ring_slot(start + i, 4)].type = SM70_PROTO_EV_TOKEN;
		eq[sm70_ring_slot(start + i, 4)].index = i;
	}
	sm70_ring_store_release(&sh->eq_tail, start + 3);
	assert_int_equal(sm70__eq_pending(&r), 3);
	assert_int_equal(sm70__eq_pop(&r, &ev, &ring), 1);
	assert_int_equal(ev.index, 0);
	assert_int_equal(ring, 0);
	sh->eq_space_wanted = 1;
	/* the daemon waits for space: one doorbell when the ring is half or fully drained,
	 * not one per event (1 of 4 left: neither) */
	assert_int_equal(sm70__eq_pop(&r, &ev, &ring), 1);
	assert_int_equal(ev.index, 1);
	assert_int_equal(ring, 0);
	assert_int_equal(sh->eq_head, start + 2);
	assert_int_equal(sm70__eq_pop(&r, &ev, &ring), 1);
	assert_int_equal(ev.index, 2);
	assert_int_equal(ring, 1);
	assert_int_equal(sm70__eq_pop(&r, &ev, &ring), 0);
	/* a broken daemon: eq_tail more than eq_entries ahead */
	sm70_ring_store_release(&sh->eq_tail, start + 3 + 5);
	assert_int_equal(sm70__eq_pop(&r, &ev, &ring), -EPROTO);
	printf("ring: SQ full, arena full, skip at the end, wrap at 2^32 and the doorbell flags "
	       "all as specified\n");
	free(seg);
}

/* ---- without a daemon: refusals and errors -------------------------------------------------- */

static void *fake_refusing_daemon(void *arg)
{
	int lfd = *(int *)arg, fd;
	struct sm70_proto_hello hello;
	struct sm70_proto_refusal ref;

	fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	memset(&hello, 0, sizeof(hello));
	if (recv(fd, &hello, sizeof(hello), 0) == (ssize_t)sizeof(hello) &&
	    hello.magic == SM70_PROTO_MAGIC && hello.type == SM70_PROTO_MSG_HELLO) {
		memset(&ref, 0, sizeof(ref));
		ref.size = sizeof(ref);
		ref.magic = SM70_PROTO_MAGIC;
		ref.type = SM70_PROTO_MSG_REFUSAL;
		ref.version_major = 2;
		ref.result = SM70_PROTO_E_VERSION;
		snprintf(ref.reason, sizeof(ref.reason),
			 "sm70d speaks shared-memory protocol 2.x and this client speaks %u.x: "
			 "upgrade libsm70client", hello.version_major);
		send(fd, &ref, sizeof(ref), MSG_NOSIGNAL);
	}
	close(fd);
	return NULL;
}

static void test_refusal_and_errors(void **state)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct sm70_client *c = NULL;
	pthread_t th;
	int lfd, ret;

	/* nobody listening: -ENOENT, and a handle that explains it */
	ret = sm70_client_connect(&c, "/nonexistent/sm70.sock", NULL);
	assert_int_equal(ret, -ENOENT);
	assert_non_null(c);
	assert_non_null(strstr(sm70_client_last_error(c), "is sm70d running"));
	struct sm70_event ev = { .size = sizeof(ev) };
	assert_int_equal(sm70_next_event(c, &ev, 0), -ENOTCONN);
	sm70_client_close(c);

	/* a daemon of another major version refuses with a sentence */
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/fake.sock", E.dir);
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(pthread_create(&th, NULL, fake_refusing_daemon, &lfd), 0);
	ret = sm70_client_connect(&c, sa.sun_path, NULL);
	pthread_join(th, NULL);
	close(lfd);
	assert_int_equal(ret, -SM70_E_VERSION);
	assert_non_null(strstr(sm70_client_last_error(c), "upgrade libsm70client"));
	printf("refusal: %s -> \"%s\"\n", sm70_strerror(ret), sm70_client_last_error(c));
	sm70_client_close(c);

	assert_string_equal(sm70_strerror(-SM70_E_BUSY), "too many sessions or jobs in flight");
	assert_string_equal(sm70_strerror(-ECONNRESET), "Connection reset by peer");
	assert_string_equal(sm70_strerror(-(SM70_E_BASE + 500)), "unknown sm70 error");
}

/* ---- with the daemon ------------------------------------------------------------------------ */

/* Reads every event of the handle until n_jobs final events arrived (or timeout). */
struct collect {
	uint64_t ids[32];
	uint32_t tokens[32][MAX_TOK];
	uint32_t n[32];
	int index_ok[32];
	struct sm70_event fin[32];
	int done[32];
	int n_jobs, n_done, err;
};

static int collect_all(struct sm70_client *c, struct collect *col, double timeout_s)
{
	struct sm70_event ev = { .size = sizeof(ev) };
	double t0 = now_s();
	int k, ret;

	while (col->n_done < col->n_jobs) {
		if (now_s() - t0 > timeout_s)
			return -ETIMEDOUT;
		ret = sm70_next_event(c, &ev, 1000);
		if (ret == -ETIMEDOUT)
			continue;
		if (ret)
			return ret;
		for (k = 0; k < col->n_jobs && col->ids[k] != ev.job_id; k++)
			;
		if (k == col->n_jobs)
			return -ENOENT; /* an event for a job we never submitted */
		if (ev.type == SM70_EVENT_TOKEN) {
			if (ev.index != col->n[k] || (ev.n_top && ev.top[0].id != ev.token &&
						      ev.top[0].logprob > ev.logprob))
				col->index_ok[k] = 0;
			if (col->n[k] < MAX_TOK)
				col->tokens[k][col->n[k]] = ev.token;
			col->n[k]++;
		}
		if (ev.flags & SM70_EVENT_FINAL) {
			col->fin[k] = ev;
			col->done[k] = 1;
			col->n_done++;
		}
	}
	return 0;
}

static void test_greedy_stream(void **state)
{
	struct sm70_client *c = connect_ok();
	struct collect col = { .n_jobs = 1, .index_ok = { 1 } };
	struct sm70_client_info info = { .size = sizeof(info) };
	struct sm70_job j;

	assert_int_equal(sm70_client_info(c, &info), 0);
	printf("session %u, model '%s', rings %u/%u, arena %u tokens, %u jobs in flight\n",
	       info.session_id, info.model_name, info.sq_entries, info.eq_entries,
	       info.arena_tokens, info.limits.max_jobs_in_flight);
	greedy_job(&j, 1, 0xabc);
	assert_int_equal(sm70_submit(c, &j, &col.ids[0]), 0);
	assert_int_equal(collect_all(c, &col, 30), 0);
	assert_true(col.index_ok[0]);
	assert_int_equal(col.n[0], E.n_tokens[1]);
	assert_memory_equal(col.tokens[0], E.tokens[1], sizeof(uint32_t) * E.n_tokens[1]);
	assert_int_equal(col.fin[0].type, SM70_EVENT_FINISH);
	assert_int_equal(col.fin[0].finish_reason, SM70_REASON_LENGTH);
	assert_int_equal(col.fin[0].user_tag, 0xabc);
	assert_int_equal(col.fin[0].usage.prompt_tokens, E.prompt_len[1]);
	assert_int_equal(col.fin[0].usage.completion_tokens, E.n_tokens[1]);
	printf("greedy stream: %u/%u tokens equal reference case 1, ttft %llu us, decode %llu us\n",
	       col.n[0], E.n_tokens[1], (unsigned long long)col.fin[0].usage.ttft_us,
	       (unsigned long long)col.fin[0].usage.decode_us);
	sm70_client_close(c);
}

/* One handle with 8 jobs in flight (reference cases round robin); run by 3 threads at once. */
struct many {
	struct collect col;
	int ret;
};

static void *many_worker(void *arg)
{
	struct many *m = arg;
	struct sm70_client *c = NULL;
	struct sm70_job j;
	int k;

	m->ret = sm70_client_connect(&c, E.sock, NULL);
	if (m->ret)
		goto out;
	m->col.n_jobs = 8;
	for (k = 0; k < 8; k++) {
		greedy_job(&j, k % E.n_cases, (uint64_t)k);
		m->col.index_ok[k] = 1;
		m->ret = sm70_submit(c, &j, &m->col.ids[k]);
		if (m->ret)
			goto out;
	}
	m->ret = collect_all(c, &m->col, 60);
out:
	sm70_client_close(c);
	return NULL;
}

static void test_many_jobs_many_handles(void **state)
{
	struct many m[3];
	pthread_t th[3];
	int h, k, exact = 0;

	memset(m, 0, sizeof(m));
	for (h = 0; h < 3; h++)
		assert_int_equal(pthread_create(&th[h], NULL, many_worker, &m[h]), 0);
	for (h = 0; h < 3; h++)
		pthread_join(th[h], NULL);
	for (h = 0; h < 3; h++) {
		assert_int_equal(m[h].ret, 0);
		for (k = 0; k < 8; k++) {
			int cs = k % E.n_cases;
			const struct sm70_event *f = &m[h].col.fin[k];

			assert_true(m[h].col.index_ok[k]);
			assert_int_equal(f->type, SM70_EVENT_FINISH);
			assert_int_equal(f->finish_reason, SM70_REASON_LENGTH);
			assert_int_equal(f->user_tag, (uint64_t)k);
			assert_int_equal(f->usage.prompt_tokens, E.prompt_len[cs]);
			assert_int_equal(f->usage.completion_tokens, E.n_tokens[cs]);
			assert_int_equal(m[h].col.n[k], E.n_tokens[cs]);
			exact += memcmp(m[h].col.tokens[k], E.tokens[cs],
					sizeof(uint32_t) * E.n_tokens[cs]) == 0;
		}
	}
	printf("many: 3 handles x 8 jobs in flight all finished with correct usage; "
	       "%d/24 token streams equal their reference case\n", exact);
	assert_int_equal(exact, 24);
}

/* Four threads submit on one shared handle while the main thread consumes (the documented
 * rule: any threads submit, one consumes). Jobs are told apart by user_tag. */
struct shared_sub {
	struct sm70_client *c;
	int first, ret;
};

static void *submitter(void *arg)
{
	struct shared_sub *s = arg;
	struct sm70_job j;
	uint64_t id;
	int k;

	for (k = s->first; k < s->first + 4; k++) {
		greedy_job(&j, k % E.n_cases, (uint64_t)k);
		while ((s->ret = sm70_submit(s->c, &j, &id)) == -EAGAIN)
			usleep(100);
		if (s->ret)
			return NULL;
	}
	return NULL;
}

static void test_threads_share_handle(void **state)
{
	struct sm70_client *c = connect_ok();
	struct sm70_event ev = { .size = sizeof(ev) };
	struct shared_sub sub[4];
	pthread_t th[4];
	uint32_t got[16][MAX_TOK], n[16] = { 0 };
	int t, k, done = 0, ret;
	double t0 = now_s();

	for (t = 0; t < 4; t++) {
		sub[t] = (struct shared_sub){ .c = c, .first = 4 * t };
		assert_int_equal(pthread_create(&th[t], NULL, submitter, &sub[t]), 0);
	}
	while (done < 16 && now_s() - t0 < 60) {
		ret = sm70_next_event(c, &ev, 1000);
		if (ret == -ETIMEDOUT)
			continue;
		assert_int_equal(ret, 0);
		assert_true(ev.user_tag < 16);
		k = (int)ev.user_tag;
		if (ev.type == SM70_EVENT_TOKEN && n[k] < MAX_TOK)
			got[k][n[k]++] = ev.token;
		if (ev.flags & SM70_EVENT_FINAL) {
			assert_int_equal(ev.finish_reason, SM70_REASON_LENGTH);
			assert_int_equal(ev.usage.completion_tokens, n[k]);
			done++;
		}
	}
	for (t = 0; t < 4; t++) {
		pthread_join(th[t], NULL);
		assert_int_equal(sub[t].ret, 0);
	}
	assert_int_equal(done, 16);
	for (k = 0; k < 16; k++) {
		assert_int_equal(n[k], E.n_tokens[k % E.n_cases]);
		assert_memory_equal(got[k], E.tokens[k % E.n_cases], sizeof(uint32_t) * n[k]);
	}
	printf("shared handle: 4 submitting threads x 4 jobs, one consumer: 16/16 correct\n");
	sm70_client_close(c);
}

/* sm70_generate keeps the events of the application's other jobs for sm70_next_event. */
static int count_tokens(void *ctx, const struct sm70_event *ev)
{
	uint32_t *toks = ctx;

	if (toks[0] < MAX_TOK - 1)
		toks[1 + toks[0]++] = ev->token;
	return 0;
}

static void test_generate_keeps_other_events(void **state)
{
	struct sm70_client *c = connect_ok();
	struct sm70_result res = { .size = sizeof(res) };
	struct collect col = { .n_jobs = 1, .index_ok = { 1 } };
	uint32_t toks[MAX_TOK] = { 0 };
	struct sm70_job bg, fg;

	greedy_job(&bg, 2, 2);
	assert_int_equal(sm70_submit(c, &bg, &col.ids[0]), 0);
	greedy_job(&fg, 1, 1);
	assert_int_equal(sm70_generate(c, &fg, count_tokens, toks, &res), 0);
	assert_int_equal(res.finish_reason, SM70_REASON_LENGTH);
	assert_int_equal(toks[0], E.n_tokens[1]);
	assert_memory_equal(toks + 1, E.tokens[1], sizeof(uint32_t) * E.n_tokens[1]);
	assert_int_equal(collect_all(c, &col, 30), 0); /* the background job, complete */
	assert_true(col.index_ok[0]);
	assert_int_equal(col.n[0], E.n_tokens[2]);
	assert_memory_equal(col.tokens[0], E.tokens[2], sizeof(uint32_t) * E.n_tokens[2]);
	printf("sm70_generate alongside a background job: both streams equal the reference\n");
	sm70_client_close(c);
}

static int cancel_after_3(void *ctx, const struct sm70_event *ev)
{
	int *n = ctx;

	return ++*n >= 3;
}

static void test_cancel(void **state)
{
	struct sm70_client *c = connect_ok();
	struct sm70_client_info info = { .size = sizeof(info) };
	struct sm70_event ev = { .size = sizeof(ev) };
	struct sm70_result res = { .size = sizeof(res) };
	struct sm70_job j;
	uint64_t id;
	uint32_t n = 0, max_new;
	int seen = 0, ret;

	assert_int_equal(sm70_client_info(c, &info), 0);
	max_new = info.limits.max_new_tokens;
	if (info.limits.max_context_tokens && max_new > info.limits.max_context_tokens - 8)
		max_new = info.limits.max_context_tokens - 8;
	if (max_new > 2000)
		max_new = 2000;
	greedy_job(&j, 0, 1);
	j.max_tokens = max_new;
	assert_int_equal(sm70_submit(c, &j, &id), 0);
	for (;;) {
		ret = sm70_next_event(c, &ev, 10000);
		assert_int_equal(ret, 0);
		assert_int_equal(ev.job_id, id);
		if (ev.type == SM70_EVENT_TOKEN && ++n == 2)
			assert_int_equal(sm70_cancel(c, id), 0);
		if (ev.flags & SM70_EVENT_FINAL)
			break;
	}
	assert_int_equal(ev.type, SM70_EVENT_FINISH);
	assert_int_equal(ev.finish_reason, SM70_REASON_CANCELLED);
	assert_true(ev.usage.completion_tokens < max_new);
	assert_int_equal(ev.usage.completion_tokens, n);
	assert_int_equal(sm70_cancel(c, id), -ENOENT);
	printf("cancel: after %u of %u tokens -> FINISH(CANCELLED)\n", n, max_new);

	/* the blocking call: the callback cancels after its third token */
	ret = sm70_generate(c, &j, cancel_after_3, &seen, &res);
	assert_int_equal(ret, 0);
	assert_int_equal(res.finish_reason, SM70_REASON_CANCELLED);
	assert_true(res.usage.completion_tokens >= 3 && res.usage.completion_tokens < max_new);
	printf("sm70_generate: callback cancel after %d tokens -> CANCELLED with %u tokens\n",
	       seen, res.usage.completion_tokens);
	sm70_client_close(c);
}

/* Runs cmd and parses its stdout as one JSON object; returns its "tokens" as ids. */
static int run_json_tokens(const char *cmd, uint32_t *out, int max, char *finish, size_t flen)
{
	char buf[65536];
	size_t n;
	FILE *p = popen(cmd, "r");
	json_t *o, *t, *x;
	json_error_t jerr;
	size_t i;
	int cnt = -1;

	if (!p)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, p);
	buf[n] = '\0';
	if (pclose(p) != 0) {
		fprintf(stderr, "'%s' failed: %s\n", cmd, buf);
		return -1;
	}
	o = json_loads(buf, 0, &jerr);
	if (!o)
		return -1;
	t = json_object_get(o, "tokens");
	if (json_object_size(o) == 6 && json_is_array(t) && json_object_get(o, "usage") &&
	    json_object_get(o, "timing") && json_object_get(o, "top_logprobs")) {
		cnt = 0;
		json_array_foreach(t, i, x)
			if (cnt < max)
				out[cnt++] = (uint32_t)json_integer_value(x);
		snprintf(finish, flen, "%s",
			 json_string_value(json_object_get(o, "finish_reason")) ?: "");
	}
	json_decref(o);
	return cnt;
}

static void test_seeded_matches_sm70_run(void **state)
{
	struct sm70_client *c = connect_ok();
	struct sm70_result res = { .size = sizeof(res) };
	struct collect col = { .n_jobs = 1, .index_ok = { 1 } };
	uint32_t want[MAX_TOK], cli[MAX_TOK];
	char cmd[1024], flags[256], fin_run[32], fin_cli[32];
	struct sm70_job j;
	int n_run, n_cli;

	(void)res;
	snprintf(flags, sizeof(flags),
		 "--prompt-ids 52,261,158,113,305 -n 20 --temperature 0.9 --top-k 50 "
		 "--top-p 0.95 --seed 1234 --top-logprobs 2 --json");
	snprintf(cmd, sizeof(cmd), "%s/bin/sm70-run -m %s --backend cpu %s", build_dir(), FIXTURE,
		 flags);
	n_run = run_json_tokens(cmd, want, MAX_TOK, fin_run, sizeof(fin_run));
	assert_true(n_run > 0);

	sm70_job_init(&j);
	j.prompt = E.prompt[1];
	j.prompt_len = E.prompt_len[1];
	j.max_tokens = 20;
	j.temperature = 0.9f;
	j.top_k = 50;
	j.top_p = 0.95f;
	j.seed = 1234;
	j.flags = SM70_JOB_SEED;
	assert_int_equal(sm70_submit(c, &j, &col.ids[0]), 0);
	assert_int_equal(collect_all(c, &col, 30), 0);
	assert_int_equal((int)col.n[0], n_run);
	assert_memory_equal(col.tokens[0], want, sizeof(uint32_t) * (size_t)n_run);

	/* and the CLI, with the same flags, prints the same object */
	snprintf(cmd, sizeof(cmd), "%s/bin/sm70-generate --socket %s %s", build_dir(), E.sock,
		 flags);
	n_cli = run_json_tokens(cmd, cli, MAX_TOK, fin_cli, sizeof(fin_cli));
	assert_int_equal(n_cli, n_run);
	assert_memory_equal(cli, want, sizeof(uint32_t) * (size_t)n_run);
	assert_string_equal(fin_cli, fin_run);
	printf("seeded (T 0.9, top-k 50, top-p 0.95, seed 1234): SDK, sm70-generate and sm70-run "
	       "agree on %d tokens, finish %s\n", n_run, fin_run);
	sm70_client_close(c);
}

static void test_eventfd_example(void **state)
{
	char cmd[512];
	int st;

	snprintf(cmd, sizeof(cmd), "%s/examples/eventfd_loop %s 52 261 158 113 305", build_dir(),
		 E.sock);
	st = system(cmd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	printf("eventfd_loop example: exit 0\n");
}

static void test_daemon_killed_then_reconnect(void **state)
{
	struct sm70_client *c = connect_ok();
	struct sm70_event ev = { .size = sizeof(ev) };
	struct collect col = { .n_jobs = 3 };
	struct sm70_job j;
	uint64_t id;
	int k, ret, synth = 0;

	for (k = 0; k < 3; k++) {
		greedy_job(&j, k, 100 + (uint64_t)k);
		j.max_tokens = 4000; /* long enough to be live when the daemon dies */
		assert_int_equal(sm70_submit(c, &j, &col.ids[k]), 0);
	}
	assert_int_equal(sm70_next_event(c, &ev, 10000), 0);
	daemon_stop(SIGKILL);
	/* every job ends with a final event; then the calls say the connection is gone */
	for (;;) {
		ret = sm70_next_event(c, &ev, 5000);
		if (ret)
			break;
		if (!(ev.flags & SM70_EVENT_FINAL))
			continue;
		for (k = 0; k < 3 && col.ids[k] != ev.job_id; k++)
			;
		assert_true(k < 3);
		assert_false(col.done[k]);
		col.done[k] = 1;
		col.n_done++;
		assert_int_equal(ev.user_tag, 100 + (uint64_t)k);
		if (ev.error == -ECONNRESET) {
			assert_int_equal(ev.finish_reason, SM70_REASON_ERROR);
			synth++;
		}
	}
	assert_int_equal(ret, -ECONNRESET);
	assert_int_equal(col.n_done, 3);
	assert_int_equal(sm70_next_event(c, &ev, 0), -ECONNRESET);
	greedy_job(&j, 1, 0);
	assert_int_equal(sm70_submit(c, &j, &id), -ECONNRESET);
	printf("SIGKILL: 3/3 live jobs got a final event (%d synthesized, error %s), then "
	       "-ECONNRESET\n", synth, sm70_strerror(-ECONNRESET));

	assert_int_equal(daemon_start(), 0);
	ret = sm70_client_reconnect(c);
	if (ret)
		fprintf(stderr, "reconnect: %s\n", sm70_client_last_error(c));
	assert_int_equal(ret, 0);
	struct collect col2 = { .n_jobs = 1, .index_ok = { 1 } };
	assert_int_equal(sm70_submit(c, &j, &col2.ids[0]), 0);
	assert_true(col2.ids[0] > col.ids[2]); /* ids are never reused on a handle */
	assert_int_equal(collect_all(c, &col2, 30), 0);
	assert_int_equal(col2.fin[0].finish_reason, SM70_REASON_LENGTH);
	assert_memory_equal(col2.tokens[0], E.tokens[1], sizeof(uint32_t) * E.n_tokens[1]);
	printf("restart: sm70_client_reconnect ok, a new job completed (%u tokens = reference)\n",
	       col2.n[0]);
	sm70_client_close(c);
}

int main(void)
{
	const struct CMUnitTest offline[] = {
		cmocka_unit_test(test_ring_logic),
		cmocka_unit_test(test_refusal_and_errors),
	};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_stream),
		cmocka_unit_test(test_many_jobs_many_handles),
		cmocka_unit_test(test_threads_share_handle),
		cmocka_unit_test(test_generate_keeps_other_events),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_seeded_matches_sm70_run),
		cmocka_unit_test(test_eventfd_example),
		cmocka_unit_test(test_daemon_killed_then_reconnect),
	};

	int fails;

	signal(SIGPIPE, SIG_IGN);
	fails = cmocka_run_group_tests_name("sdk without a daemon", offline, offline_setup,
					     offline_teardown);
	fails += cmocka_run_group_tests_name("sdk with sm70d", tests, group_setup, group_teardown);
	return fails;
}
