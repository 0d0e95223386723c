/*
 * config.c - defaults, the JSON config file and the whole-configuration checks; see
 * config.h.
 *
 * One table per JSON object: a key's name, its type, where it lands in struct
 * sm70__config and its range or choices. Adding a setting is one line in a table. Errors
 * name the full dotted key and the reason so that an operator can fix the file without
 * reading code. This file uses only libc and jansson (no daemon logging), so unit tests
 * can compile it alone.
 */
#include "daemon/config.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/model_name.h"
#include "shm_proto/sm70_proto.h"

/* A config file larger than this is certainly a mistake (a model file, say). */
#define CFG_FILE_MAX (1u << 20)

enum key_type {
	K_U32,
	K_U64,
	K_BOOL,	  /* true/false, stored as uint32_t 1/0 */
	K_FRAC,	  /* a number in (0, 1], stored as double */
	K_PATH,	  /* a socket path: string, shorter than sun_path */
	K_DIR,	  /* a directory path: string, shorter than SM70__CFG_DIR_MAX */
	K_NAME,	  /* a model name: 1..63 bytes of printable ASCII, no '"' or '\\' */
	K_CHOICE, /* one of `choices`, copied into a char[SM70__CFG_WORD] */
	K_MODE,	  /* a file mode: integer or octal string such as "0660" */
	K_UIDS,	  /* list of uids: integers or user names */
	K_GIDS,	  /* list of gids: integers or group names */
	K_GID,	  /* one gid: integer or group name; off_n flags it as set */
	K_LIST,	  /* list of integers in min..max (gpus) */
	K_OBJ,	  /* a nested object with its own table */
	K_OVERRIDES, /* list of up to `cap` objects, each parsed with `sub` into an override */
};

struct key {
	const char *name;
	enum key_type type;
	size_t off;
	uint64_t min, max;
	const struct key *sub;	     /* K_OBJ, K_OVERRIDES */
	const char *const *choices; /* K_CHOICE: NULL-terminated */
	size_t off_n;		     /* K_UIDS, K_GIDS, K_LIST, K_OVERRIDES: the count */
	uint32_t cap;		     /* K_LIST, K_OVERRIDES: capacity of the array */
};

#define AT(f) offsetof(struct sm70__config, f)
/* One table line per key; the macros keep every line complete (no missing fields). */
#define NUM(n, t, f, lo, hi) { n, t, AT(f), lo, hi, NULL, NULL, 0, 0 }
#define STR(n, t, f) { n, t, AT(f), 0, 0, NULL, NULL, 0, 0 }
#define CHOICE(n, f, ch) { n, K_CHOICE, AT(f), 0, 0, NULL, ch, 0, 0 }
#define IDS(n, t, f, nf) { n, t, AT(f), 0, 0, NULL, NULL, AT(nf), 0 }
#define OBJ(n, sub) { n, K_OBJ, 0, 0, 0, sub, NULL, 0, 0 }
#define END { NULL, 0, 0, 0, 0, NULL, NULL, 0, 0 }

static const char *const backends[] = { "cpu", "cuda", "null", NULL };
static const char *const load_formats[] = { "auto", "dummy", NULL };
/* kv_mode.c's words: "fp8" is K FP8-E4M3 with V f16, "fp8-all" both FP8 */
static const char *const kv_dtypes[] = { "auto", "f32", "f16", "fp8", "fp8-all", NULL };
static const char *const fast_ref[] = { "fast", "reference", NULL };
static const char *const cache_scopes[] = { "user", "group", "shared", NULL };

static const struct key limits_keys[] = {
	NUM("max_jobs_in_flight", K_U32, limits.max_jobs_in_flight, 1, 65536),
	NUM("max_prompt_tokens", K_U32, limits.max_prompt_tokens, 1, 1u << 24),
	NUM("max_new_tokens", K_U32, limits.max_new_tokens, 1, 1u << 24),
	NUM("max_context_tokens", K_U32, limits.max_context_tokens, 0, 1u << 25),
	NUM("max_priority", K_U32, limits.max_priority, 0, 255),
	NUM("max_top_logprobs", K_U32, limits.max_top_logprobs, 0, SM70_PROTO_MAX_TOP),
	NUM("max_sessions_per_uid", K_U32, limits.max_sessions_per_uid, 0, 65536),
	NUM("max_jobs_per_uid", K_U32, limits.max_jobs_per_uid, 0, 1u << 24),
	END,
};

