/*
 * pam_mtmfs.so — unlocks a user's mtmfs mount with the password they log in with
 * (SPEC §3, mtmfs(1) "UNLOCK AT LOGIN"). Plain C against libpam and libc alone, for it
 * runs inside login programs; mount-helpers/build-pam builds it (not SwiftPM, whose
 * linking would bring the Swift runtime into every login).
 *
 *   auth      optional  pam_mtmfs.so            keeps the password typed (after pam_unix)
 *   session   optional  pam_mtmfs.so [wait=S]   unlocks the user's mount with it
 *   password  optional  pam_mtmfs.so            a changed password rewrites the login slot
 *
 * Options: mtmfs=PATH (default /usr/bin/mtmfs), wait=SECONDS (how long the session's
 * unlock waits for the mount to come up, default 10, at most 120), debug.
 *
 * What it never does: fail a login or a password change (every entry point answers
 * PAM_IGNORE or PAM_SUCCESS), log or pass the password anywhere but a pipe, run code of
 * the user's as root. The password is copied into memory of its own (mlock'd, kept out of
 * core dumps), zeroed when the PAM handle ends. Everything that reads the user's files
 * (mtmfs) runs as the user: a child that drops every privilege first (groups, gid, uid;
 * checked that it cannot regain them), with an environment of its own (HOME, USER,
 * LOGNAME, PATH, XDG_RUNTIME_DIR, LANG=C.UTF-8) and the password on its standard input.
 * The session's child is detached (double fork) so that the login does not wait for the
 * mount; it ends when the mount answered or after wait= seconds, leaving nothing running.
 */
#define _GNU_SOURCE
#define PAM_SM_AUTH
#define PAM_SM_SESSION
#define PAM_SM_PASSWORD
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>
#include <security/pam_ext.h>
#include <security/pam_modules.h>

/* Only the pam_sm_* entry points leave the module (built with -fvisibility=hidden). */
#define EXPORT __attribute__((visibility("default")))

#define DATA_NAME "pam_mtmfs_password"
#define MAX_SECRET 4096

struct options {
    const char *mtmfs;
    int wait;
    int debug;
};

static void parse_options(pam_handle_t *pamh, int argc, const char **argv, struct options *options) {
    options->mtmfs = "/usr/bin/mtmfs";
    options->wait = 10;
    options->debug = 0;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "mtmfs=", 6) == 0 && argv[i][6] == '/') {
            options->mtmfs = argv[i] + 6;
        } else if (strncmp(argv[i], "wait=", 5) == 0) {
            char *end = NULL;
            long value = strtol(argv[i] + 5, &end, 10);
            if (end && *end == '\0' && value >= 0 && value <= 120) options->wait = (int)value;
            else pam_syslog(pamh, LOG_WARNING, "wait= takes 0 to 120 seconds: %s ignored", argv[i]);
        } else if (strcmp(argv[i], "debug") == 0) {
            options->debug = 1;
        } else {
            pam_syslog(pamh, LOG_WARNING, "unknown option %s ignored", argv[i]);
        }
    }
}

/* A copy of a secret in memory of its own: page-aligned, locked, out of core dumps. */
struct secret {
    size_t size;     /* of the mapping */
    size_t length;   /* of the text */
    char *text;
};

static struct secret *secret_copy(const char *text) {
    size_t length = strnlen(text, MAX_SECRET + 1);
    if (length == 0 || length > MAX_SECRET) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    size_t size = ((sizeof(struct secret) + length + 1 + (size_t)page - 1) / (size_t)page) * (size_t)page;
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return NULL;
    (void)mlock(memory, size);
    (void)madvise(memory, size, MADV_DONTDUMP);
    struct secret *secret = memory;
    secret->size = size;
    secret->length = length;
    secret->text = (char *)memory + sizeof(struct secret);
    memcpy(secret->text, text, length);
    secret->text[length] = '\0';
    return secret;
}

static void secret_free(struct secret *secret) {
    if (!secret) return;
    size_t size = secret->size;
    explicit_bzero(secret, size);
    munlock(secret, size);
    munmap(secret, size);
}

static void cleanup_secret(pam_handle_t *pamh, void *data, int error_status) {
    (void)pamh;
    (void)error_status;
    secret_free(data);
}

/* The user's passwd entry (uid, gid, home), copied. */
struct user {
    uid_t uid;
    gid_t gid;
    char name[256];
    char home[4096];
};

