/*
 * admin.h - the admin channel: a second AF_UNIX SOCK_SEQPACKET socket for sm70ctl.
 *
 * One JSON request per message, one JSON reply per message, served from the daemon's
 * io_uring loop like the client socket and never blocking it (non-blocking sends; a peer
 * that does not read its replies is disconnected). Replies are kept under
 * SM70__ADMIN_MSG_MAX bytes: the jobs and clients lists stop at a bound and say so
 * ("truncated": true, "total": n). Access: SO_PEERCRED against admin_allowed_uids /
 * admin_allowed_gids (may read: status, metrics, jobs, clients, health) and
 * admin_control_uids / admin_control_gids (may also drain); both default to root and the
 * daemon's uid. Connections: SM70__ADMIN_MAX_CONNS in all, admin_max_conns_per_uid per
 * uid, each closed after admin_idle_ms without a request; a refused or closed peer always
 * reads the reason first. Requests with a key twice are refused. Error replies carry
 * "code": "denied", "busy", "idle" or "invalid". Commands and replies are in
 * docs/OBSERVABILITY.md. Non-goals: changing the configuration, cancelling single jobs,
 * socket activation of this socket.
 */
#ifndef SM70_DAEMON_ADMIN_H
#define SM70_DAEMON_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "daemon/daemon.h"

#define SM70__ADMIN_MSG_MAX 65536 /* the largest reply (and request) message, bytes */
#define SM70__ADMIN_MAX_CONNS 16
#define SM70__ADMIN_LIST_MAX 256 /* jobs or clients listed in one reply */

/* Binds cfg.admin_socket_path (replacing a stale socket file nobody listens on), chmods
 * it to admin_socket_mode and starts watching it. Returns 0 or -errno with err set. */
int sm70__admin_open(struct sm70__daemon *d, struct sm70_err *err);

/* Closes admin connections idle for admin_idle_ms (each first gets {"code": "idle"}) and
 * retries a paused accept. Call after every wait of the loop. */
void sm70__admin_poll(struct sm70__daemon *d);

/* Microseconds until sm70__admin_poll has work (an idle deadline, an accept retry), or -1
 * for none. */
int64_t sm70__admin_next_timer(const struct sm70__daemon *d);

/* Closes every admin connection and the listener; unlinks the socket file we created. */
void sm70__admin_close(struct sm70__daemon *d);

/* Answers one request (the JSON text req, len bytes) of a peer that may control (drain)
 * or only read, with a malloc'd NUL-terminated JSON reply in *reply (the caller frees it).
 * Never fails: a bad or forbidden request gets {"ok": false, "error": "...", "code": ...};
 * returns -ENOMEM only when no reply could be built. */
int sm70__admin_handle(struct sm70__daemon *d, const char *req, size_t len, int control,
		       char **reply);

#endif
