/*
 * unix_socket.h - what the client socket and the admin socket share: binding a
 * SOCK_SEQPACKET listener safely, and deciding a peer's access by uid and groups.
 */
#ifndef SM70_DAEMON_UNIX_SOCKET_H
#define SM70_DAEMON_UNIX_SOCKET_H

#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* Binds and listens on path (non-blocking, close-on-exec) with file mode `mode`. A file
 * already at path is replaced only if it is a socket nothing listens on (a stale one from
 * a crash); anything else is refused with err naming why. Returns the fd or -errno. */
int sm70__unix_listen(const char *path, uint32_t mode, int backlog, struct sm70_err *err);

/* Whether a peer with this uid and primary gid, connected on fd, is in the lists: by uid,
 * by primary gid, or by a supplementary group (SO_PEERGROUPS). */
int sm70__peer_allowed(int fd, uid_t uid, gid_t gid, const uint32_t *uids, uint32_t n_uids,
		       const uint32_t *gids, uint32_t n_gids);

#endif
