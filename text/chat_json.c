/*
 * chat_json.c - a JSON "messages" array as chat turns (the shape of OpenAI-style requests
 * and of apply_chat_template's argument); see chat.h.
 */
#include "text/chat.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int sm70_chat_msgs_from_json(const struct json_t *messages, struct sm70_chat_msg **out,
			     size_t *n, struct sm70_err *err)
{
	json_t *arr = (json_t *)messages, *e;
	struct sm70_chat_msg *m;
	size_t i;

	*out = NULL;
	*n = 0;
	if (!json_is_array(arr))
		return sm70_errf(err, -EINVAL, "messages: expected an array of "
				 "{\"role\", \"content\"} objects");
	m = calloc(json_array_size(arr) ? json_array_size(arr) : 1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	json_array_foreach(arr, i, e) {
		json_t *role = json_object_get(e, "role"), *content = json_object_get(e, "content");
		json_t *reasoning = json_object_get(e, "reasoning_content");
		json_t *calls = json_object_get(e, "tool_calls");
		const char *why = NULL;

		if (!json_is_object(e))
			why = "not an object";
		else if (!json_is_string(role) ||
			 strlen(json_string_value(role)) != json_string_length(role))
			why = "\"role\" missing or not a string";
		else if (!json_is_string(content))
			why = "\"content\" missing or not a string";
		else if (reasoning && !json_is_null(reasoning) && !json_is_string(reasoning))
			why = "\"reasoning_content\" is not a string";
		else if (calls && !json_is_null(calls) &&
			 !(json_is_array(calls) && !json_array_size(calls)))
			why = "\"tool_calls\" are not supported";
		if (why) {
			free(m);
			return sm70_errf(err, -EINVAL, "messages[%zu]: %s", i, why);
		}
		m[i].role = json_string_value(role);
		m[i].content = json_string_value(content);
		m[i].content_len = json_string_length(content);
		if (json_is_string(reasoning)) {
			m[i].reasoning = json_string_value(reasoning);
			m[i].reasoning_len = json_string_length(reasoning);
		}
	}
	*out = m;
	*n = json_array_size(arr);
	return 0;
}
