/*
 * loop.c - the io_uring event loop; see loop.h.
 *
 * A watch is one multishot IORING_OP_POLL_ADD whose user_data is the watch itself. The
 * kernel may end a multishot poll on its own (a CQE without IORING_CQE_F_MORE); the loop
 * then re-arms it. Unwatching marks the watch dead and submits a POLL_REMOVE; the watch's
 * memory is freed only when its last CQE (the one without F_MORE) has been seen, because
 * until then the kernel may still post CQEs that point at it. POLL_REMOVE and cancel
 * completions carry user_data 0 and are ignored.
 *
 * A waker's write carries the waker's address with bit 0 set (allocations are 8-aligned,
 * so a watch's user_data never has it). The write's buffer is one static constant, so the
 * kernel never reads memory the loop frees; the waker itself is freed only on its write's
 * completion, for the same reason as a watch.
 *
 * Why a write through the ring cannot block the thread, on each kernel (the eventfd's
 * file status flags are shared with the client, who may clear O_NONBLOCK, and its counter
 * too, which the client may set to 0xfffffffffffffffe so that any write of 1 would wait):
 * - Linux 6.1 (Debian 12): eventfd has a plain ->write, so io_uring issues it through
 *   loop_rw_iter. With O_NONBLOCK set and a full counter that returns -EAGAIN in the CQE
 *   (the client then has an unread wake: nothing is lost). With O_NONBLOCK cleared the
 *   inline attempt returns -EAGAIN, the request is parked on the eventfd's POLLOUT or
 *   handed to an io-wq worker; either waits in the kernel, never in io_uring_enter, and
 *   IORING_OP_ASYNC_CANCEL ends it (a worker blocked in eventfd_write is woken by the
 *   cancel's notify signal and completes with -EINTR).
 * - Linux 6.18 (tested): the write waits on POLLOUT in both cases and completes when the
 *   client reads its counter, or with -ECANCELED when cancelled.
 * (pwritev2 with RWF_NOWAIT is no alternative: on both kernels it fails with EOPNOTSUPP on
 * an eventfd, whose write side has no write_iter.)
 */
#include "daemon/loop.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <time.h>

#include "daemon/log.h"

struct sm70__watch {
	int fd;
	uint32_t events;
	sm70__loop_fn fn;
	void *arg;
	int armed; /* a poll is in the kernel: a final CQE will come */
	int dead;
	struct sm70__watch *next; /* on the loop's list of all live watches, or zombies */
};

struct sm70__waker {
	int fd;
	int in_flight; /* a write is prepared or in the kernel: its completion will come */
	int again;     /* a wake was asked for while it was: write once more after it */
	int dead;      /* destroyed: free on the completion */
	struct sm70__waker *next; /* on the loop's list of every waker not yet freed */
};

/* What every waker write adds to its eventfd. Static, so it outlives any request. */
static const uint64_t wake_one = 1;

#define WAKER_TAG 1u

struct sm70__loop {
	struct io_uring ring;
	struct sm70__watch *zombies; /* dead and no longer armed: free at the end of a run */
	struct sm70__watch *live;    /* every watch not yet freed, for destroy */
	struct sm70__waker *wakers;  /* every waker not yet freed, for destroy */
	uint64_t *clock;	     /* set after every wait (sm70__loop_set_clock) */
};

int sm70__loop_create(struct sm70__loop **out, unsigned int entries)
{
	struct io_uring_params p = { 0 };
	struct sm70__loop *l;
	int ret;

	*out = NULL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	/* A CQ four times the SQ: one doorbell per client can be pending at once. */
	p.flags = IORING_SETUP_CQSIZE;
	p.cq_entries = entries * 4;
	ret = io_uring_queue_init_params(entries, &l->ring, &p);
	if (ret < 0) {
		free(l);
		return ret;
	}
	*out = l;
	return 0;
}

/* Returns a submission slot, flushing the queue once if it is full. */
static struct io_uring_sqe *get_sqe(struct sm70__loop *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);

	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	return sqe;
}

static int arm(struct sm70__loop *l, struct sm70__watch *w)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_multishot(sqe, w->fd, w->events);
	io_uring_sqe_set_data(sqe, w);
	w->armed = 1;
	return 0;
}

