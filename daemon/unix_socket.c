/* unix_socket.c - listener binding and peer access shared by both sockets; see the header. */
#include "daemon/unix_socket.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int sm70__unix_listen(const char *path, uint32_t mode, int backlog, struct sm70_err *err)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, probe, ret;

	if (strlen(path) >= sizeof(a.sun_path))
		return sm70_errf(err, -ENAMETOOLONG, "%s: longer than a socket path may be",
				 path);
	memcpy(a.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sm70_errf(err, -errno, "socket(AF_UNIX, SOCK_SEQPACKET): %s",
				 strerror(errno));
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		goto bound;
	ret = -errno;
	if (ret != -EADDRINUSE) {
		sm70_errf(err, ret, "bind %s: %s", path, strerror(-ret));
		goto fail;
	}
	/* Something is there. Only a socket that refuses connections is stale. */
	if (lstat(path, &st) || !S_ISSOCK(st.st_mode)) {
		ret = sm70_errf(err, -EEXIST, "%s exists and is not a socket; not touching it",
				path);
		goto fail;
	}
	probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (probe < 0) {
		ret = sm70_errf(err, -errno, "socket: %s", strerror(errno));
		goto fail;
	}
	ret = connect(probe, (struct sockaddr *)&a, sizeof(a)) ? -errno : 0;
	close(probe);
	if (ret != -ECONNREFUSED) {
		ret = sm70_errf(err, -EADDRINUSE, "%s: another process listens on it (is sm70d "
				"already running?)", path);
		goto fail;
	}
	if (unlink(path) && errno != ENOENT) {
		ret = sm70_errf(err, -errno, "unlink %s: %s", path, strerror(errno));
		goto fail;
	}
	if (bind(fd, (struct sockaddr *)&a, sizeof(a))) {
		ret = sm70_errf(err, -errno, "bind %s: %s", path, strerror(errno));
		goto fail;
	}
bound:
	if (chmod(path, mode)) {
		ret = sm70_errf(err, -errno, "chmod %s: %s", path, strerror(errno));
		unlink(path);
		goto fail;
	}
	if (listen(fd, backlog)) {
		ret = sm70_errf(err, -errno, "listen %s: %s", path, strerror(errno));
		unlink(path);
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return ret;
}

static int id_in(uint32_t id, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] == id)
			return 1;
	return 0;
}

int sm70__peer_allowed(int fd, uid_t uid, gid_t gid, const uint32_t *uids, uint32_t n_uids,
		       const uint32_t *gids, uint32_t n_gids)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);

	if (id_in((uint32_t)uid, uids, n_uids) || id_in((uint32_t)gid, gids, n_gids))
		return 1;
	if (!n_gids)
		return 0;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len))
		return 0; /* too many groups or an old kernel: the primary gid decided */
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (id_in((uint32_t)groups[i], gids, n_gids))
			return 1;
	return 0;
}
