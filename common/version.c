/*
 * version.c - the product version (see version.h). SConstruct compiles this file alone
 * with -DSM70_VERSION and -DSM70_GIT_DESCRIBE and links it into every program.
 */
#include "common/version.h"

#ifndef SM70_VERSION
#error "SM70_VERSION is set by SConstruct"
#endif
#ifndef SM70_GIT_DESCRIBE
#define SM70_GIT_DESCRIBE "unknown"
#endif

const char *sm70_version(void)
{
	return SM70_VERSION;
}

const char *sm70_git_describe(void)
{
	return SM70_GIT_DESCRIBE;
}

const char *sm70_version_text(void)
{
	return SM70_VERSION " (git " SM70_GIT_DESCRIBE ")";
}

void sm70_print_version(FILE *f, const char *prog)
{
	fprintf(f, "%s %s\n", prog, sm70_version_text());
}
