/*
 * ple.c - qwen4_exp's n-gram hash parameters and the page-locked table memory (ple.h).
 *
 * The parameters follow transformers' Qwen4ExpTextNGramEmbedding exactly: for PLE layer
 * li, multiplier i (i < ngram) is 2 * (splitmix64(seed + 10007 * li + GAMMA * (i + 1)) %
 * half) + 1 with half = max(1, ((2^63 - 1) / vocab) / 2), all mod 2^64; head g of layer li
 * owns the (li * heads + g)-th prime at or above ngram_vocab_size_base, heads laid out
 * one after another, the total padded up to make_ngram_vocab_size_divisible_by.
 *
 * Non-goals: other hash families; tables that do not fit host memory.
 */
#include "daemon/engine/ple.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/dtype.h"

#define GAMMA 0x9E3779B97F4A7C15ull

static uint64_t splitmix64(uint64_t v)
{
	v += GAMMA;
	v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
	v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
	return v ^ (v >> 31);
}

static int is_prime(uint64_t v)
{
	if (v < 2)
		return 0;
	if (v % 2 == 0)
		return v == 2;
	for (uint64_t d = 3; d * d <= v; d += 2)
		if (v % d == 0)
			return 0;
	return 1;
}

int sm70__ple_params(const struct sm70_model_config *c, int li, struct sm70_ple_params *p,
		     struct sm70_err *err)
{
	const struct sm70_qwen4_config *q = &c->q4;
	uint64_t half = (uint64_t)INT64_MAX / (uint64_t)(c->vocab_size > 1 ? c->vocab_size : 1) / 2;
	uint64_t base_seed = (uint64_t)q->seed + 10007ull * (uint64_t)li, prime, total = 0;
	int skip;

	memset(p, 0, sizeof(*p));
	if (q->ngram > SM70_PLE_MAX_NGRAM)
		return sm70_errf(err, -EINVAL, "ngram_size %d exceeds %d", q->ngram,
				 SM70_PLE_MAX_NGRAM);
	p->n_heads = (q->ngram - 1) * q->heads_per_ngram;
	p->size = calloc((size_t)p->n_heads, sizeof(*p->size));
	p->offset = calloc((size_t)p->n_heads, sizeof(*p->offset));
	if (!p->size || !p->offset) {
		sm70__ple_params_free(p);
		return -ENOMEM;
	}
	if (half < 1)
		half = 1;
	for (int i = 0; i < q->ngram; i++)
		p->mult[i] = 2 * (splitmix64(base_seed + GAMMA * (uint64_t)(i + 1)) % half) + 1;
	/* the heads of earlier PLE layers own the primes before this layer's */
	prime = (uint64_t)q->ngram_base - 1;
	skip = li * p->n_heads;
	for (int g = 0; g < skip + p->n_heads; g++) {
		do
			prime++;
		while (!is_prime(prime));
		if (g >= skip) {
			p->size[g - skip] = prime;
			p->offset[g - skip] = total;
			total += prime;
		}
	}
	p->rows = (total + (uint64_t)q->ngram_div - 1) / (uint64_t)q->ngram_div *
		  (uint64_t)q->ngram_div;
	return 0;
}

void sm70__ple_params_free(struct sm70_ple_params *p)
{
	free(p->size);
	free(p->offset);
	p->size = p->offset = NULL;
}

/* "8 MiB", "unlimited": a limit for a message. */
static void limit_text(char *buf, size_t n, rlim_t v)
{
	if (v == RLIM_INFINITY)
		snprintf(buf, n, "unlimited");
	else
		snprintf(buf, n, "%llu KiB", (unsigned long long)(v >> 10));
}

void *sm70__pinned_alloc(size_t bytes, struct sm70_err *err)
{
	struct rlimit rl = { 0, 0 };
	char lim[48];
	void *p;

	if (bytes == 0)
		bytes = 1;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		sm70_errf(err, -ENOMEM, "cannot map %zu bytes of host memory for the n-gram "
			  "tables", bytes);
		return NULL;
	}
	if (mlock(p, bytes) == 0)
		return p;
	getrlimit(RLIMIT_MEMLOCK, &rl);
	limit_text(lim, sizeof(lim), rl.rlim_cur);
	sm70_errf(err, -ENOMEM, "cannot lock the n-gram tables (%zu MiB) in memory: "
		  "RLIMIT_MEMLOCK is %s (the packaged sm70d.service sets LimitMEMLOCK=infinity; "
		  "from a shell raise it with ulimit -l)", bytes >> 20, lim);
	munmap(p, bytes);
	return NULL;
}

void sm70__pinned_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes ? bytes : 1);
}

struct fill_job {
	void *dst;
	enum sm70_dtype dt;
	size_t n, begin, end;
	uint64_t seed;
	float scale;
};

static void *fill_range(void *arg)
{
	const struct fill_job *j = arg;

	for (size_t i = j->begin; i < j->end; i++) {
		/* 24 random bits to a value in [-scale, scale) */
		float v = ((float)(splitmix64(j->seed ^ i) >> 40) * (1.0f / 8388608.0f) - 1.0f) *
			  j->scale;
		if (j->dt == SM70_DTYPE_F32)
			((float *)j->dst)[i] = v;
		else if (j->dt == SM70_DTYPE_F16)
			((uint16_t *)j->dst)[i] = sm70_f32_to_f16(v);
		else
			((uint16_t *)j->dst)[i] = sm70_f32_to_bf16(v);
	}
	return NULL;
}

void sm70__ple_dummy_fill(void *dst, enum sm70_dtype dt, size_t n, uint64_t seed,
			  float scale)
{
	enum { MAX_THREADS = 64 };
	pthread_t th[MAX_THREADS];
	struct fill_job jobs[MAX_THREADS];
	int made[MAX_THREADS] = { 0 };
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int nt = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;

	if (n < ((size_t)1 << 20))
		nt = 1;
	for (int t = 0; t < nt; t++)
		jobs[t] = (struct fill_job){ dst, dt, n, n * (size_t)t / (size_t)nt,
					     n * (size_t)(t + 1) / (size_t)nt, seed, scale };
	for (int t = 1; t < nt; t++)
		made[t] = pthread_create(&th[t], NULL, fill_range, &jobs[t]) == 0;
	for (int t = 0; t < nt; t++)
		if (!made[t])
			fill_range(&jobs[t]); /* this thread's share, or one no thread took */
	for (int t = 1; t < nt; t++)
		if (made[t])
			pthread_join(th[t], NULL);
}
