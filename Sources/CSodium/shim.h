#ifndef MTMFS_CSODIUM_SHIM_H
#define MTMFS_CSODIUM_SHIM_H
#include <sodium.h>

/// Zeroes 64 KiB of the stack below the caller's frame: what the callee functions of a
/// secret-handling request (libsodium's block buffers, libc) left there. libsodium 1.0.19
/// has sodium_stackzero; Debian 12 ships 1.0.18.
__attribute__((noinline)) static void mtmfs_burn_stack(void) {
    unsigned char buffer[65536];
    sodium_memzero(buffer, sizeof buffer);
    __asm__ __volatile__("" : : "r"(buffer) : "memory");
}
#endif