static void live_remove(struct sm70__loop *l, struct sm70__watch *w)
{
	struct sm70__watch **pp;

	for (pp = &l->live; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			return;
		}
}

int sm70__loop_watch(struct sm70__loop *l, int fd, uint32_t events, sm70__loop_fn fn, void *arg,
		     struct sm70__watch **out)
{
	struct sm70__watch *w;
	int ret;

	if (out)
		*out = NULL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = fd;
	w->events = events | POLLHUP | POLLERR;
	w->fn = fn;
	w->arg = arg;
	ret = arm(l, w);
	if (ret) {
		free(w);
		return ret;
	}
	w->next = l->live;
	l->live = w;
	if (out)
		*out = w;
	return 0;
}

void sm70__loop_unwatch(struct sm70__loop *l, struct sm70__watch *w)
{
	struct io_uring_sqe *sqe;

	if (!w || w->dead)
		return;
	w->dead = 1;
	w->fn = NULL;
	if (!w->armed) {
		live_remove(l, w);
		w->next = l->zombies;
		l->zombies = w;
		return;
	}
	sqe = get_sqe(l);
	if (!sqe) {
		/* Cannot happen after a flush; if it does, the poll stays armed on a dead watch
		 * and its CQEs are ignored until destroy. */
		sm70__warn("loop: no submission slot to remove a poll on fd %d", w->fd);
		return;
	}
	io_uring_prep_poll_remove(sqe, (__u64)(uintptr_t)w);
	io_uring_sqe_set_data(sqe, NULL);
}

static void free_zombies(struct sm70__loop *l)
{
	while (l->zombies) {
		struct sm70__watch *w = l->zombies;

		l->zombies = w->next;
		free(w);
	}
}

void sm70__loop_destroy(struct sm70__loop *l)
{
	if (!l)
		return;
	/* Closing the ring cancels every poll and write; nothing can complete afterwards,
	 * and no request reads a waker (their buffer is static). */
	io_uring_queue_exit(&l->ring);
	free_zombies(l);
	while (l->live) {
		struct sm70__watch *w = l->live;

		l->live = w->next;
		free(w);
	}
	while (l->wakers) {
		struct sm70__waker *k = l->wakers;

		l->wakers = k->next;
		free(k);
	}
	free(l);
}

/* ---- wakers ------------------------------------------------------------------------- */

static void waker_unlink(struct sm70__loop *l, struct sm70__waker *k)
{
	struct sm70__waker **pp;

	for (pp = &l->wakers; *pp; pp = &(*pp)->next)
		if (*pp == k) {
			*pp = k->next;
			return;
		}
}

int sm70__loop_waker_create(struct sm70__loop *l, int fd, struct sm70__waker **out)
{
	struct sm70__waker *k = calloc(1, sizeof(*k));

	*out = NULL;
	if (!k)
		return -ENOMEM;
	k->fd = fd;
	k->next = l->wakers;
	l->wakers = k;
	*out = k;
	return 0;
}

static void waker_write(struct sm70__loop *l, struct sm70__waker *k)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe) {
		/* Cannot happen after a flush; the client misses one wake and its own
		 * timeout or the next event recovers it. */
		sm70__warn("loop: no submission slot to wake fd %d", k->fd);
		return;
	}
	io_uring_prep_write(sqe, k->fd, &wake_one, sizeof(wake_one), 0);
	io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)k | WAKER_TAG);
	k->in_flight = 1;
	k->again = 0;
}

void sm70__loop_wake(struct sm70__loop *l, struct sm70__waker *k)
{
	if (k->dead)
		return;
	if (k->in_flight) {
		/* It may have landed already and been read by the client before the events
		 * this wake is for were published: write again once it completes. */
		k->again = 1;
		return;
	}
	waker_write(l, k);
}