/* One "overrides" entry; offsets into struct sm70__cfg_override. */
#define OAT(f) offsetof(struct sm70__cfg_override, f)
#define ONUM(n, lo, hi) { #n, K_U32, OAT(n), lo, hi, NULL, NULL, 0, 0 }
static const struct key override_keys[] = {
	{ "uids", K_UIDS, OAT(uids), 0, 0, NULL, NULL, OAT(n_uids), 0 },
	{ "gids", K_GIDS, OAT(gids), 0, 0, NULL, NULL, OAT(n_gids), 0 },
	ONUM(max_jobs_in_flight, 1, 65536),
	ONUM(max_prompt_tokens, 1, 1u << 24),
	ONUM(max_new_tokens, 1, 1u << 24),
	ONUM(max_priority, 0, 255),
	ONUM(max_sessions_per_uid, 1, 65536),
	ONUM(max_jobs_per_uid, 1, 1u << 24),
	END,
};
#undef ONUM
#undef OAT

static const struct key engine_keys[] = {
	NUM("max_seqs", K_U32, engine.max_seqs, 1, 1024),
	NUM("max_batch_tokens", K_U32, engine.max_batch_tokens, 16, 1u << 20),
	NUM("block_size", K_U32, engine.block_size, 1, 4096),
	NUM("kv_bytes", K_U64, engine.kv_bytes, 1u << 16, UINT64_MAX >> 1),
	NUM("kv_memory_fraction", K_FRAC, engine.kv_memory_fraction, 0, 1),
	CHOICE("kv_dtype", engine.kv_dtype, kv_dtypes),
	NUM("prefix_cache", K_BOOL, engine.prefix_cache, 0, 1),
	CHOICE("prefix_cache_scope", engine.prefix_cache_scope, cache_scopes),
	NUM("n_threads", K_U32, engine.n_threads, 0, 1024),
	NUM("feed_depth", K_U32, engine.feed_depth, 1, 1024),
	NUM("state_slots", K_U32, engine.state_slots, 0, 1024),
	NUM("batch_invariant", K_BOOL, engine.batch_invariant, 0, 1),
	END,
};

static const struct key fast_keys[] = {
	CHOICE("matmul", fast_paths.matmul, fast_ref),
	CHOICE("attention", fast_paths.attention, fast_ref),
	CHOICE("fused", fast_paths.fused, fast_ref),
	CHOICE("allreduce", fast_paths.allreduce, fast_ref),
	CHOICE("gdn", fast_paths.gdn, fast_ref),
	CHOICE("overlap", fast_paths.overlap, fast_ref),
	CHOICE("gemv_split", fast_paths.gemv_split, fast_ref),
	END,
};

static const struct key rings_keys[] = {
	NUM("sq_entries", K_U32, rings.sq_entries, 1, 1u << 16),
	NUM("eq_entries", K_U32, rings.eq_entries, 1, 1u << 20),
	NUM("arena_tokens", K_U32, rings.arena_tokens, 1, 1u << 26),
	NUM("start_index", K_U32, rings.start_index, 0, UINT32_MAX),
	END,
};

