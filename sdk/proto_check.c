/*
 * proto_check.c - the library's private copy of shm_proto/sm70_validate.c.
 *
 * The build links libsm70client from the sdk folder alone (with --no-undefined), while the
 * validator lives in the daemon's core library. Rather than duplicate the segment-header
 * check, this file compiles the very same source under sm70__ names, so the shared library
 * is self-contained and an application that also links the core library (the integration
 * tests do) gets no duplicate symbols. Hidden visibility keeps these out of the ABI.
 * Non-goals: none of its own; see sm70_validate.h for the contract.
 */
#include "sdk/proto_check.h"

#include "shm_proto/sm70_validate.c"