static int find_user(pam_handle_t *pamh, struct user *user) {
    const char *name = NULL;
    if (pam_get_user(pamh, &name, NULL) != PAM_SUCCESS || !name || !*name) return -1;
    struct passwd entry, *found = NULL;
    char buffer[16384];
    if (getpwnam_r(name, &entry, buffer, sizeof buffer, &found) != 0 || !found) return -1;
    if (found->pw_uid == 0) return -1; /* root's mounts are not unlocked this way */
    if (snprintf(user->name, sizeof user->name, "%s", found->pw_name) >= (int)sizeof user->name) return -1;
    if (snprintf(user->home, sizeof user->home, "%s", found->pw_dir) >= (int)sizeof user->home) return -1;
    user->uid = found->pw_uid;
    user->gid = found->pw_gid;
    return 0;
}

/* In a child: becomes the user for good, or exits. */
static void become(const struct user *user) {
    if (initgroups(user->name, user->gid) != 0 && setgroups(0, NULL) != 0) _exit(126);
    if (setresgid(user->gid, user->gid, user->gid) != 0) _exit(126);
    if (setresuid(user->uid, user->uid, user->uid) != 0) _exit(126);
    if (setuid(0) == 0 || seteuid(0) == 0) _exit(126); /* never back to root */
}

/* In a child: execs mtmfs with `arguments` as the user, standard input from `input`,
   output to /dev/null, an environment of its own. Never returns. */
static void run_mtmfs(const struct options *options, const struct user *user, int input, char *const arguments[]) {
    become(user);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(input, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(126);
    /* Nothing else of the login program's stays open. */
    struct rlimit limit;
    int last = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < 65536 ? (int)limit.rlim_cur : 65536;
    for (int fd = 3; fd < last; fd++) close(fd);
    if (chdir(user->home) != 0 && chdir("/") != 0) _exit(126);
    char home[4200], name[300], logname[300], runtime[64];
    snprintf(home, sizeof home, "HOME=%s", user->home);
    snprintf(name, sizeof name, "USER=%s", user->name);
    snprintf(logname, sizeof logname, "LOGNAME=%s", user->name);
    snprintf(runtime, sizeof runtime, "XDG_RUNTIME_DIR=/run/user/%u", (unsigned)user->uid);
    char *environment[] = {home, name, logname, runtime, "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", NULL};
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int signal_number = 1; signal_number < NSIG; signal_number++) signal(signal_number, SIG_DFL);
    execve(options->mtmfs, arguments, environment);
    _exit(127);
}

/* Writes all of `text` to `fd`; 0 on success. */
static int write_all(int fd, const char *text, size_t length) {
    while (length > 0) {
        ssize_t written = write(fd, text, length);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) return -1;
        text += written;
        length -= (size_t)written;
    }
    return 0;
}

/* Waits for `pid` at most `seconds`; kills it after. Its exit status, or -1. */
static int wait_bounded(pid_t pid, int seconds) {
    struct timespec step = {0, 20 * 1000 * 1000};
    for (long i = 0; i <= (long)seconds * 50; i++) {
        int status = 0;
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (done < 0 && errno != EINTR) return -1;
        nanosleep(&step, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* ---- auth: keep the password ---- */

EXPORT PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options options;
    parse_options(pamh, argc, argv, &options);
    const void *item = NULL;
    /* The password the stack asked for (pam_unix before this module); never asked here. */
    if (pam_get_item(pamh, PAM_AUTHTOK, &item) != PAM_SUCCESS || !item) return PAM_IGNORE;
    struct secret *secret = secret_copy(item);
    if (!secret) return PAM_IGNORE;
    if (pam_set_data(pamh, DATA_NAME, secret, cleanup_secret) != PAM_SUCCESS) {
        secret_free(secret);
        return PAM_IGNORE;
    }
    if (options.debug) pam_syslog(pamh, LOG_DEBUG, "kept the password for the session");
    return PAM_IGNORE;
}

EXPORT PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE;
}

/* ---- session: unlock the user's mount ---- */

EXPORT PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options options;
    parse_options(pamh, argc, argv, &options);
    const void *data = NULL;
    if (pam_get_data(pamh, DATA_NAME, &data) != PAM_SUCCESS || !data) return PAM_IGNORE;
    const struct secret *secret = data;
    struct user user;
    if (find_user(pamh, &user) != 0) return PAM_IGNORE;
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return PAM_IGNORE;
    /* The password goes into the pipe before any child exists (a pipe holds far more than
       MAX_SECRET): the line mtmfs reads. Written while this process holds the reading end,
       it can never raise SIGPIPE in the login program. */
    if (write_all(pipe_fds[1], secret->text, secret->length) != 0 || write_all(pipe_fds[1], "\n", 1) != 0) {
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        return PAM_IGNORE;
    }
    char wait_text[16];
    snprintf(wait_text, sizeof wait_text, "%d", options.wait);
    char *arguments[] = {"mtmfs", "unlock", "--login", "--wait", wait_text, NULL};
    /* Detached: the first child forks the one that runs mtmfs and exits at once, so the
       login goes on; that one is reparented and ends by itself. */
    pid_t first = fork();
    if (first < 0) {
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        return PAM_IGNORE;
    }
    if (first == 0) {
        setsid();
        pid_t second = fork();
        if (second != 0) _exit(second < 0 ? 1 : 0);
        close(pipe_fds[1]); /* (its only reader must see the end of the password) */
        run_mtmfs(&options, &user, pipe_fds[0], arguments);
    }
    /* This process's ends close: the child's input ends after the password. */
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    waitpid(first, NULL, 0);
    if (options.debug) pam_syslog(pamh, LOG_DEBUG, "unlocking %s's mount", user.name);
    return PAM_IGNORE;
}