static const struct key top_keys[] = {
	STR("model", K_DIR, model_dir),
	STR("model_name", K_NAME, model_name),
	CHOICE("backend", backend, backends),
	CHOICE("load_format", load_format, load_formats),
	{ "gpus", K_LIST, AT(gpus), 0, 255, NULL, NULL, AT(n_gpus), SM70__CFG_MAX_GPUS },
	NUM("tp", K_U32, tp, 1, 4),
	STR("socket", K_PATH, socket_path),
	NUM("socket_mode", K_MODE, socket_mode, 0, 07777),
	IDS("allowed_uids", K_UIDS, allowed_uids, n_allowed_uids),
	IDS("allowed_gids", K_GIDS, allowed_gids, n_allowed_gids),
	NUM("max_sessions", K_U32, max_sessions, 1, 65536),
	STR("admin_socket", K_PATH, admin_socket_path),
	NUM("admin_socket_mode", K_MODE, admin_socket_mode, 0, 07777),
	IDS("admin_allowed_uids", K_UIDS, admin_allowed_uids, n_admin_allowed_uids),
	IDS("admin_allowed_gids", K_GIDS, admin_allowed_gids, n_admin_allowed_gids),
	IDS("admin_control_uids", K_UIDS, admin_control_uids, n_admin_control_uids),
	IDS("admin_control_gids", K_GIDS, admin_control_gids, n_admin_control_gids),
	IDS("admin_socket_group", K_GID, admin_socket_gid, has_admin_socket_gid),
	NUM("admin_idle_ms", K_U32, admin_idle_ms, 100, 3600u * 1000),
	NUM("admin_max_conns_per_uid", K_U32, admin_max_conns_per_uid, 1, 16),
	OBJ("limits", limits_keys),
	{ "overrides", K_OVERRIDES, AT(overrides), 0, 0, override_keys, NULL, AT(n_overrides),
	  SM70__CFG_MAX_OVERRIDES },
	OBJ("engine", engine_keys),
	OBJ("fast_paths", fast_keys),
	OBJ("rings", rings_keys),
	NUM("drain_grace_ms", K_U32, drain_grace_ms, 0, 24u * 3600 * 1000),
	NUM("slow_consumer_ms", K_U32, slow_consumer_ms, 1, 3600u * 1000),
	NUM("slow_consumer_events", K_U32, slow_consumer_events, 1, 1u << 24),
	NUM("slow_consumer_events_total", K_U32, slow_consumer_events_total, 1, 1u << 26),
	NUM("hello_timeout_ms", K_U32, hello_timeout_ms, 1, 600u * 1000),
	END,
};

#undef END
#undef OBJ
#undef IDS
#undef CHOICE
#undef STR
#undef NUM
#undef AT

void sm70__config_default(struct sm70__config *c)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->backend, "cpu");
	strcpy(c->load_format, "auto");
	c->gpus[c->n_gpus++] = 0;
	c->tp = 1;
	strcpy(c->socket_path, "/run/sm70/sm70d.sock");
	c->socket_mode = 0660;
	c->allowed_uids[c->n_allowed_uids++] = 0;
	if (getuid() != 0)
		c->allowed_uids[c->n_allowed_uids++] = (uint32_t)getuid();
	c->max_sessions = 256;
	c->admin_socket_mode = 0660;
	c->admin_allowed_uids[c->n_admin_allowed_uids++] = 0;
	if (getuid() != 0)
		c->admin_allowed_uids[c->n_admin_allowed_uids++] = (uint32_t)getuid();
	c->admin_control_uids[c->n_admin_control_uids++] = 0;
	if (getuid() != 0)
		c->admin_control_uids[c->n_admin_control_uids++] = (uint32_t)getuid();
	c->admin_idle_ms = 5000;
	c->admin_max_conns_per_uid = 4;
	c->limits.max_jobs_in_flight = 64;
	c->limits.max_prompt_tokens = 32768;
	c->limits.max_new_tokens = 8192;
	c->limits.max_context_tokens = 0;
	c->limits.max_priority = 0; /* a privilege: grant it per uid or group (overrides) */
	c->limits.max_top_logprobs = 8;
	c->engine.max_seqs = 16;
	c->engine.max_batch_tokens = 512;
	c->engine.block_size = 16;
	c->engine.kv_bytes = (uint64_t)256 << 20;
	c->engine.kv_memory_fraction = 0;
	strcpy(c->engine.kv_dtype, "auto");
	c->engine.prefix_cache = 1;
	strcpy(c->engine.prefix_cache_scope, "user");
	c->engine.n_threads = 0;
	c->engine.feed_depth = 2;
	c->rings.sq_entries = 64;
	c->rings.eq_entries = 256;
	c->rings.arena_tokens = 65536;
	c->rings.start_index = 0;
	c->drain_grace_ms = 30000;
	c->slow_consumer_ms = 5000;
	c->slow_consumer_events = 4096;
	c->slow_consumer_events_total = 65536;
	c->hello_timeout_ms = 5000;
}

