/*
 * proto_check.h - renames shm_proto/sm70_validate.h's functions to library-internal sm70__
 * names (see proto_check.c for why). Include it before sm70_validate.h.
 */
#ifndef SM70_SDK_PROTO_CHECK_H
#define SM70_SDK_PROTO_CHECK_H

#define sm70_proto_validate_submit sm70__proto_validate_submit
#define sm70_proto_layout_init sm70__proto_layout_init
#define sm70_proto_layout_check sm70__proto_layout_check

#include "shm_proto/sm70_validate.h"

#endif
