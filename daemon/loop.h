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
 * Non-goals: threads (one thread owns a loop), write readiness, file I/O.
 */
#ifndef SM70_DAEMON_LOOP_H
#define SM70_DAEMON_LOOP_H

#include <stdint.h>

struct sm70__loop;
struct sm70__watch;

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
 * happens), then runs the callbacks of everything that completed. Returns the number of
 * callbacks run, or -errno on an io_uring failure (EINTR is not a failure: 0).
 */
int sm70__loop_run(struct sm70__loop *l, int64_t timeout_us);

#endif
