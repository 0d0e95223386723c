/*
 * build_info.h - what this sm70d was built from, for sm70_build_info and `status`:
 * the release (the package version), the git revision (SM70_GIT_REV, or `git rev-parse`
 * with "-dirty" for uncommitted changes, or "unknown"), and the CUDA release the CUDA
 * backend was compiled with ("none" without it). SConstruct generates their definitions
 * (BUILD_DIR/gen/build_info.c), so a new commit recompiles one file.
 */
#ifndef SM70_DAEMON_BUILD_INFO_H
#define SM70_DAEMON_BUILD_INFO_H

extern const char sm70__build_version[];
extern const char sm70__build_git[];
extern const char sm70__build_cuda[];

#endif
