/*
 * loop.h - sm70d's event loop: one io_uring, fd readiness through multishot poll, and a
 * wait with a timeout (IORING_OP_TIMEOUT / the EXT_ARG timeout) for the daemon's timers.
 *
 * ae.c-style: a watch binds an fd and a poll mask to a callback; sm70__loop_run() waits up
 * to a timeout, then calls the callbacks of every readiness it collected. The daemon's
 * own timers (deadlines, slow consumers, the watchdog, the drain grace) are computed by
 * the caller, who passes the nearest one as the timeout, so the loop itself keeps no
 * timer list. Only liburing 2.3 / Linux 6.1 features are used.
 *
 * A waker writes 1 to an eventfd through the ring (IORING_OP_WRITE), so that the thread
 * never blocks on a descriptor another process shares, whatever that process did to the
 * shared file status flags or to the counter (docs/DAEMON.md, "Descriptors a client shares").
 *
 * Non-goals: threads (one thread owns a loop), write readiness, file I/O.
 */
#ifndef SM70_DAEMON_LOOP_H
#define SM70_DAEMON_LOOP_H

#include <stdint.h>

struct sm70__loop;
struct sm70__watch;
struct sm70__waker;

/* Called with the poll result mask (POLLIN, POLLHUP, ...) of a watched fd. The callback
 * may unwatch any watch, its own included, and add new ones. */
typedef void (*sm70__loop_fn)(void *arg, int fd, uint32_t revents);

/* Creates a loop with room for `entries` submissions per batch. Returns 0 or -errno. */
int sm70__loop_create(struct sm70__loop **out, unsigned int entries);

/* Removes every watch and frees the loop. The watched fds are not closed. */
void sm70__loop_destroy(struct sm70__loop *l);

/*
 * Calls fn(arg, fd, revents) whenever fd has any of `events` (POLLIN, POLLRDHUP, ...;
 * POLLHUP and POLLERR are always reported). The watch stays armed until unwatched: it is
 * multishot and re-armed by the loop when the kernel ends it. Returns 0 and the watch in
 * *out (may be NULL), or -errno.
 */
int sm70__loop_watch(struct sm70__loop *l, int fd, uint32_t events, sm70__loop_fn fn, void *arg,
		     struct sm70__watch **out);

/* Stops a watch: its callback is never called again, even for readiness already
 * collected. The loop frees it once the kernel confirms the removal. The fd may be closed
 * right after this call. NULL is ignored. */
void sm70__loop_unwatch(struct sm70__loop *l, struct sm70__watch *w);

/*
 * Submits pending work, waits up to timeout_us (0: do not wait, < 0: wait until something
 * happens), reads the clock (sm70__loop_set_clock), then runs the callbacks of everything
 * that completed. Returns the number of callbacks run, or -errno on an io_uring failure
 * (EINTR is not a failure: 0).
 */
int sm70__loop_run(struct sm70__loop *l, int64_t timeout_us);

/* After every wait, and before any callback runs, sm70__loop_run stores CLOCK_MONOTONIC in
 * microseconds into *now_us, so that callbacks never see the time from before the wait.
 * NULL turns it off. */
void sm70__loop_set_clock(struct sm70__loop *l, uint64_t *now_us);

/* Submits the work prepared so far (wakes, watches) now rather than at the next run. */
void sm70__loop_flush(struct sm70__loop *l);

/*
 * A waker for the eventfd fd (which stays the caller's: it is not duplicated or closed).
 * Returns 0 and the waker in *out, or -ENOMEM.
 */
int sm70__loop_waker_create(struct sm70__loop *l, int fd, struct sm70__waker **out);

/*
 * Adds 1 to the waker's eventfd without blocking: an IORING_OP_WRITE is prepared (submitted
 * by the next sm70__loop_flush or run). At most one write per waker is in the kernel; a wake
 * asked for while one is in flight is written after that one completes, so a wake is never
 * lost and a client that stops reading its counter costs one pending request, not one per
 * wake.
 */
void sm70__loop_wake(struct sm70__loop *l, struct sm70__waker *w);

/* Ends a waker: the write in flight, if any, is submitted and cancelled, and the waker is
 * freed once its completion arrives (or by sm70__loop_destroy). The fd may be closed right
 * after this call. NULL is ignored. */
void sm70__loop_waker_destroy(struct sm70__loop *l, struct sm70__waker *w);

#endif