/* Parses one id (integer, or a name looked up with getpwnam/getgrnam). */
static int parse_id(json_t *v, int group, uint32_t *out)
{
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);

		if (x < 0 || x > (json_int_t)UINT32_MAX - 1)
			return -EINVAL;
		*out = (uint32_t)x;
		return 0;
	}
	if (json_is_string(v)) {
		const char *name = json_string_value(v);

		if (group) {
			struct group *g = getgrnam(name);

			if (!g)
				return -ENOENT;
			*out = (uint32_t)g->gr_gid;
		} else {
			struct passwd *p = getpwnam(name);

			if (!p)
				return -ENOENT;
			*out = (uint32_t)p->pw_uid;
		}
		return 0;
	}
	return -EINVAL;
}

static int parse_ids(json_t *v, int group, uint32_t *ids, uint32_t *n, const char *key,
		     struct sm70_err *err)
{
	size_t i;
	json_t *x;

	if (!json_is_array(v) || json_array_size(v) > SM70__CFG_MAX_IDS)
		return sm70_errf(err, -EINVAL, "%s: must be a list of at most %d %s", key,
				 SM70__CFG_MAX_IDS, group ? "gids or group names" :
							    "uids or user names");
	*n = 0;
	json_array_foreach(v, i, x) {
		int ret = parse_id(x, group, &ids[i]);

		if (ret == -ENOENT)
			return sm70_errf(err, -EINVAL, "%s[%zu]: no %s named '%s'", key, i,
					 group ? "group" : "user", json_string_value(x));
		if (ret)
			return sm70_errf(err, -EINVAL, "%s[%zu]: must be a non-negative integer or "
					 "a name", key, i);
	}
	*n = (uint32_t)json_array_size(v);
	return 0;
}

static int parse_obj(void *base, json_t *obj, const struct key *table, const char *prefix,
		     struct sm70_err *err);

/* "a", "b" or "c" from a NULL-terminated list, for messages. */
static void join_choices(const char *const *ch, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (int i = 0; ch[i] && len < size; i++) {
		const char *sep = i == 0 ? "" : ch[i + 1] ? ", " : " or ";

		len += (size_t)snprintf(buf + len, size - len, "%s\"%s\"", sep, ch[i]);
	}
}

/* Parses v as key k into the struct at basep (the config, or an override entry). */
static int parse_key(void *basep, const struct key *k, json_t *v, const char *key,
		     struct sm70_err *err)
{
	char *base = basep;
	json_int_t x;