EXPORT PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE;
}

/* ---- password: keep the login slot in step ---- */

EXPORT PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    struct options options;
    parse_options(pamh, argc, argv, &options);
    if (flags & PAM_PRELIM_CHECK) return PAM_IGNORE;
    if (!(flags & PAM_UPDATE_AUTHTOK)) return PAM_IGNORE;
    const void *old = NULL, *new = NULL;
    if (pam_get_item(pamh, PAM_OLDAUTHTOK, &old) != PAM_SUCCESS || !old ||
        pam_get_item(pamh, PAM_AUTHTOK, &new) != PAM_SUCCESS || !new) {
        /* Root setting another user's password: the old one is not known, so the login slot
           cannot follow (mtmfs passwd --login makes it again). */
        if (options.debug) pam_syslog(pamh, LOG_DEBUG, "no old password: the login slot is left as it is");
        return PAM_IGNORE;
    }
    struct user user;
    if (find_user(pamh, &user) != 0) return PAM_IGNORE;
    size_t old_length = strnlen(old, MAX_SECRET + 1), new_length = strnlen(new, MAX_SECRET + 1);
    if (old_length == 0 || new_length == 0 || old_length > MAX_SECRET || new_length > MAX_SECRET) return PAM_IGNORE;
    /* "OLD\nNEW\n" in locked memory of its own: the two lines mtmfs reads. */
    size_t total = old_length + 1 + new_length + 1;
    long page = sysconf(_SC_PAGESIZE);
    size_t size = ((total + (size_t)page - 1) / (size_t)page) * (size_t)page;
    char *joined = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (joined == MAP_FAILED) return PAM_IGNORE;
    (void)mlock(joined, size);
    (void)madvise(joined, size, MADV_DONTDUMP);
    memcpy(joined, old, old_length);
    joined[old_length] = '\n';
    memcpy(joined + old_length + 1, new, new_length);
    joined[total - 1] = '\n';
    int pipe_fds[2];
    int result = -1;
    /* Written before the child exists, as in the session: never a SIGPIPE here. */
    if (pipe2(pipe_fds, O_CLOEXEC) == 0) {
        if (write_all(pipe_fds[1], joined, total) == 0) {
            char *arguments[] = {"mtmfs", "passwd", "--login-changed", NULL};
            pid_t child = fork();
            if (child == 0) {
                close(pipe_fds[1]);
                run_mtmfs(&options, &user, pipe_fds[0], arguments);
            }
            close(pipe_fds[0]);
            close(pipe_fds[1]);
            if (child > 0) result = wait_bounded(child, 60); /* two key derivations: seconds at most */
        } else {
            close(pipe_fds[0]);
            close(pipe_fds[1]);
        }
    }
    explicit_bzero(joined, size);
    munlock(joined, size);
    munmap(joined, size);
    if (result == 0) {
        pam_syslog(pamh, LOG_INFO, "the mtmfs login slot of %s follows the new password", user.name);
    } else if (result != 3) { /* 3: no login slot, nothing to follow */
        pam_syslog(pamh, LOG_WARNING, "the mtmfs login slot of %s could not follow the new password "
                   "(mtmfs passwd --login makes it again)", user.name);
    }
    return PAM_IGNORE;
}
