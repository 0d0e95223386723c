/*
 * build_info.h - the CUDA release this sm70d's CUDA backend was compiled with ("none"
 * without it), for sm70_build_info. SConstruct generates its definition
 * (BUILD_DIR/gen/build_info.c). The version and git description are common/version.h's.
 */
#ifndef SM70_DAEMON_BUILD_INFO_H
#define SM70_DAEMON_BUILD_INFO_H

extern const char sm70__build_cuda[];

#endif
