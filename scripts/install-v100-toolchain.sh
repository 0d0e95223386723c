#!/bin/sh
# Installs the toolchain of a V100 (sm_70) build on Debian 12: CUDA 11.8 from Debian's
# non-free component (nvidia-cuda-toolkit, with cuBLAS 11), the last CUDA release that
# targets sm_70, and clang-14 as its host compiler (CUDA 11.8 refuses Debian's gcc 12).
# Debian has no NCCL package: the build leaves the NCCL communicator out and says so.
# Adds /etc/apt/sources.list.d/sm70-nonfree.sources when non-free is not enabled yet.
# Safe to run again. Needs root (or sudo). About 1.6 GB to download.
set -eu
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if dpkg-query -W -f='${Status}' nvidia-cuda-toolkit 2>/dev/null | grep -q "install ok installed" &&
	command -v clang-14 >/dev/null; then
	exit 0
fi
if ! grep -rqs "non-free" /etc/apt/sources.list /etc/apt/sources.list.d/; then
	$SUDO tee /etc/apt/sources.list.d/sm70-nonfree.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
echo "install-v100-toolchain: installing nvidia-cuda-toolkit (CUDA 11.8) and clang-14" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
	nvidia-cuda-toolkit clang-14 >/dev/null
