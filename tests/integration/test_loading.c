/*
 * test_loading - sm70d serves while its model loads: the admin socket answers with the
 * progress, a client whose wait runs out gets -SM70_E_LOADING (not a timeout, not a daemon
 * error), a client that waits is welcomed and served when the load is done, and SIGTERM
 * cancels a load and refuses the waiting client with E_SHUTDOWN.
 *
 * The load is a real one: dummy weights of a ~0.24B-parameter dense qwen3 (about 470 MB on
 * the null backend, 1-2 s on two cores), so the loading window is long enough to look at
 * without a test-only delay in the daemon.
 */
#include <errno.h>
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
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sm70/client.h"
#include "tests/integration/daemon_util.h"

static struct sm70t_daemon T;
static char model_dir[64];
static char admin_path[108];

/* A dense qwen3 with random weights: 32768 x 1024 embeddings (tied), 16 layers. */
static const char model_config[] =
	"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", "
	"\"hidden_size\": 1024, \"intermediate_size\": 3072, \"num_hidden_layers\": 16, "
	"\"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"head_dim\": 64, "
	"\"vocab_size\": 32768, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06, "
	"\"rope_theta\": 10000.0, \"tie_word_embeddings\": true, \"eos_token_id\": 2, "
	"\"bos_token_id\": 1, \"hidden_act\": \"silu\"}";

static const char *const extra[] = { "--backend", "null", "--load-format", "dummy", NULL };

/* One admin request {"cmd": cmd}; the parsed reply (caller decrefs), or NULL. */
static json_t *admin(const char *cmd)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	static char buf[65536];
	char req[64];
	json_t *r = NULL;
	ssize_t n;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return NULL;
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", admin_path);
	n = snprintf(req, sizeof(req), "{\"cmd\":\"%s\"}", cmd);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    send(fd, req, (size_t)n, MSG_NOSIGNAL) == n && (n = recv(fd, buf, sizeof(buf) - 1, 0)) > 0) {
		buf[n] = '\0';
		r = json_loads(buf, 0, NULL);
	}
	close(fd);
	return r;
}

/* The first status reply, retried while the admin socket is not bound yet. */
static json_t *first_status(void)
{
	for (int i = 0; i < 400; i++) {
		json_t *r = admin("status");

		if (r)
			return r;
		usleep(5000);
	}
	return NULL;
}

/* The first status that knows the load's size: the daemon answers from its first moment,
 * and the loader thread counts the bytes it will place only once the backend is open, so
 * an early answer can say "loading" with a total of 0 (seen in a package build). */
static json_t *first_sized_status(void)
{
	json_t *r = first_status();

	for (int i = 0; r && i < 1000; i++) {
		json_t *load = json_object_get(r, "load");
		json_t *total = json_object_get(load, "bytes_total");

		if (!json_is_true(json_object_get(load, "active")) ||
		    (json_is_integer(total) && json_integer_value(total) > 0))
			break;
		json_decref(r);
		usleep(2000);
		r = admin("status");
	}
	return r;
}

