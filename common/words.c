/* words.c - see words.h. */
#include "common/words.h"

#include <string.h>

int sm70_words_bits(const char *list, const struct sm70_word *words, size_t n, unsigned *bits,
		    const char **bad, size_t *bad_len)
{
	int ret = 0;

	*bits = 0;
	for (const char *p = list;; p++) {
		size_t len = strcspn(p, ","), i;

		for (i = 0; i < n; i++)
			if (strlen(words[i].name) == len && strncmp(p, words[i].name, len) == 0)
				break;
		if (i < n) {
			*bits |= words[i].bits;
		} else if (ret == 0) {
			*bad = p;
			*bad_len = len;
			ret = -1;
		}
		p += len;
		if (!*p)
			return ret;
	}
}
