#ifndef MTMFS_CPOSIXSHIMS_SHIM_H
#define MTMFS_CPOSIXSHIMS_SHIM_H
// Variadic libc functions re-exported as plain ones, which Swift can call.
#include <sys/prctl.h>
#include <sys/resource.h>
#include <syslog.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <malloc.h>
#include <sys/file.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <poll.h>
#include <sys/vfs.h>

static inline int mtmfs_prctl_set_dumpable(int dumpable) {
    return prctl(PR_SET_DUMPABLE, (unsigned long)dumpable, 0UL, 0UL, 0UL);
}

static inline void mtmfs_syslog(int priority, const char *message) {
    syslog(priority, "%s", message);
}

static inline int mtmfs_disable_core_files(void) {
    struct rlimit limit = { 0, 0 };
    return setrlimit(RLIMIT_CORE, &limit);
}

/* flock(2): Swift sees `flock` as the struct of fcntl's record locks, not the function. */
static inline int mtmfs_flock(int fd, int operation) {
    return flock(fd, operation);
}

static inline int mtmfs_open(const char *path, int flags, unsigned int mode) {
    return open(path, flags, (mode_t)mode);
}

static inline int mtmfs_openat(int dirfd, const char *path, int flags, unsigned int mode) {
    return openat(dirfd, path, flags, (mode_t)mode);
}

/* fallocate(2) and copy_file_range(2), which Glibc declares only under _GNU_SOURCE. */
static inline int mtmfs_fallocate(int fd, int mode, int64_t offset, int64_t length) {
    return (int)syscall(SYS_fallocate, fd, mode, (long)offset, (long)length);
}

static inline long mtmfs_copy_file_range(int in, int64_t *in_offset, int out, int64_t *out_offset, size_t length) {
    return syscall(SYS_copy_file_range, in, in_offset, out, out_offset, length, 0U);
}
/* eventfd(2) and inotify(7), with their flags (macros Swift does not import). */
static inline int mtmfs_eventfd(void) {
    return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

static inline int mtmfs_inotify_init(void) {
    return inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
}

/* Every event after which a file of this name holds something else: written and closed,
   renamed or moved in or out, removed (not a creation: the file is empty until its writer
   closes it), and the directory itself gone. */
static inline int mtmfs_inotify_watch_directory(int fd, const char *path) {
    return inotify_add_watch(fd, path, IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE |
                                       IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR);
}

/* pipe2(2) with O_CLOEXEC (hidden behind _GNU_SOURCE): no window in which a child spawned
   by another thread inherits the descriptors. */
static inline int mtmfs_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC);
}

/* pidfd_open(2): a descriptor that names one process for good (no pid reuse under it). */
static inline int mtmfs_pidfd_open(int pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0U);
#else
    return (int)syscall(434, pid, 0U);
#endif
}

/* statfs(2)'s file system type (f_type) of a path or a descriptor; -1 on failure. */
static inline long long mtmfs_statfs_type(const char *path) {
    struct statfs fs;
    return statfs(path, &fs) == 0 ? (long long)fs.f_type : -1;
}

static inline long long mtmfs_fstatfs_type(int fd) {
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 ? (long long)fs.f_type : -1;
}

/* Gives the heap's free pages back to the system (glibc keeps them otherwise). */
static inline int mtmfs_malloc_trim(void) {
    return malloc_trim(0);
}

#endif

/* libFuzzer's driver, present only in binaries linked with -sanitize=fuzzer (mtmfs-fuzz
   built by mount-helpers/fuzz); referenced only under `#if FUZZING`. */
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
