#ifndef MTMFS_CFUSE_SHIM_H
#define MTMFS_CFUSE_SHIM_H
// The API level must be set here: a cSettings define does not reach the Swift importer.
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#endif
