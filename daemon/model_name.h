/*
 * model_name.h - the name sm70d reports for its model (sm70ctl status, the client's
 * welcome, the metrics' sm70_model_info), chosen before the model loads.
 *
 * The rule, first match wins (docs/OPERATIONS.md, "The model's name"):
 *   1. the config's "model_name";
 *   2. config.json's "_name_or_path" when it names something: a hub id such as
 *      "Qwen/Qwen3-8B" is taken as it is; a filesystem path by its last component,
 *      unless that is generic (a Hugging Face cache snapshot path as in 3);
 *   3. the model directory's last component, unless it is generic; then the last
 *      component of the directory the path resolves to (a symlink such as
 *      /var/lib/sm70/model -> qwen3-8b), unless generic; a Hugging Face cache snapshot
 *      (models--ORG--NAME/snapshots/HASH) is named ORG/NAME;
 *   4. config.json's "model_type" (e.g. "qwen3"), else "unnamed".
 * Generic: model, models, snapshot(s), checkpoint(s), ckpt, weights, hf, main, latest,
 * current, default, final, export, output, out, tmp, "." and "..", a bare hex hash of 7
 * or more digits.
 * A name is 1..63 bytes of printable ASCII without '"' or '\' (it goes into JSON, log
 * lines and Prometheus labels unescaped by the reader's eye); one that is not is skipped.
 * Non-goals: reading anything but config.json; names from tokenizer files or READMEs.
 */
#ifndef SM70_DAEMON_MODEL_NAME_H
#define SM70_DAEMON_MODEL_NAME_H

#include <stddef.h>

#define SM70__MODEL_NAME_MAX 64 /* NUL included: the protocol's model_name field */

/* 1 if s (len bytes) is a usable name: 1..63 bytes, printable ASCII, no '"' or '\'.
 * Inline so that config.c, which unit tests compile alone, can check model_name with it. */
static inline int sm70__model_name_valid(const char *s, size_t len)
{
	if (!s || len == 0 || len >= SM70__MODEL_NAME_MAX)
		return 0;
	for (size_t i = 0; i < len; i++)
		if (s[i] < 0x20 || s[i] > 0x7e || s[i] == '"' || s[i] == '\\')
			return 0;
	return 1;
}

/* 1 if s is a generic directory name (rule above) that says nothing about the model. */
int sm70__model_name_generic(const char *s);

/*
 * Chooses the name by the rule above: configured is the config's model_name ("" or NULL:
 * unset), dir the model directory. Writes it to out (SM70__MODEL_NAME_MAX bytes) and sets
 * *source to a static phrase saying where it came from ("model_name", "config.json
 * _name_or_path", "the directory", "the directory's target", "the Hugging Face cache
 * path", "config.json model_type", "nothing"). Never fails: an unreadable config.json
 * only skips the steps that need it.
 */
void sm70__model_name_choose(const char *configured, const char *dir, char *out,
			     const char **source);

#endif
