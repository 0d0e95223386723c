/*
 * loop.c - the io_uring event loop; see loop.h.
 *
 * A watch is one multishot IORING_OP_POLL_ADD whose user_data is the watch itself. The
 * kernel may end a multishot poll on its own (a CQE without IORING_CQE_F_MORE); the loop
 * then re-arms it. Unwatching marks the watch dead and submits a POLL_REMOVE; the watch's
 * memory is freed only when its last CQE (the one without F_MORE) has been seen, because
 * until then the kernel may still post CQEs that point at it. POLL_REMOVE completions
 * carry user_data 0 and are ignored.
 */
#include "daemon/loop.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>

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

struct sm70__loop {
	struct io_uring ring;
	struct sm70__watch *zombies; /* dead and no longer armed: free at the end of a run */
	struct sm70__watch *live;    /* every watch not yet freed, for destroy */
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
	/* Closing the ring cancels every poll; nothing can complete afterwards. */
	io_uring_queue_exit(&l->ring);
	free_zombies(l);
	while (l->live) {
		struct sm70__watch *w = l->live;

		l->live = w->next;
		free(w);
	}
	free(l);
}

/* Handles one completion. Returns 1 if a callback ran. */
static int handle_cqe(struct sm70__loop *l, const struct io_uring_cqe *cqe)
{
	struct sm70__watch *w = io_uring_cqe_get_data(cqe);
	int ran = 0;

	if (!w)
		return 0; /* a POLL_REMOVE's own completion */
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
