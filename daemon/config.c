/*
 * config.c - defaults and the JSON config file; see config.h.
 *
 * One table per JSON object: a key's name, its type, where it lands in struct
 * sm70__config and its range. Adding a setting is one line in a table. Errors name the
 * full dotted key so that an operator can find it without reading code.
 */
#include "daemon/config.h"

#include <errno.h>
#include <grp.h>
#include <jansson.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shm_proto/sm70_proto.h"

enum key_type {
	K_U32,
	K_U64,
	K_PATH, /* a socket path: string, shorter than sun_path */
	K_MODE, /* a file mode: integer or octal string such as "0660" */
	K_UIDS, /* list of uids: integers or user names */
	K_GIDS, /* list of gids: integers or group names */
	K_OBJ,	/* a nested object with its own table */
};

struct key {
	const char *name;
	enum key_type type;
	size_t off;
	uint64_t min, max;
	const struct key *sub; /* K_OBJ */
};

#define AT(f) offsetof(struct sm70__config, f)

static const struct key limits_keys[] = {
	{ "max_jobs_in_flight", K_U32, AT(limits.max_jobs_in_flight), 1, 65536, NULL },
	{ "max_prompt_tokens", K_U32, AT(limits.max_prompt_tokens), 1, 1u << 24, NULL },
	{ "max_new_tokens", K_U32, AT(limits.max_new_tokens), 1, 1u << 24, NULL },
	{ "max_context_tokens", K_U32, AT(limits.max_context_tokens), 0, 1u << 25, NULL },
	{ "max_priority", K_U32, AT(limits.max_priority), 0, 255, NULL },
	{ "max_top_logprobs", K_U32, AT(limits.max_top_logprobs), 0, SM70_PROTO_MAX_TOP, NULL },
	{ NULL, 0, 0, 0, 0, NULL },
};

static const struct key engine_keys[] = {
	{ "max_seqs", K_U32, AT(engine.max_seqs), 1, 1024, NULL },
	{ "max_batch_tokens", K_U32, AT(engine.max_batch_tokens), 16, 1u << 20, NULL },
	{ "block_size", K_U32, AT(engine.block_size), 1, 4096, NULL },
	{ "kv_bytes", K_U64, AT(engine.kv_bytes), 1u << 16, UINT64_MAX >> 1, NULL },
	{ "n_threads", K_U32, AT(engine.n_threads), 0, 1024, NULL },
	{ "feed_depth", K_U32, AT(engine.feed_depth), 1, 1024, NULL },
	{ NULL, 0, 0, 0, 0, NULL },
};

static const struct key rings_keys[] = {
	{ "sq_entries", K_U32, AT(rings.sq_entries), 1, 1u << 16, NULL },
	{ "eq_entries", K_U32, AT(rings.eq_entries), 1, 1u << 20, NULL },
	{ "arena_tokens", K_U32, AT(rings.arena_tokens), 1, 1u << 26, NULL },
	{ "start_index", K_U32, AT(rings.start_index), 0, UINT32_MAX, NULL },
	{ NULL, 0, 0, 0, 0, NULL },
};

static const struct key top_keys[] = {
	{ "socket", K_PATH, AT(socket_path), 0, 0, NULL },
	{ "socket_mode", K_MODE, AT(socket_mode), 0, 07777, NULL },
	{ "allowed_uids", K_UIDS, AT(allowed_uids), 0, 0, NULL },
	{ "allowed_gids", K_GIDS, AT(allowed_gids), 0, 0, NULL },
	{ "max_sessions", K_U32, AT(max_sessions), 1, 65536, NULL },
	{ "limits", K_OBJ, 0, 0, 0, limits_keys },
	{ "engine", K_OBJ, 0, 0, 0, engine_keys },
	{ "rings", K_OBJ, 0, 0, 0, rings_keys },
	{ "drain_grace_ms", K_U32, AT(drain_grace_ms), 0, 24u * 3600 * 1000, NULL },
	{ "slow_consumer_ms", K_U32, AT(slow_consumer_ms), 1, 3600u * 1000, NULL },
	{ "slow_consumer_events", K_U32, AT(slow_consumer_events), 1, 1u << 24, NULL },
	{ "hello_timeout_ms", K_U32, AT(hello_timeout_ms), 1, 600u * 1000, NULL },
	{ NULL, 0, 0, 0, 0, NULL },
};

#undef AT

void sm70__config_default(struct sm70__config *c)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->socket_path, "/run/sm70/sm70d.sock");
	c->socket_mode = 0660;
	c->allowed_uids[c->n_allowed_uids++] = 0;
	if (getuid() != 0)
		c->allowed_uids[c->n_allowed_uids++] = (uint32_t)getuid();
	c->max_sessions = 256;
	c->limits.max_jobs_in_flight = 64;
	c->limits.max_prompt_tokens = 32768;
	c->limits.max_new_tokens = 8192;
	c->limits.max_context_tokens = 0;
	c->limits.max_priority = 3;
	c->limits.max_top_logprobs = 8;
	c->engine.max_seqs = 16;
	c->engine.max_batch_tokens = 512;
	c->engine.block_size = 16;
	c->engine.kv_bytes = (uint64_t)256 << 20;
	c->engine.n_threads = 0;
	c->engine.feed_depth = 2;
	c->rings.sq_entries = 64;
	c->rings.eq_entries = 256;
	c->rings.arena_tokens = 65536;
	c->rings.start_index = 0;
	c->drain_grace_ms = 30000;
	c->slow_consumer_ms = 5000;
	c->slow_consumer_events = 4096;
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

static int parse_obj(struct sm70__config *c, json_t *obj, const struct key *table,
		     const char *prefix, struct sm70_err *err);

static int parse_key(struct sm70__config *c, const struct key *k, json_t *v, const char *key,
		     struct sm70_err *err)
{
	char *base = (char *)c;
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
	case K_PATH: {
		const char *s = json_string_value(v);

		if (!s || !*s || strlen(s) >= SM70__CFG_PATH_MAX)
			return sm70_errf(err, -EINVAL, "%s: must be a path shorter than %d bytes",
					 key, SM70__CFG_PATH_MAX);
		strcpy(base + k->off, s);
		return 0;
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
		return parse_ids(v, 0, c->allowed_uids, &c->n_allowed_uids, key, err);
	case K_GIDS:
		return parse_ids(v, 1, c->allowed_gids, &c->n_allowed_gids, key, err);
	case K_OBJ:
		if (!json_is_object(v))
			return sm70_errf(err, -EINVAL, "%s: must be an object", key);
		return parse_obj(c, v, k->sub, key, err);
	}
	return -EINVAL;
}

static int parse_obj(struct sm70__config *c, json_t *obj, const struct key *table,
		     const char *prefix, struct sm70_err *err)
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
		ret = parse_key(c, k, v, key, err);
		if (ret)
			return ret;
	}
	return 0;
}

int sm70__config_load(struct sm70__config *c, const char *path, struct sm70_err *err)
{
	json_error_t je;
	json_t *root;
	int ret;

	root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return sm70_errf(err, -EINVAL, "%s:%d: %s", path, je.line, je.text);
	if (!json_is_object(root)) {
		ret = sm70_errf(err, -EINVAL, "%s: the top level must be an object", path);
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
