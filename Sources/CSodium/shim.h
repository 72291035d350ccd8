#ifndef MTMFS_CSODIUM_SHIM_H
#define MTMFS_CSODIUM_SHIM_H
#include <sodium.h>
#endif
