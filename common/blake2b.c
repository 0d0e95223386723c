/* blake2b.c - BLAKE2b after RFC 7693 section 3; see blake2b.h. Tested against the RFC's
 * "abc" vector and the reference blake2b-kat.txt (tests/unit/test_blake2b.c). */
#include "common/blake2b.h"

#include <errno.h>
#include <string.h>

static const uint64_t iv[8] = {
	0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull,
	0xa54ff53a5f1d36f1ull, 0x510e527fade682d1ull, 0x9b05688c2b3e6c1full,
	0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull,
};

static const uint8_t sigma[12][16] = {
	{ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 },
	{ 14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3 },
	{ 11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4 },
	{ 7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8 },
	{ 9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13 },
	{ 2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9 },
	{ 12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11 },
	{ 13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10 },
	{ 6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5 },
	{ 10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0 },
	{ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 },
	{ 14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3 },
};

static uint64_t rotr64(uint64_t x, unsigned r)
{
	return (x >> r) | (x << (64 - r));
}

/* Little-endian on every host: the RFC defines words that way. */
static uint64_t load64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

#define G(a, b, c, d, x, y)                         \
	do {                                        \
		v[a] = v[a] + v[b] + (x);           \
		v[d] = rotr64(v[d] ^ v[a], 32);     \
		v[c] = v[c] + v[d];                 \
		v[b] = rotr64(v[b] ^ v[c], 24);     \
		v[a] = v[a] + v[b] + (y);           \
		v[d] = rotr64(v[d] ^ v[a], 16);     \
		v[c] = v[c] + v[d];                 \
		v[b] = rotr64(v[b] ^ v[c], 63);     \
	} while (0)

static void compress(struct sm70_blake2b *s, const uint8_t *block, int last)
{
	uint64_t m[16], v[16];

	for (int i = 0; i < 16; i++)
		m[i] = load64(block + 8 * i);
	for (int i = 0; i < 8; i++) {
		v[i] = s->h[i];
		v[i + 8] = iv[i];
	}
	v[12] ^= s->t[0];
	v[13] ^= s->t[1];
	if (last)
		v[14] = ~v[14];
	for (int r = 0; r < 12; r++) {
		const uint8_t *z = sigma[r];
		G(0, 4, 8, 12, m[z[0]], m[z[1]]);
		G(1, 5, 9, 13, m[z[2]], m[z[3]]);
		G(2, 6, 10, 14, m[z[4]], m[z[5]]);
		G(3, 7, 11, 15, m[z[6]], m[z[7]]);
		G(0, 5, 10, 15, m[z[8]], m[z[9]]);
		G(1, 6, 11, 12, m[z[10]], m[z[11]]);
		G(2, 7, 8, 13, m[z[12]], m[z[13]]);
		G(3, 4, 9, 14, m[z[14]], m[z[15]]);
	}
	for (int i = 0; i < 8; i++)
		s->h[i] ^= v[i] ^ v[i + 8];
}

static void count(struct sm70_blake2b *s, size_t n)
{
	s->t[0] += n;
	if (s->t[0] < n)
		s->t[1]++;
}

int sm70__blake2b_init(struct sm70_blake2b *s, size_t outlen, const void *key, size_t keylen)
{
	if (outlen == 0 || outlen > SM70_BLAKE2B_OUTBYTES || keylen > SM70_BLAKE2B_KEYBYTES ||
	    (keylen && !key))
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	memcpy(s->h, iv, sizeof(s->h));
	/* parameter block word 0: digest length, key length, fanout 1, depth 1 */
	s->h[0] ^= 0x01010000ull ^ ((uint64_t)keylen << 8) ^ outlen;
	s->outlen = outlen;
	if (keylen) {
		/* the key is the first block, zero-padded; compressed once more input comes */
		memcpy(s->buf, key, keylen);
		s->n = SM70_BLAKE2B_BLOCKBYTES;
	}
	return 0;
}

void sm70__blake2b_update(struct sm70_blake2b *s, const void *in, size_t n)
{
	const uint8_t *p = in;

	while (n > 0) {
		/* A full buffer is compressed only when more input follows: the last block
		 * must go through final with the last-block flag. */
		if (s->n == SM70_BLAKE2B_BLOCKBYTES) {
			count(s, SM70_BLAKE2B_BLOCKBYTES);
			compress(s, s->buf, 0);
			s->n = 0;
		}
		size_t take = SM70_BLAKE2B_BLOCKBYTES - s->n;
		if (take > n)
			take = n;
		memcpy(s->buf + s->n, p, take);
		s->n += take;
		p += take;
		n -= take;
	}
}

void sm70__blake2b_final(struct sm70_blake2b *s, void *out)
{
	uint8_t full[SM70_BLAKE2B_OUTBYTES];

	count(s, s->n);
	memset(s->buf + s->n, 0, SM70_BLAKE2B_BLOCKBYTES - s->n);
	compress(s, s->buf, 1);
	for (int i = 0; i < 8; i++)
		for (int b = 0; b < 8; b++)
			full[8 * i + b] = (uint8_t)(s->h[i] >> (8 * b));
	memcpy(out, full, s->outlen);
}

int sm70__blake2b(void *out, size_t outlen, const void *key, size_t keylen, const void *in,
		  size_t n)
{
	struct sm70_blake2b s;
	int ret = sm70__blake2b_init(&s, outlen, key, keylen);

	if (ret)
		return ret;
	sm70__blake2b_update(&s, in, n);
	sm70__blake2b_final(&s, out);
	return 0;
}