static int ctl(const char *args)
{
	const char *b = getenv("SM70_BUILD");
	char cmd[512];
	int st;

	snprintf(cmd, sizeof(cmd), "%s/bin/sm70ctl --socket %s %s >/dev/null 2>&1",
		 b && *b ? b : "build", admin_path, args);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void start_loading(void)
{
	char path[128];
	FILE *f;

	snprintf(model_dir, sizeof(model_dir), "/tmp/sm70t-model-XXXXXX");
	assert_non_null(mkdtemp(model_dir));
	snprintf(path, sizeof(path), "%s/config.json", model_dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(model_config, f);
	fclose(f);
	sm70t_wait_ready = 0; /* back as soon as it listens: while the model loads */
	assert_int_equal(sm70t_daemon_start_model(&T, model_dir, NULL, extra), 0);
	snprintf(admin_path, sizeof(admin_path), "%s.admin", T.sock);
}

static void stop(int want_status)
{
	char path[128];

	assert_int_equal(sm70t_daemon_stop(&T, SIGTERM, 10000), want_status);
	sm70t_daemon_cleanup(&T);
	snprintf(path, sizeof(path), "%s/config.json", model_dir);
	unlink(path);
	rmdir(model_dir);
}

static long long jint(json_t *o, const char *path1, const char *key)
{
	json_t *v = path1 ? json_object_get(json_object_get(o, path1), key) :
			    json_object_get(o, key);

	return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static void test_serves_while_loading(void **state)
{
	struct sm70_connect_opts o;
	struct sm70_loading l = { .size = sizeof(l) };
	struct sm70_result res = { .size = sizeof(res) };
	struct sm70_client *c = NULL;
	struct sm70_job job;
	uint32_t prompt[] = { 5, 6, 7 };
	json_t *r, *m;
	long t0;
	int ret;

	(void)state;
	start_loading();
	r = first_sized_status();
	assert_non_null(r);
	assert_string_equal(json_string_value(json_object_get(r, "state")), "loading");
	assert_true(json_is_false(json_object_get(r, "ready")));
	assert_true(json_is_true(json_object_get(json_object_get(r, "load"), "active")));
	assert_true(jint(r, "load", "bytes_total") > 400000000);
	printf("status while loading: %lld of %lld bytes\n", jint(r, "load", "bytes_done"),
	       jint(r, "load", "bytes_total"));
	json_decref(r);
	r = admin("health");
	assert_non_null(r);
	assert_true(json_is_true(json_object_get(r, "live")));
	assert_true(json_is_false(json_object_get(r, "ready")));
	assert_string_equal(json_string_value(json_object_get(r, "reason")), "loading the model");
	json_decref(r);
	assert_int_equal(ctl("health live"), 0);
	assert_int_equal(ctl("health ready"), 1);
	assert_int_equal(ctl("status"), 0);

	/* A client that will not wait long hears that the model loads. */
	sm70_connect_opts_init(&o);
	o.handshake_timeout_ms = 50;
	ret = sm70_client_connect(&c, T.sock, &o);
	assert_int_equal(ret, -SM70_E_LOADING);
	assert_int_equal(sm70_client_loading(c, &l), 1);
	assert_true(l.bytes_total > 0);
	assert_non_null(strstr(sm70_client_last_error(c), "still loading"));
	printf("50 ms client: %s\n", sm70_client_last_error(c));
	sm70_client_close(c);
	c = NULL;

	/* One that waits is welcomed when the load is done, and served. */
	t0 = sm70t_ms_now();
	assert_int_equal(sm70_client_connect(&c, T.sock, NULL), 0);
	assert_int_equal(sm70_client_loading(c, &l), 1);
	sm70_job_init(&job);
	job.prompt = prompt;
	job.prompt_len = 3;
	job.max_tokens = 4;
	job.flags |= SM70_JOB_IGNORE_EOS;
	assert_int_equal(sm70_generate(c, &job, NULL, NULL, &res), 0);
	assert_int_equal(res.usage.completion_tokens, 4);
	printf("waiting client: welcomed after %ld ms (told %llu of %llu bytes), 4 tokens\n",
	       sm70t_ms_now() - t0, (unsigned long long)l.bytes_done,
	       (unsigned long long)l.bytes_total);
	sm70_client_close(c);

	r = admin("status");
	assert_non_null(r);
	assert_string_equal(json_string_value(json_object_get(r, "state")), "serving");
	assert_true(json_is_false(json_object_get(json_object_get(r, "load"), "active")));
	assert_true(jint(r, "load", "bytes_done") > 400000000);
	json_decref(r);
	/* The client that gave up is nobody's error. */
	m = admin("metrics");
	assert_non_null(m);
	assert_non_null(strstr(json_string_value(json_object_get(m, "text")),
			       "sm70_client_errors_total{code=\"internal\"} 0\n"));
	assert_non_null(strstr(json_string_value(json_object_get(m, "text")),
			       "sm70_model_loading 0\n"));
	json_decref(m);
	stop(0);
}

static void *waiting_client(void *arg)
{
	struct sm70_client *c = NULL;
	int *ret = arg;

	*ret = sm70_client_connect(&c, T.sock, NULL);
	sm70_client_close(c);
	return NULL;
}

static void test_sigterm_cancels_load(void **state)
{
	pthread_t th;
	json_t *r;
	int ret = 1, waiting = 0;
	long t0;

	(void)state;
	start_loading();
	assert_int_equal(pthread_create(&th, NULL, waiting_client, &ret), 0);
	for (int i = 0; i < 400 && !waiting; i++) {
		r = i ? admin("status") : first_status();
		assert_non_null(r);
		assert_string_equal(json_string_value(json_object_get(r, "state")), "loading");
		waiting = jint(r, "load", "clients_waiting") == 1;
		json_decref(r);
		if (!waiting)
			usleep(5000);
	}
	assert_true(waiting);
	t0 = sm70t_ms_now();
	stop(0);
	pthread_join(th, NULL);
	assert_int_equal(ret, -SM70_E_SHUTDOWN);
	printf("SIGTERM while loading: exit 0 after %ld ms, the waiting client got %s\n",
	       sm70t_ms_now() - t0, sm70_strerror(ret));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_serves_while_loading),
		cmocka_unit_test(test_sigterm_cancels_load),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