	switch (k->type) {
	case K_U32:
	case K_U64:
		if (!json_is_integer(v) || (x = json_integer_value(v)) < 0 ||
		    (uint64_t)x < k->min || (uint64_t)x > k->max)
			return sm70_errf(err, -EINVAL, "%s: must be an integer in %llu..%llu", key,
					 (unsigned long long)k->min, (unsigned long long)k->max);
		if (k->type == K_U32)
			*(uint32_t *)(base + k->off) = (uint32_t)x;
		else
			*(uint64_t *)(base + k->off) = (uint64_t)x;
		return 0;
	case K_BOOL:
		if (!json_is_boolean(v))
			return sm70_errf(err, -EINVAL, "%s: must be true or false", key);
		*(uint32_t *)(base + k->off) = json_is_true(v);
		return 0;
	case K_FRAC: {
		double f = json_is_number(v) ? json_number_value(v) : NAN;

		if (!(f > 0 && f <= 1))
			return sm70_errf(err, -EINVAL, "%s: must be a number in (0, 1], e.g. 0.9",
					 key);
		*(double *)(base + k->off) = f;
		return 0;
	}
	case K_PATH:
	case K_DIR: {
		const char *s = json_string_value(v);
		size_t cap = k->type == K_PATH ? SM70__CFG_PATH_MAX : SM70__CFG_DIR_MAX;

		if (!s || !*s || strlen(s) >= cap)
			return sm70_errf(err, -EINVAL, "%s: must be a path shorter than %zu bytes",
					 key, cap);
		strcpy(base + k->off, s);
		return 0;
	}
	case K_NAME: {
		const char *s = json_string_value(v);

		if (!s || !sm70__model_name_valid(s, strlen(s)))
			return sm70_errf(err, -EINVAL, "%s: must be a string of 1 to %d printable "
					 "ASCII characters without '\"' or '\\', e.g. \"qwen3-8b\"",
					 key, SM70__MODEL_NAME_MAX - 1);
		strcpy(base + k->off, s);
		return 0;
	}
	case K_CHOICE: {
		const char *s = json_string_value(v);
		char list[128];

		for (int i = 0; s && k->choices[i]; i++)
			if (strcmp(s, k->choices[i]) == 0) {
				snprintf(base + k->off, SM70__CFG_WORD, "%s", s);
				return 0;
			}
		join_choices(k->choices, list, sizeof(list));
		return sm70_errf(err, -EINVAL, "%s: must be %s", key, list);
	}
	case K_MODE: {
		unsigned long m;
		char *end;

		if (json_is_integer(v)) {
			x = json_integer_value(v);
			if (x < 0 || (uint64_t)x > k->max)
				goto bad_mode;
			m = (unsigned long)x;
		} else if (json_is_string(v)) {
			errno = 0;
			m = strtoul(json_string_value(v), &end, 8);
			if (errno || *end || end == json_string_value(v) || m > k->max)
				goto bad_mode;
		} else {
			goto bad_mode;
		}
		*(uint32_t *)(base + k->off) = (uint32_t)m;
		return 0;
bad_mode:
		return sm70_errf(err, -EINVAL, "%s: must be a file mode such as \"0660\"", key);
	}
	case K_UIDS:
	case K_GIDS:
		return parse_ids(v, k->type == K_GIDS, (uint32_t *)(base + k->off),
				 (uint32_t *)(base + k->off_n), key, err);
	case K_GID: {
		int ret = parse_id(v, 1, (uint32_t *)(base + k->off));

		if (ret == -ENOENT)
			return sm70_errf(err, -EINVAL, "%s: no group named '%s'", key,
					 json_string_value(v));
		if (ret)
			return sm70_errf(err, -EINVAL, "%s: must be a gid or a group name", key);
		*(uint32_t *)(base + k->off_n) = 1;
		return 0;
	}
	case K_LIST: {
		uint32_t *arr = (uint32_t *)(base + k->off);
		size_t i;
		json_t *e;

		if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > k->cap)
			return sm70_errf(err, -EINVAL, "%s: must be a list of 1 to %u integers",
					 key, k->cap);
		json_array_foreach(v, i, e) {
			if (!json_is_integer(e) || (x = json_integer_value(e)) < 0 ||
			    (uint64_t)x < k->min || (uint64_t)x > k->max)
				return sm70_errf(err, -EINVAL, "%s[%zu]: must be an integer in "
						 "%llu..%llu", key, i, (unsigned long long)k->min,
						 (unsigned long long)k->max);
			for (size_t j = 0; j < i; j++)
				if (arr[j] == (uint32_t)x)
					return sm70_errf(err, -EINVAL, "%s[%zu]: %lld is listed "
							 "twice", key, i, (long long)x);
			arr[i] = (uint32_t)x;
		}
		*(uint32_t *)(base + k->off_n) = (uint32_t)json_array_size(v);
		return 0;
	}
	case K_OBJ:
		if (!json_is_object(v))
			return sm70_errf(err, -EINVAL, "%s: must be an object", key);
		return parse_obj(basep, v, k->sub, key, err);
	case K_OVERRIDES: {
		struct sm70__cfg_override *o = (struct sm70__cfg_override *)(base + k->off);
		char sub[128];
		size_t i;
		json_t *e;
		int ret;

		if (!json_is_array(v) || json_array_size(v) > k->cap)
			return sm70_errf(err, -EINVAL, "%s: must be a list of at most %u objects",
					 key, k->cap);
		json_array_foreach(v, i, e) {
			snprintf(sub, sizeof(sub), "%.100s[%u]", key, (unsigned)i);
			if (!json_is_object(e))
				return sm70_errf(err, -EINVAL, "%s: must be an object", sub);
			memset(&o[i], 0, sizeof(o[i]));
			o[i].max_jobs_in_flight = o[i].max_prompt_tokens = SM70__CFG_UNSET;
			o[i].max_new_tokens = o[i].max_priority = SM70__CFG_UNSET;
			o[i].max_sessions_per_uid = o[i].max_jobs_per_uid = SM70__CFG_UNSET;
			ret = parse_obj(&o[i], e, k->sub, sub, err);
			if (ret)
				return ret;
			if (!o[i].n_uids && !o[i].n_gids)
				return sm70_errf(err, -EINVAL, "%s: names no one: give \"uids\" or "
						 "\"gids\"", sub);
		}
		*(uint32_t *)(base + k->off_n) = (uint32_t)json_array_size(v);
		return 0;
	}
	}
	return -EINVAL;
}

