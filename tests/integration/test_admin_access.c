/*
 * test_admin_access - who may use sm70d's admin socket, and what sm70ctl says when it cannot:
 * a uid in admin_allowed_uids reads (status) but may not drain; admin_socket_group gives the
 * socket file its group; sm70ctl's exit codes tell "not running" (3), "permission denied" (5,
 * by the file's mode or by the daemon's lists) and "not an sm70 admin socket" (6: a regular
 * file, a stream socket, sm70d's client socket) apart.
 *
 * Switching uids needs root: as another user the parts that do are skipped (said so).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/integration/daemon_util.h"

#define READER_UID 65534 /* nobody: may read */
#define STRANGER_UID 65533 /* in no list */
#define SOCKET_GID 65534 /* nogroup */

static struct sm70t_daemon T;
static char admin_path[108];

static const char config[] =
	"{\"admin_socket_mode\": \"0666\", \"admin_socket_group\": 65534,"
	" \"admin_allowed_uids\": [65534], \"admin_control_uids\": [0]}";

/* Runs sm70ctl args as uid (-1: ourselves); its stderr goes to err (size bytes). Returns
 * its exit status, or -1. */
static int ctl_as(int uid, const char *args, char *err, size_t size)
{
	const char *b = getenv("SM70_BUILD");
	char bin[256], log[160], cmd[512];
	int st, fd;
	pid_t pid;
	ssize_t n;

	snprintf(bin, sizeof(bin), "%s/bin/sm70ctl", b && *b ? b : "build");
	snprintf(log, sizeof(log), "%s/ctl.err", T.dir);
	snprintf(cmd, sizeof(cmd), "exec %s %s >/dev/null", bin, args);
	/* opened here: the other uid could not create it in the test's directory */
	fd = open(log, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		dup2(fd, 2);
		if (uid >= 0 && (setgroups(0, NULL) || setgid((gid_t)uid) || setuid((uid_t)uid)))
			_exit(126);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	err[0] = '\0';
	if (pid < 0 || waitpid(pid, &st, 0) != pid) {
		close(fd);
		return -1;
	}
	n = pread(fd, err, size - 1, 0);
	err[n > 0 ? n : 0] = '\0';
	close(fd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int setup(void **state)
{
	(void)state;
	if (sm70t_daemon_start(&T, config, NULL))
		return -1;
	snprintf(admin_path, sizeof(admin_path), "%s.admin", T.sock);
	/* the temp dir is 0700: let the other uids reach the sockets in it */
	chmod(T.dir, 0755);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	sm70t_daemon_stop(&T, SIGTERM, 10000);
	sm70t_daemon_cleanup(&T);
	return 0;
}

static void test_read_and_control(void **state)
{
	struct stat st;
	char args[200], err[1024];
	int ret;

	(void)state;
	assert_int_equal(stat(admin_path, &st), 0);
	assert_int_equal(st.st_gid, SOCKET_GID);
	assert_int_equal(st.st_mode & 0777, 0666);
	printf("admin socket %s: group %u, mode %04o\n", admin_path, (unsigned)st.st_gid,
	       (unsigned)(st.st_mode & 0777));
	if (geteuid() != 0) {
		printf("not root: the reader/stranger uid checks are skipped\n");
		skip();
	}
	snprintf(args, sizeof(args), "--socket %s status", admin_path);
	ret = ctl_as(READER_UID, args, err, sizeof(err));
	if (ret == 126 || ret == 127) {
		printf("uid %d cannot run sm70ctl from this build directory: skipped\n",
		       READER_UID);
		skip();
	}
	assert_int_equal(ret, 0);
	snprintf(args, sizeof(args), "--socket %s health ready", admin_path);
	assert_int_equal(ctl_as(READER_UID, args, err, sizeof(err)), 0);
	snprintf(args, sizeof(args), "--socket %s drain", admin_path);
	assert_int_equal(ctl_as(READER_UID, args, err, sizeof(err)), 5);
	assert_non_null(strstr(err, "permission denied"));
	assert_non_null(strstr(err, "admin_control_uids"));
	printf("reader uid %d: status 0, drain 5: %s", READER_UID, err);
	snprintf(args, sizeof(args), "--socket %s status", admin_path);
	assert_int_equal(ctl_as(STRANGER_UID, args, err, sizeof(err)), 5);
	assert_non_null(strstr(err, "denied"));
	printf("stranger uid %d: status 5: %s", STRANGER_UID, err);
	/* The client socket is 0660 root's: the file itself keeps the stranger out. */
	snprintf(args, sizeof(args), "--socket %s status", T.sock);
	assert_int_equal(ctl_as(STRANGER_UID, args, err, sizeof(err)), 5);
	assert_non_null(strstr(err, "does not let this user in"));
	printf("stranger on a 0660 socket file: 5: %s", err);
	/* root may drain (admin_control_uids) */
	snprintf(args, sizeof(args), "--socket %s drain", admin_path);
	assert_int_equal(ctl_as(-1, args, err, sizeof(err)), 0);
}

static void test_not_admin_and_not_running(void **state)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char args[200], err[1024], path[100];
	int fd;

	(void)state;
	snprintf(args, sizeof(args), "--socket %s/none status", T.dir);
	assert_int_equal(ctl_as(-1, args, err, sizeof(err)), 3);
	assert_non_null(strstr(err, "not running"));
	snprintf(args, sizeof(args), "--socket %s status", T.log); /* a regular file */
	assert_int_equal(ctl_as(-1, args, err, sizeof(err)), 6);
	assert_non_null(strstr(err, "not a socket"));
	snprintf(path, sizeof(path), "%s/stream.sock", T.dir);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 4), 0);
	snprintf(args, sizeof(args), "--socket %s status", path);
	assert_int_equal(ctl_as(-1, args, err, sizeof(err)), 6);
	close(fd);
	unlink(path);
	snprintf(args, sizeof(args), "--socket %s status", T.sock); /* the client socket */
	assert_int_equal(ctl_as(-1, args, err, sizeof(err)), 6);
	assert_non_null(strstr(err, "client protocol"));
	printf("no file 3, regular file 6, stream socket 6, client socket 6: %s", err);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_and_control),
		cmocka_unit_test(test_not_admin_and_not_running),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