void sm70__loop_waker_destroy(struct sm70__loop *l, struct sm70__waker *k)
{
	struct io_uring_sqe *sqe;

	if (!k || k->dead)
		return;
	k->dead = 1;
	if (!k->in_flight) {
		waker_unlink(l, k);
		free(k);
		return;
	}
	/* The write may still sit in the submission queue naming k->fd, which the caller is
	 * about to close (and the number may be reused at once): submit it now, so that it
	 * holds its own reference to the file, then cancel it. */
	io_uring_submit(&l->ring);
	sqe = get_sqe(l);
	if (!sqe) {
		sm70__warn("loop: no submission slot to cancel a wake of fd %d", k->fd);
		return; /* it completes when the client reads, or at destroy */
	}
	io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)k | WAKER_TAG, 0);
	io_uring_sqe_set_data64(sqe, 0);
	io_uring_submit(&l->ring);
}

/* A waker's write completed (res: bytes written or -errno). */
static void waker_done(struct sm70__loop *l, struct sm70__waker *k, int res)
{
	k->in_flight = 0;
	if (k->dead) {
		waker_unlink(l, k);
		free(k);
		return;
	}
	/* -EAGAIN: the counter was full and O_NONBLOCK set (6.1): the client has an unread
	 * wake. -ECANCELED, -EINTR: cancelled. Anything else is worth a debug line. */
	if (res < 0 && res != -EAGAIN && res != -ECANCELED && res != -EINTR)
		sm70__debug("loop: wake of fd %d failed: error %d", k->fd, -res);
	if (k->again)
		waker_write(l, k);
}

/* ---- running ------------------------------------------------------------------------ */

void sm70__loop_set_clock(struct sm70__loop *l, uint64_t *now_us)
{
	l->clock = now_us;
}

void sm70__loop_flush(struct sm70__loop *l)
{
	if (io_uring_sq_ready(&l->ring))
		io_uring_submit(&l->ring);
}

static uint64_t monotonic_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Handles one completion. Returns 1 if a callback ran. */
static int handle_cqe(struct sm70__loop *l, const struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	struct sm70__watch *w;
	int ran = 0;

	if (!ud)
		return 0; /* a POLL_REMOVE's or a cancel's own completion */
	if (ud & WAKER_TAG) {
		waker_done(l, (struct sm70__waker *)(uintptr_t)(ud & ~(uint64_t)WAKER_TAG),
			   cqe->res);
		return 0;
	}
	w = (struct sm70__watch *)(uintptr_t)ud;
	if (!(cqe->flags & IORING_CQE_F_MORE))
		w->armed = 0;
	if (w->dead) {
		if (!w->armed) {
			live_remove(l, w);
			free(w);
		}
		return 0;
	}
	if (cqe->res > 0) {
		w->fn(w->arg, w->fd, (uint32_t)cqe->res);
		ran = 1;
	} else if (cqe->res < 0 && cqe->res != -ECANCELED) {
		sm70__warn("loop: poll on fd %d failed: error %d", w->fd, -cqe->res);
	}
	/* The callback may have unwatched w: then it sits on the zombie list (not armed) or
	 * waits for its removal CQE (armed). Re-arm only a live watch the kernel let go. */
	if (!w->dead && !w->armed && arm(l, w))
		sm70__err("loop: cannot re-arm the poll on fd %d", w->fd);
	return ran;
}

int sm70__loop_run(struct sm70__loop *l, int64_t timeout_us)
{
	struct io_uring_cqe *cqe;
	unsigned int head, n;
	int ret, ran = 0;

	if (timeout_us == 0) {
		ret = io_uring_submit(&l->ring);
	} else if (timeout_us < 0) {
		ret = io_uring_submit_and_wait(&l->ring, 1);
	} else {
		struct __kernel_timespec ts = {
			.tv_sec = timeout_us / 1000000,
			.tv_nsec = (timeout_us % 1000000) * 1000,
		};
		ret = io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL);
		if (ret == -ETIME)
			ret = 0;
	}
	if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
		return ret;
	if (l->clock)
		*l->clock = monotonic_us();

	/* Callbacks may submit (re-arm, unwatch), which never touches the CQ, so walking
	 * the CQ with a cached head while they run is safe. Process in bounded batches. */
	for (;;) {
		n = 0;
		io_uring_for_each_cqe(&l->ring, head, cqe) {
			ran += handle_cqe(l, cqe);
			n++;
		}
		if (!n)
			break;
		io_uring_cq_advance(&l->ring, n);
	}
	free_zombies(l);
	return ran;
}
