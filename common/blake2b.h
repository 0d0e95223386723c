/*
 * blake2b.h - BLAKE2b (RFC 7693), keyed or not, with any output length 1..64 bytes.
 *
 * Here for the prefix cache's block keys (daemon/engine/block_pool.h): a keyed BLAKE2b is
 * a PRF by design (no HMAC nesting), so one compression hashes a 16-token block once the
 * key block is absorbed. Not a general crypto library: no constant-time claims beyond
 * what the plain code gives (it has no secret-dependent branches or table lookups), no
 * BLAKE2bp/BLAKE2x, no salt or personalization parameters.
 *
 * Streaming: init, update any number of times, final. A state may be copied with
 * memcpy/assignment to hash many messages that share a start (block_pool.c does).
 */
#ifndef SM70_COMMON_BLAKE2B_H
#define SM70_COMMON_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>

#define SM70_BLAKE2B_OUTBYTES 64
#define SM70_BLAKE2B_KEYBYTES 64
#define SM70_BLAKE2B_BLOCKBYTES 128

struct sm70_blake2b {
	uint64_t h[8];
	uint64_t t[2];   /* bytes compressed so far (128-bit counter) */
	uint8_t buf[SM70_BLAKE2B_BLOCKBYTES];
	size_t n;        /* bytes in buf */
	size_t outlen;
};

/* Starts a hash of outlen bytes (1..64) keyed with key[0..keylen) (keylen 0..64; 0: not
 * keyed). Returns 0 or -EINVAL. */
int sm70__blake2b_init(struct sm70_blake2b *s, size_t outlen, const void *key, size_t keylen);

void sm70__blake2b_update(struct sm70_blake2b *s, const void *in, size_t n);

/* Writes the outlen-byte digest to out. s is spent afterwards. */
void sm70__blake2b_final(struct sm70_blake2b *s, void *out);

/* One call: init, update, final. Returns 0 or -EINVAL. */
int sm70__blake2b(void *out, size_t outlen, const void *key, size_t keylen, const void *in,
		  size_t n);

#endif
