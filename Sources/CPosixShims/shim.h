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
#include <linux/stat.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <poll.h>
#include <sys/vfs.h>
#include <sys/ioctl.h>
#include <errno.h>

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

/* The soft limit of open descriptors raised to the hard one (a file server holds a
   descriptor per open large file of cache/). */
static inline int mtmfs_raise_open_file_limit(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
    if (limit.rlim_cur >= limit.rlim_max) return 0;
    limit.rlim_cur = limit.rlim_max;
    return setrlimit(RLIMIT_NOFILE, &limit);
}

/* flock(2): Swift sees `flock` as the struct of fcntl's record locks, not the function. */
static inline int mtmfs_flock(int fd, int operation) {
    return flock(fd, operation);
}

/* sync_file_range(2) with SYNC_FILE_RANGE_WRITE (glibc declares it only with _GNU_SOURCE):
   the writeback of a range started, not waited for. */
static inline int mtmfs_start_writeback(int fd, int64_t offset, int64_t length) {
    return (int)syscall(SYS_sync_file_range, fd, (long)offset, (long)length, 2U /* SYNC_FILE_RANGE_WRITE */);
}

/* syncfs(2): glibc declares it only with _GNU_SOURCE. */
static inline int mtmfs_syncfs(int fd) {
    return (int)syscall(SYS_syncfs, fd);
}

static inline int mtmfs_open(const char *path, int flags, unsigned int mode) {
    return open(path, flags, (mode_t)mode);
}

/* O_PATH (Linux; glibc defines it only with _GNU_SOURCE): a descriptor that names a file
   without opening it for reading or writing. */
static const int MTMFS_O_PATH = 010000000;

static inline int mtmfs_openat(int dirfd, const char *path, int flags, unsigned int mode) {
    return openat(dirfd, path, flags, (mode_t)mode);
}

/* The link count and type the kernel holds for `fd` (an O_PATH descriptor) as the lookup
   that found it left them, asking the file system nothing: statx(2) with AT_EMPTY_PATH,
   AT_SYMLINK_NOFOLLOW and AT_STATX_DONT_SYNC (glibc declares statx only under _GNU_SOURCE). */
static inline int mtmfs_cached_link_count(int fd, uint32_t *count, uint32_t *mode) {
    struct statx info;
    int result = (int)syscall(SYS_statx, fd, "", 0x1000 | 0x100 | 0x4000, STATX_TYPE | STATX_NLINK, &info);
    if (result == 0) {
        *count = info.stx_nlink;
        *mode = info.stx_mode;
    }
    return result;
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

/* A folder whose files come and go (a vault folder and its device folders): a file written
   and closed, moved in or out, removed; a folder made in it (IN_CREATE, for its watch). */
static inline int mtmfs_inotify_watch_folder(int fd, const char *path) {
    return inotify_add_watch(fd, path, IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE |
                                       IN_ONLYDIR);
}

static inline unsigned mtmfs_inotify_create_mask(void) { return IN_CREATE; }
static inline unsigned mtmfs_inotify_moved_to_mask(void) { return IN_MOVED_TO; }
static inline unsigned mtmfs_inotify_is_directory_mask(void) { return IN_ISDIR; }

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

/* PIDFD_GET_INFO (Linux 6.13, <linux/pidfd.h>; declared here for older headers): the
   parent of the process a pidfd names, or -1 with errno (ENOTTY: an older kernel). */
struct mtmfs_pidfd_info {
    uint64_t mask;
    uint64_t cgroupid;
    uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid, spare0;
};

static inline long long mtmfs_pidfd_parent(int pidfd) {
    struct mtmfs_pidfd_info info = {0};
    info.mask = 1; /* PIDFD_INFO_PID */
    unsigned long request = (3UL << 30) | ((unsigned long)sizeof(info) << 16) | (0xFFUL << 8) | 11; /* _IOWR(0xFF, 11, …) */
    if (ioctl(pidfd, request, &info) != 0) return -1;
    if (!(info.mask & 1)) { errno = ENOTTY; return -1; }
    return (long long)info.ppid;
}

/* statfs(2)'s file system type (f_type) of a path; -1 on failure. */
static inline long long mtmfs_statfs_type(const char *path) {
    struct statfs fs;
    return statfs(path, &fs) == 0 ? (long long)fs.f_type : -1;
}

/* PROCMAP_QUERY (Linux 6.11, <linux/fs.h>; declared here for older headers): one
   executable mapping of a process at or after an address, with its file's device, inode
   and path, asked through an open /proc/PID/maps without rendering the whole text. */
struct mtmfs_procmap_query {
    uint64_t size;
    uint64_t query_flags;
    uint64_t query_addr;
    uint64_t vma_start;
    uint64_t vma_end;
    uint64_t vma_flags;
    uint64_t vma_page_size;
    uint64_t vma_offset;
    uint64_t inode;
    uint32_t dev_major;
    uint32_t dev_minor;
    uint32_t vma_name_size;
    uint32_t build_id_size;
    uint64_t vma_name_addr;
    uint64_t build_id_addr;
};

/* The next executable mapping at or after `*address`: 1 and its end in `*address`, 0
   when there is none, -1 with errno (ENOTTY: a kernel without the query). `name` gets
   the mapping's path, NUL-terminated ("" for anonymous code; `*name_length` counts the
   NUL), with its inode and device. */
static inline int mtmfs_next_code_mapping(int maps_fd, uint64_t *address, char *name, uint32_t name_capacity,
                                          uint32_t *name_length, uint64_t *inode, uint32_t *major, uint32_t *minor) {
    struct mtmfs_procmap_query query = {0};
    query.size = sizeof(query);
    query.query_flags = 0x10 /* COVERING_OR_NEXT_VMA */ | 0x04 /* VMA_EXECUTABLE */;
    query.query_addr = *address;
    query.vma_name_size = name_capacity;
    query.vma_name_addr = (uint64_t)(uintptr_t)name;
    unsigned long request = (3UL << 30) | ((unsigned long)sizeof(query) << 16) | ('f' << 8) | 17; /* _IOWR('f', 17, …) */
    if (ioctl(maps_fd, request, &query) != 0) {
        return errno == ENOENT ? 0 : -1;
    }
    *address = query.vma_end;
    *name_length = query.vma_name_size;
    if (query.vma_name_size == 0 && name_capacity > 0) name[0] = 0;
    *inode = query.inode;
    *major = query.dev_major;
    *minor = query.dev_minor;
    return 1;
}

/* Gives the heap's free pages back to the system (glibc keeps them otherwise). */
static inline int mtmfs_malloc_trim(void) {
    return malloc_trim(0);
}

/* At most `count` malloc arenas (glibc makes one per thread that contends, up to 8 per core). */
static inline int mtmfs_limit_malloc_arenas(int count) {
    return mallopt(M_ARENA_MAX, count);
}

#endif

/* libFuzzer's driver, present only in binaries linked with -sanitize=fuzzer (mtmfs-fuzz
   built by mount-helpers/fuzz); referenced only under `#if FUZZING`. */
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