static int parse_obj(void *base, json_t *obj, const struct key *table, const char *prefix,
		     struct sm70_err *err)
{
	const char *name;
	json_t *v;

	json_object_foreach(obj, name, v) {
		const struct key *k;
		char key[128];
		int ret;

		snprintf(key, sizeof(key), "%s%s%s", prefix, *prefix ? "." : "", name);
		for (k = table; k->name; k++)
			if (strcmp(k->name, name) == 0)
				break;
		if (!k->name)
			return sm70_errf(err, -EINVAL, "%s: unknown key", key);
		ret = parse_key(base, k, v, key, err);
		if (ret)
			return ret;
	}
	return 0;
}

/* Reads the whole file at path into a NUL-terminated malloc'd buffer. Returns 0 or
 * -errno with err saying why. */
static int read_file(const char *path, char **out, size_t *len, struct sm70_err *err)
{
	struct stat st;
	char *buf = NULL;
	size_t n = 0;
	ssize_t r;
	int fd, ret;

	*out = NULL;
	/* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (start-up
	 * hung on a FIFO given as --config); it changes nothing for a regular file. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return sm70_errf(err, -errno, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st)) {
		ret = sm70_errf(err, -errno, "%s: cannot stat: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = sm70_errf(err, S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL,
				"%s: cannot read: not a regular file (%s)", path,
				S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" :
				S_ISSOCK(st.st_mode) ? "a socket" : S_ISCHR(st.st_mode) ?
				"a character device" : "a block device");
		goto out;
	}
	if ((uint64_t)st.st_size > CFG_FILE_MAX) {
		ret = sm70_errf(err, -EFBIG, "%s: cannot read: larger than %u bytes", path,
				CFG_FILE_MAX);
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		ret = sm70_errf(err, -ENOMEM, "%s: out of memory", path);
		goto out;
	}
	while (n < (size_t)st.st_size) {
		r = read(fd, buf + n, (size_t)st.st_size - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = sm70_errf(err, -errno, "%s: cannot read: %s", path,
					strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	buf = NULL;
	ret = 0;
out:
	free(buf);
	close(fd);
	return ret;
}

int sm70__config_load(struct sm70__config *c, const char *path, struct sm70_err *err)
{
	json_error_t je;
	json_t *root = NULL, *eng;
	char *text;
	size_t len = 0;
	int ret;

	ret = read_file(path, &text, &len, err);
	if (ret)
		return ret;
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	free(text);
	if (!root)
		return sm70_errf(err, -EINVAL, "%.200s: line %d column %d: not valid JSON: %.200s",
				 path, je.line, je.column, je.text);
	if (!json_is_object(root)) {
		ret = sm70_errf(err, -EINVAL, "%s: the top level must be an object", path);
		goto out;
	}
	/* Two ways to size the KV cache: one must win, so naming both is an error. */
	eng = json_object_get(root, "engine");
	if (json_is_object(eng) && json_object_get(eng, "kv_bytes") &&
	    json_object_get(eng, "kv_memory_fraction")) {
		ret = sm70_errf(err, -EINVAL, "%s: engine.kv_memory_fraction: cannot be used "
				"together with engine.kv_bytes (set one)", path);
		goto out;
	}
	ret = parse_obj(c, root, top_keys, "", err);
	if (ret && err) {
		char tmp[sizeof(err->msg)];

		snprintf(tmp, sizeof(tmp), "%.200s: %.300s", path, err->msg);
		memcpy(err->msg, tmp, sizeof(tmp));
	}
out:
	json_decref(root);
	return ret;
}

