/*
 * model_name.c - choosing the model's name; see model_name.h for the rule.
 *
 * Uses only libc and jansson (no daemon logging), so a unit test can compile it alone.
 */
#include "daemon/model_name.h"

#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sm70__model_name_generic(const char *s)
{
	static const char *const generic[] = {
		"model", "models", "snapshot", "snapshots", "checkpoint", "checkpoints", "ckpt",
		"weights", "hf", "main", "latest", "current", "default", "final", "export",
		"output", "out", "tmp", NULL,
	};
	size_t n = strlen(s), hex = 0;

	if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
		return 1; /* --model . : the directory it resolves to has the name */
	for (int i = 0; generic[i]; i++)
		if (strcasecmp(s, generic[i]) == 0)
			return 1;
	while (hex < n && isxdigit((unsigned char)s[hex]))
		hex++;
	return n == 0 || (hex == n && n >= 7); /* a commit or content hash */
}

/* The last component of path (trailing slashes ignored) into out; returns its length. */
static size_t last_component(const char *path, char *out, size_t size)
{
	size_t end = strlen(path), start;

	while (end > 1 && path[end - 1] == '/')
		end--;
	start = end;
	while (start > 0 && path[start - 1] != '/')
		start--;
	if (end - start >= size)
		return 0;
	memcpy(out, path + start, end - start);
	out[end - start] = '\0';
	return end - start;
}

/* A usable, non-generic last component of path into out. Returns 1 if there is one. */
static int name_from_path(const char *path, char *out)
{
	char c[PATH_MAX];
	size_t n = last_component(path, c, sizeof(c));

	if (!n || sm70__model_name_generic(c) || !sm70__model_name_valid(c, n))
		return 0;
	memcpy(out, c, n + 1);
	return 1;
}

/* .../models--ORG--NAME/snapshots/HASH -> "ORG/NAME" (the Hugging Face cache's layout; a
 * model without an organisation, models--NAME, is "NAME"). */
static int name_from_hf_cache(const char *path, char *out)
{
	const char *p = strstr(path, "/models--");
	char name[SM70__MODEL_NAME_MAX];
	size_t n = 0;
	int org = 0;

	if (!p || !strstr(p, "/snapshots/"))
		return 0;
	for (p += strlen("/models--"); *p && *p != '/'; p++) {
		if (n + 1 >= sizeof(name))
			return 0;
		if (!org && p[0] == '-' && p[1] == '-') {
			name[n++] = '/';
			p++;
			org = 1;
			continue;
		}
		name[n++] = *p;
	}
	name[n] = '\0';
	if (!sm70__model_name_valid(name, n))
		return 0;
	memcpy(out, name, n + 1);
	return 1;
}

/* config.json's _name_or_path, by the rule (a hub id as it is, a path by its end). */
static int name_from_checkpoint(json_t *cfg, char *out)
{
	const char *v = json_string_value(json_object_get(cfg, "_name_or_path"));
	const char *slash;
	size_t n;

	if (!v || !*v)
		return 0;
	n = strlen(v);
	slash = strchr(v, '/');
	/* a hub id: ORG/NAME or NAME, no leading '/', '.', '~', one slash at most */
	if (v[0] != '/' && v[0] != '.' && v[0] != '~' && (!slash || !strchr(slash + 1, '/'))) {
		char last[SM70__MODEL_NAME_MAX];

		if (!sm70__model_name_valid(v, n))
			return 0;
		/* "model" or "org/snapshot" say nothing */
		if (!last_component(v, last, sizeof(last)) || sm70__model_name_generic(last))
			return 0;
		memcpy(out, v, n + 1);
		return 1;
	}
	return name_from_hf_cache(v, out) || name_from_path(v, out);
}

void sm70__model_name_choose(const char *configured, const char *dir, char *out,
			     const char **source)
{
	char cfg_path[PATH_MAX], real[PATH_MAX];
	json_t *cfg = NULL;
	const char *type;

	out[0] = '\0';
	if (configured && *configured &&
	    sm70__model_name_valid(configured, strlen(configured))) {
		snprintf(out, SM70__MODEL_NAME_MAX, "%s", configured);
		*source = "model_name";
		return;
	}
	if (snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", dir) < (int)sizeof(cfg_path))
		cfg = json_load_file(cfg_path, 0, NULL);
	if (json_is_object(cfg) && name_from_checkpoint(cfg, out)) {
		*source = "config.json _name_or_path";
		goto out;
	}
	if (name_from_path(dir, out)) {
		*source = "the directory";
		goto out;
	}
	if (realpath(dir, real)) {
		if (name_from_hf_cache(real, out)) {
			*source = "the Hugging Face cache path";
			goto out;
		}
		if (name_from_path(real, out)) {
			*source = "the directory's target";
			goto out;
		}
	}
	type = json_string_value(json_object_get(cfg, "model_type"));
	if (type && sm70__model_name_valid(type, strlen(type))) {
		snprintf(out, SM70__MODEL_NAME_MAX, "%s", type);
		*source = "config.json model_type";
		goto out;
	}
	snprintf(out, SM70__MODEL_NAME_MAX, "unnamed");
	*source = "nothing";
out:
	json_decref(cfg);
}
