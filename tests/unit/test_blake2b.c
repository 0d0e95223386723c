/*
 * test_blake2b - BLAKE2b (common/blake2b.c) against the standard vectors: RFC 7693
 * appendix A ("abc"), the empty message, and the keyed entries of the reference
 * blake2b-kat.txt (key 00..3f, message 00..n-1) at every buffer edge; the same digests
 * fed one byte at a time and in odd pieces; a short output and bad parameters.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/blake2b.h"

static void hex(const uint8_t *d, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void expect(const uint8_t *d, size_t n, const char *want, const char *what)
{
	char got[2 * SM70_BLAKE2B_OUTBYTES + 1];

	hex(d, n, got);
	if (strcmp(got, want))
		fail_msg("%s: got %s, want %s", what, got, want);
}

static void test_rfc7693(void **state)
{
	uint8_t d[64];

	assert_int_equal(sm70__blake2b(d, 64, NULL, 0, "abc", 3), 0);
	expect(d, 64, "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
		      "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923",
	       "BLAKE2b-512(\"abc\")");
	assert_int_equal(sm70__blake2b(d, 64, NULL, 0, "", 0), 0);
	expect(d, 64, "786a02f742015903c6c6fd852552d272912f4740e15847618a86e217f71f5419"
		      "d25e1031afee585313896444934eb04b903a685b1448b755d56f701afe9be2ce",
	       "BLAKE2b-512(\"\")");
	printf("RFC 7693 \"abc\" and the empty message: equal\n");
}

static const struct {
	size_t n;
	const char *digest;
} kat[] = {
	{ 0, "10ebb67700b1868efb4417987acf4690ae9d972fb7a590c2f02871799aaa4786"
	     "b5e996e8f0f4eb981fc214b005f42d2ff4233499391653df7aefcbc13fc51568" },
	{ 1, "961f6dd1e4dd30f63901690c512e78e4b45e4742ed197c3c5e45c549fd25f2e4"
	     "187b0bc9fe30492b16b0d0bc4ef9b0f34c7003fac09a5ef1532e69430234cebd" },
	{ 2, "da2cfbe2d8409a0f38026113884f84b50156371ae304c4430173d08a99d9fb1b"
	     "983164a3770706d537f49e0c916d9f32b95cc37a95b99d857436f0232c88a965" },
	{ 3, "33d0825dddf7ada99b0e7e307104ad07ca9cfd9692214f1561356315e784f3e5"
	     "a17e364ae9dbb14cb2036df932b77f4b292761365fb328de7afdc6d8998f5fc1" },
	{ 63, "bd965bf31e87d70327536f2a341cebc4768eca275fa05ef98f7f1b71a0351298"
	      "de006fba73fe6733ed01d75801b4a928e54231b38e38c562b2e33ea1284992fa" },
	{ 64, "65676d800617972fbd87e4b9514e1c67402b7a331096d3bfac22f1abb95374ab"
	      "c942f16e9ab0ead33b87c91968a6e509e119ff07787b3ef483e1dcdccf6e3022" },
	{ 127, "76d2d819c92bce55fa8e092ab1bf9b9eab237a25267986cacf2b8ee14d214d73"
	       "0dc9a5aa2d7b596e86a1fd8fa0804c77402d2fcd45083688b218b1cdfa0dcbcb" },
	{ 128, "72065ee4dd91c2d8509fa1fc28a37c7fc9fa7d5b3f8ad3d0d7a25626b57b1b44"
	       "788d4caf806290425f9890a3a2a35a905ab4b37acfd0da6e4517b2525c9651e4" },
	{ 129, "64475dfe7600d7171bea0b394e27c9b00d8e74dd1e416a79473682ad3dfdbb70"
	       "6631558055cfc8a40e07bd015a4540dcdea15883cbbf31412df1de1cd4152b91" },
	{ 255, "142709d62e28fcccd0af97fad0f8465b971e82201dc51070faa0372aa43e9248"
	       "4be1c1e73ba10906d5d1853db6a4106e0a7bf9800d373d6dee2d46d62ef2a461" },
};

/* blake2b-kat.txt's keyed entries, in one call, byte by byte, and in pieces of 7. */
static void test_keyed_kat(void **state)
{
	uint8_t key[64], msg[256], d[64];
	char what[64];

	for (int i = 0; i < 64; i++)
		key[i] = (uint8_t)i;
	for (int i = 0; i < 256; i++)
		msg[i] = (uint8_t)i;
	for (size_t k = 0; k < sizeof(kat) / sizeof(kat[0]); k++) {
		struct sm70_blake2b s;

		snprintf(what, sizeof(what), "keyed KAT, %zu bytes", kat[k].n);
		assert_int_equal(sm70__blake2b(d, 64, key, 64, msg, kat[k].n), 0);
		expect(d, 64, kat[k].digest, what);
		assert_int_equal(sm70__blake2b_init(&s, 64, key, 64), 0);
		for (size_t i = 0; i < kat[k].n; i++)
			sm70__blake2b_update(&s, msg + i, 1);
		sm70__blake2b_final(&s, d);
		expect(d, 64, kat[k].digest, what);
		assert_int_equal(sm70__blake2b_init(&s, 64, key, 64), 0);
		for (size_t i = 0; i < kat[k].n; i += 7)
			sm70__blake2b_update(&s, msg + i, kat[k].n - i < 7 ? kat[k].n - i : 7);
		sm70__blake2b_final(&s, d);
		expect(d, 64, kat[k].digest, what);
	}
	printf("keyed KAT: %zu entries (0..255 bytes) equal, whole, byte by byte and in 7s\n",
	       sizeof(kat) / sizeof(kat[0]));
}

/* A 16-byte output is its own function (the length is in the parameter block), not a
 * truncation; a copied state hashes the same as a fresh one. Digests from Python's
 * hashlib.blake2b (the reference implementation). */
static void test_short_output_and_copy(void **state)
{
	struct sm70_blake2b s, c;
	uint8_t d[16];

	assert_int_equal(sm70__blake2b(d, 16, NULL, 0,
				       "The quick brown fox jumps over the lazy dog", 43), 0);
	expect(d, 16, "249df9a49f517ddcd37f5c897620ec73", "BLAKE2b-128(fox)");
	assert_int_equal(sm70__blake2b_init(&s, 16, "sm70", 4), 0);
	sm70__blake2b_update(&s, "a", 1);
	c = s;
	sm70__blake2b_update(&c, "bc", 2);
	sm70__blake2b_final(&c, d);
	expect(d, 16, "3f35736de4b7945b7fe5996bc1b3f554", "BLAKE2b-128(key \"sm70\", \"abc\")");
	assert_int_equal(sm70__blake2b_init(&s, 0, NULL, 0), -EINVAL);
	assert_int_equal(sm70__blake2b_init(&s, 65, NULL, 0), -EINVAL);
	assert_int_equal(sm70__blake2b_init(&s, 16, "k", 65), -EINVAL);
	printf("16-byte output, keyed, through a copied state: equal; bad lengths refused\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rfc7693),
		cmocka_unit_test(test_keyed_kat),
		cmocka_unit_test(test_short_output_and_copy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
