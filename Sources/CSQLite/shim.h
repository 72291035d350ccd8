#ifndef MTMFS_CSQLITE_SHIM_H
#define MTMFS_CSQLITE_SHIM_H
#include <sqlite3.h>
#endif
