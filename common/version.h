/*
 * version.h - the product version every sm70 binary reports: one line "NAME VERSION (git
 * DESCRIBE)" for --version, and the same text without the name for sm70ctl status.
 *
 * The values come from the build (SConstruct's SM70_VERSION and `git describe` of the
 * checkout, or "unknown" outside one); only common/version.c is compiled with them, so a
 * new commit rebuilds one object, not the tree.
 */
#ifndef SM70_COMMON_VERSION_H
#define SM70_COMMON_VERSION_H

#include <stdio.h>

/* "0.2.0": the release, as in debian/changelog. */
const char *sm70_version(void);

/* `git describe --tags --always --dirty` of the tree it was built from (e.g. "b90951f" or
 * "v0.2.0-4-gb90951f-dirty"), or "unknown" when it was not built from a git checkout. */
const char *sm70_git_describe(void);

/* "0.2.0 (git b90951f)": what sm70ctl status shows. Static storage. */
const char *sm70_version_text(void);

/* Writes "prog 0.2.0 (git b90951f)\n" to f (--version). */
void sm70_print_version(FILE *f, const char *prog);

#endif
