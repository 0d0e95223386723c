#!/bin/sh
# systemd-container.sh - boots the host's own systemd as PID 1 of a throw-away container, so
# that the packaged units can be started the way systemd starts them (socket activation,
# the sandbox, Type=notify) on a machine whose PID 1 is not systemd (CI, a VM's agent).
#
#   tests/packaging/systemd-container.sh boot DIR [UNIT]   boot; prints the PID 1 (host pid)
#   tests/packaging/systemd-container.sh run DIR CMD...    run CMD inside (root, its /)
#   tests/packaging/systemd-container.sh stop DIR          kill it and clean up DIR
#
# The container is the host's root as the lower layer of an overlay whose upper layer is a
# tmpfs in DIR: it sees every package installed on the host, and whatever it writes (the
# journal, /var/lib/sm70, a test config) vanishes with it. It gets new PID, mount and cgroup
# namespaces, its own /proc, /sys, a cgroup2 file system rooted in a child cgroup of the
# host's, the host's /dev (bind), an empty /run, and boots UNIT (default sm70-check.target,
# which wants sockets.target: what the packages enabled there). Host networking, users and
# the kernel are shared. systemd runs with container=sm70-check, so units conditioned on
# ConditionVirtualization=!container stay off, as in systemd-nspawn.
#
# Needs root with CAP_SYS_ADMIN (unshare, mount, pivot_root), overlayfs and cgroup2: a VM or
# a privileged container. `boot` exits 1 with the reason when the machine does not allow it.
# Non-goals: isolation from the host (this is a test fixture, not a sandbox), networking,
# user namespaces.
set -u

cmd=${1:-}
DIR=${2:-}
[ -n "$cmd" ] && [ -n "$DIR" ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

die() { echo "systemd-container: $*" >&2; exit 1; }

# The host's cgroup2 mount point (on a hybrid host the "unified" one).
cgroup2_root() {
	awk '$9 == "cgroup2" { print $5; exit }' /proc/self/mountinfo
}

pid1() { cat "$DIR/pid" 2>/dev/null; }

# Inside the new namespaces (unshare execs this with "inner DIR UNIT"): build the root,
# pivot into it, exec systemd. PID 1 of the new PID namespace is this shell, then systemd.
inner() {
	unit=$1
	R=$DIR/root
	mount -t tmpfs -o mode=0755 sm70-check-upper "$DIR/ovl" || exit 1
	mkdir -p "$DIR/ovl/upper" "$DIR/ovl/work" "$R"
	mount -t overlay sm70-check-root \
		-o "lowerdir=/,upperdir=$DIR/ovl/upper,workdir=$DIR/ovl/work" "$R" || exit 1
	# The kernel is the host's: its tunables and sysfs are read-only in here (as
	# systemd-nspawn makes them), so the container's boot cannot change the host's.
	mount -t proc proc "$R/proc" &&
	mount --bind "$R/proc/sys" "$R/proc/sys" &&
	mount -o remount,bind,ro "$R/proc/sys" &&
	mount -t sysfs -o ro sysfs "$R/sys" &&
	mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup" &&
	mount --rbind /dev "$R/dev" &&
	mount -t tmpfs -o mode=0755,nosuid,nodev run "$R/run" || exit 1
	mkdir -p "$R/run/systemd/system"
	# Units that would change the shared kernel (modules, binfmt, sysctl) are masked.
	for u in systemd-modules-load.service systemd-binfmt.service systemd-sysctl.service \
		proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount; do
		ln -s /dev/null "$R/run/systemd/system/$u"
	done
	if [ "$unit" = sm70-check.target ]; then
		cat >"$R/run/systemd/system/sm70-check.target" <<-EOF
		[Unit]
		Description=sm70 package check (boots what sockets.target wants)
		Wants=sockets.target
		After=sockets.target
		EOF
	fi
	# /tmp of the host would hold the overlay's upper layer (DIR) itself: give the
	# container an empty one, as a booted machine has.
	mount -t tmpfs -o mode=1777 tmp "$R/tmp" || exit 1
	cd "$R" || exit 1
	mkdir -p .sm70-old-root
	pivot_root . .sm70-old-root || exit 1
	umount -l /.sm70-old-root
	rmdir /.sm70-old-root 2>/dev/null
	export container=sm70-check
	exec /lib/systemd/systemd --unit="$unit" </dev/null >/dev/null 2>&1
}

boot() {
	unit=${1:-sm70-check.target}
	[ "$(id -u)" -eq 0 ] || die "needs root"
	command -v unshare >/dev/null || die "no unshare (util-linux)"
	[ -x /lib/systemd/systemd ] || die "no /lib/systemd/systemd"
	grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null
	grep -qw overlay /proc/filesystems || die "the kernel has no overlay file system"
	cg=$(cgroup2_root)
	[ -n "$cg" ] || die "no cgroup2 file system is mounted on the host"
	mkdir -p "$DIR/ovl" || die "cannot make $DIR"
	cgdir=$cg/sm70-check.$$
	mkdir "$cgdir" 2>/dev/null || die "cannot create the cgroup $cgdir"
	echo "$cgdir" >"$DIR/cgroup"
	# The child moves itself into the new cgroup, then the cgroup namespace rooted there is
	# made; -f forks so that systemd becomes PID 1 of the new PID namespace.
	setsid sh -c 'echo $$ >"$1/cgroup.procs" && exec unshare --pid --mount --cgroup --fork \
		--propagation private "$2" inner "$3" "$4"' sh "$cgdir" "$0" "$DIR" "$unit" \
		>"$DIR/boot.log" 2>&1 &
	outer=$! # setsid and sh exec, so this is unshare; its one child is the PID 1
	i=0
	while [ $i -lt 100 ]; do
		p=$(pgrep -P "$outer" | head -n 1)
		if [ -n "$p" ] && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = systemd ]; then
			echo "$p" >"$DIR/pid"
			break
		fi
		sleep 0.1; i=$((i + 1))
	done
	[ -s "$DIR/pid" ] || { cat "$DIR/boot.log" >&2; die "systemd did not start"; }
	# Wait for the boot to settle (running, or degraded when some host unit fails here).
	i=0
	while [ $i -lt 300 ]; do
		s=$(run systemctl is-system-running 2>/dev/null)
		case $s in
		running | degraded) pid1; return 0 ;;
		esac
		sleep 0.1; i=$((i + 1))
	done
	die "the container's systemd did not finish booting (state '$s')"
}

run() {
	p=$(pid1)
	[ -n "$p" ] || die "not booted ($DIR/pid missing)"
	nsenter --target "$p" --mount --pid --root --wd -- "$@"
}

stop() {
	p=$(pid1)
	[ -n "$p" ] && kill -KILL "$p" 2>/dev/null
	i=0
	while [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	if [ -s "$DIR/cgroup" ]; then
		cgdir=$(cat "$DIR/cgroup")
		# Children first: systemd made init.scope, system.slice/... below it.
		find "$cgdir" -depth -type d -exec rmdir {} \; 2>/dev/null
	fi
	rm -rf "$DIR"
}

case $cmd in
inner) shift 2; inner "$@" ;;
boot) shift 2; boot "$@" ;;
run) shift 2; run "$@" ;;
stop) stop ;;
*) die "unknown command '$cmd'" ;;
esac