int sm70__config_check(struct sm70__config *c, struct sm70_err *err)
{
	struct stat st;

	if (!c->model_dir[0])
		return sm70_errf(err, -EINVAL, "model: no model directory: set \"model\" in the "
				 "config file or pass --model DIR");
	if (stat(c->model_dir, &st))
		return sm70_errf(err, -errno, "model: %s: %s", c->model_dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return sm70_errf(err, -ENOTDIR, "model: %s: not a directory", c->model_dir);
	if (access(c->model_dir, R_OK | X_OK))
		return sm70_errf(err, -errno, "model: %s: cannot read: %s", c->model_dir,
				 strerror(errno));
	if (strcmp(c->backend, "cuda") == 0 && c->n_gpus == 0)
		return sm70_errf(err, -EINVAL, "gpus: the cuda backend needs at least one GPU");
	if (strcmp(c->backend, "cuda") == 0 && c->n_gpus < c->tp)
		return sm70_errf(err, -EINVAL, "tp: %u ranks need %u GPUs in gpus, %u listed",
				 c->tp, c->tp, c->n_gpus);
	if (strcmp(c->backend, "null") == 0 && c->tp > 1)
		return sm70_errf(err, -EINVAL, "tp: the null backend runs one rank only");
	/* What the engine would refuse only once the model is loaded. */
	if (c->engine.max_batch_tokens < c->engine.max_seqs)
		return sm70_errf(err, -EINVAL, "engine.max_batch_tokens: %u is below engine.max_seqs "
				 "(%u): each running sequence needs a token of every step's budget; "
				 "raise max_batch_tokens or lower max_seqs", c->engine.max_batch_tokens,
				 c->engine.max_seqs);
	if (strcmp(c->backend, "cuda") != 0 && !(c->engine.kv_memory_fraction > 0)) {
		/* host backends: every rank's cache is host memory (CUDA: main.c checks the
		 * GPUs' memory) */
		long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
		uint64_t host = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
		uint32_t ranks = c->tp ? c->tp : 1;

		if (host && c->engine.kv_bytes > host / ranks)
			return sm70_errf(err, -EINVAL, "engine.kv_bytes: %llu bytes for each of %u "
					 "rank(s) is more than this host's memory (%llu bytes); lower "
					 "it or use engine.kv_memory_fraction",
					 (unsigned long long)c->engine.kv_bytes, ranks,
					 (unsigned long long)host);
	}
	if (!c->admin_socket_path[0]) {
		int n = snprintf(c->admin_socket_path, sizeof(c->admin_socket_path), "%s.admin",
				 c->socket_path);

		if (n < 0 || (size_t)n >= sizeof(c->admin_socket_path)) {
			c->admin_socket_path[0] = '\0';
			return sm70_errf(err, -ENAMETOOLONG, "admin_socket: \"%s.admin\" is longer "
					 "than %d bytes; set admin_socket to a shorter path",
					 c->socket_path, SM70__CFG_PATH_MAX - 1);
		}
	}
	if (strcmp(c->admin_socket_path, c->socket_path) == 0)
		return sm70_errf(err, -EINVAL, "admin_socket: must differ from socket (%s)",
				 c->socket_path);
	/* A fair share by default: four uids can always hold sessions side by side. */
	if (!c->limits.max_sessions_per_uid)
		c->limits.max_sessions_per_uid = c->max_sessions / 4 ? c->max_sessions / 4 : 1;
	if (!c->limits.max_jobs_per_uid)
		c->limits.max_jobs_per_uid = 4 * c->limits.max_jobs_in_flight;
	return 0;
}

static int has_id(uint32_t id, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] == id)
			return 1;
	return 0;
}

int sm70__config_limits_for(const struct sm70__config *c, uint32_t uid, const uint32_t *gids,
			    uint32_t n_gids, struct sm70__cfg_limits *out)
{
	*out = c->limits;
	for (uint32_t i = 0; i < c->n_overrides; i++) {
		const struct sm70__cfg_override *o = &c->overrides[i];
		int match = has_id(uid, o->uids, o->n_uids);

		for (uint32_t g = 0; g < n_gids && !match; g++)
			match = has_id(gids[g], o->gids, o->n_gids);
		if (!match)
			continue;
#define SET(f) if (o->f != SM70__CFG_UNSET) out->f = o->f
		SET(max_jobs_in_flight);
		SET(max_prompt_tokens);
		SET(max_new_tokens);
		SET(max_priority);
		SET(max_sessions_per_uid);
		SET(max_jobs_per_uid);
#undef SET
		return (int)i;
	}
	return -1;
}
