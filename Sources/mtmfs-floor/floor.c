/*
 * mtmfs-floor: the FUSE floor of mtmfs-bench. The least a libfuse low-level daemon does to
 * serve a tree from memory — directories, regular files, their data — with the kernel-cache
 * settings of mtmfs's cache/ (entries and attributes trusted 60 s, open with keep_cache and
 * noflush, READDIRPLUS always, explicit data invalidation, the same mount options and 8
 * worker threads). What a request costs on mtmfs above this is mtmfs's own.
 *
 * Usage: mtmfs-floor [-f] MOUNTPOINT
 *   -f  stay in the foreground (mtmfs-bench starts it so, as a child it ends with SIGTERM);
 *       without it the daemon detaches once mounted (fuse_daemonize).
 * SIGTERM, SIGINT and SIGHUP end the loop and unmount; an unmount ends it too.
 *
 * Layout: an inode table indexed by inode number (numbers are never reused) and one hash
 * table of names keyed by (parent, name). A directory also lists its children in creation
 * order (a hole where one left), so that a readdir offset is an index. One mutex guards it
 * all; replies are sent holding it, since the bytes they point to may move once it is let
 * go. A node is freed once unlinked, closed and forgotten by the kernel (nlookup 0).
 * No hard links, symlinks, device nodes or extended attributes: libfuse answers ENOSYS.
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 314 /* the API level of Sources/CFuse/shim.h, which mtmfs uses */
#include <fuse_lowlevel.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

static const double TIMEOUT = 60; /* CacheTree.cache: 60 s for entries and attributes */

struct node {
	struct stat st;          /* st_ino is the inode number; st_nlink 0 once unlinked */
	struct node *parent;     /* NULL for the root and once unlinked */
	char *name;              /* likewise */
	struct node *hash_next;  /* the next name in the same bucket */
	uint64_t nlookup;        /* references the kernel holds */
	unsigned opened;         /* open files or directory handles */
	char *data;              /* a file's bytes (capacity ≥ st_size) */
	size_t capacity;
	struct node **children;  /* a directory's, in creation order, NULL where one left */
	size_t nchildren, live, slots; /* slots used, children present, slots allocated */
	size_t slot;             /* this node's index in its parent's children */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct node **nodes;  /* by inode number; [0] unused, [1] the root */
static size_t nnodes, nodes_capacity;
static struct node **buckets;
static size_t nbuckets, nnames;

static struct node *get(fuse_ino_t ino) { return ino < nnodes ? nodes[ino] : NULL; }

static size_t hash(fuse_ino_t parent, const char *name)
{
	uint64_t h = 14695981039346656037ULL ^ parent; /* FNV-1a */
	for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ULL;
	return (size_t)(h ^ (h >> 29));
}

static struct node *find(struct node *dir, const char *name)
{
	struct node *n = buckets[hash(dir->st.st_ino, name) & (nbuckets - 1)];
	while (n && (n->parent != dir || strcmp(n->name, name) != 0)) n = n->hash_next;
	return n;
}

static void hash_insert(struct node *n)
{
	size_t b = hash(n->parent->st.st_ino, n->name) & (nbuckets - 1);
	n->hash_next = buckets[b];
	buckets[b] = n;
}

/* Makes room for one more name in `dir` (0, or ENOMEM), so that link_name cannot fail. */
static int reserve(struct node *dir)
{
	if (nnames >= nbuckets) { /* keep chains short: double and rehash */
		struct node **old = buckets, **grown = calloc(nbuckets * 2, sizeof *grown);
		size_t count = nbuckets;
		if (!grown) return ENOMEM;
		buckets = grown;
		nbuckets = count * 2;
		for (size_t i = 0; i < count; i++)
			for (struct node *m = old[i], *next; m; m = next) { next = m->hash_next; hash_insert(m); }
		free(old);
	}
	if (dir->nchildren == dir->slots) {
		size_t slots = dir->slots ? dir->slots * 2 : 16;
		struct node **grown = realloc(dir->children, slots * sizeof *grown);
		if (!grown) return ENOMEM;
		dir->children = grown;
		dir->slots = slots;
	}
	return 0;
}

/* Gives `n` the name `name` (malloc'd, now n's) in `dir`, which has room (reserve). */
static void link_name(struct node *dir, struct node *n, char *name)
{
	n->name = name;
	n->parent = dir;
	n->slot = dir->nchildren;
	dir->children[dir->nchildren++] = n;
	dir->live++;
	nnames++;
	hash_insert(n);
}

/* Squeezes the holes out of a directory no handle reads (its offsets would move). */
static void compact(struct node *dir)
{
	if (dir->opened || dir->nchildren < 64 || dir->live > dir->nchildren / 2) return;
	size_t kept = 0;
	for (size_t i = 0; i < dir->nchildren; i++)
		if (dir->children[i]) { dir->children[i]->slot = kept; dir->children[kept++] = dir->children[i]; }
	dir->nchildren = kept;
}

/* Takes `n`'s name away (it stays in the inode table). */
static void detach(struct node *n)
{
	struct node *dir = n->parent, **link = &buckets[hash(dir->st.st_ino, n->name) & (nbuckets - 1)];
	while (*link != n) link = &(*link)->hash_next;
	*link = n->hash_next;
	dir->children[n->slot] = NULL;
	dir->live--;
	nnames--;
	free(n->name);
	n->name = NULL;
	n->parent = NULL;
	compact(dir);
}

static void now(struct timespec *t) { clock_gettime(CLOCK_REALTIME, t); }

static void changed(struct node *n) { now(&n->st.st_mtim); n->st.st_ctim = n->st.st_mtim; }

/* Frees `n` once nothing refers to it: no name, no kernel reference, no open handle. */
static void maybe_free(struct node *n)
{
	if (n->st.st_nlink || n->nlookup || n->opened) return;
	nodes[n->st.st_ino] = NULL;
	free(n->data);
	free(n->children);
	free(n);
}

static void unlink_node(struct node *n)
{
	struct node *dir = n->parent;
	detach(n);
	if (S_ISDIR(n->st.st_mode)) dir->st.st_nlink--;
	n->st.st_nlink = 0;
	now(&n->st.st_ctim);
	changed(dir);
	maybe_free(n);
}

/* A new node named `name` in `parent`, owned by the caller: 0 with *made, or an errno. */
static int make(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct node **made)
{
	struct node *dir = get(parent), *n;
	if (!dir) return ENOENT;
	if (!S_ISDIR(dir->st.st_mode)) return ENOTDIR;
	if (strlen(name) > 255) return ENAMETOOLONG;
	if (find(dir, name)) return EEXIST;
	if (nnodes == nodes_capacity) {
		struct node **grown = realloc(nodes, nodes_capacity * 2 * sizeof *grown);
		if (!grown) return ENOMEM;
		nodes = grown;
		nodes_capacity *= 2;
	}
	char *copy = reserve(dir) == 0 ? strdup(name) : NULL;
	if (!copy || !(n = calloc(1, sizeof *n))) { free(copy); return ENOMEM; }
	const struct fuse_ctx *caller = fuse_req_ctx(req);
	n->st.st_ino = nnodes;
	n->st.st_mode = mode;
	n->st.st_nlink = S_ISDIR(mode) ? 2 : 1;
	n->st.st_uid = caller->uid;
	n->st.st_gid = caller->gid;
	n->st.st_blksize = 4096;
	now(&n->st.st_mtim);
	n->st.st_atim = n->st.st_ctim = n->st.st_mtim;
	link_name(dir, n, copy);
	nodes[nnodes++] = n;
	if (S_ISDIR(mode)) dir->st.st_nlink++;
	changed(dir);
	*made = n;
	return 0;
}

/* Sets a file's size; new bytes are zeros (0, or ENOMEM). */
static int resize(struct node *n, size_t size)
{
	if (size > n->capacity) {
		size_t capacity = n->capacity * 2 > size ? n->capacity * 2 : size;
		char *grown = realloc(n->data, capacity);
		if (!grown) return ENOMEM;
		n->data = grown;
		n->capacity = capacity;
	}
	if (size > (size_t)n->st.st_size) memset(n->data + n->st.st_size, 0, size - n->st.st_size);
	n->st.st_size = size;
	n->st.st_blocks = (size + 511) / 512;
	return 0;
}

static struct fuse_entry_param entry_of(struct node *n)
{
	return (struct fuse_entry_param){ .ino = n->st.st_ino, .attr = n->st,
	                                  .attr_timeout = TIMEOUT, .entry_timeout = TIMEOUT };
}

/* An entry reply: a kernel reference, unless the request is gone. */
static void reply_entry(fuse_req_t req, struct node *n)
{
	struct fuse_entry_param e = entry_of(n);
	n->nlookup++;
	if (fuse_reply_entry(req, &e) != 0) n->nlookup--;
}

/* Replies err (0: success with nothing to say) and lets go of the lock. */
static void done(fuse_req_t req, int err)
{
	fuse_reply_err(req, err);
	pthread_mutex_unlock(&lock);
}

/* Ends a handler that holds the lock with an error reply. */
#define FAIL(err) do { done(req, (err)); return; } while (0)

static void fl_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata; /* what FuseBridge.configure asks */
	if (conn->capable & FUSE_CAP_READDIRPLUS) {
		conn->want |= FUSE_CAP_READDIRPLUS;
		conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
	}
	if (conn->capable & FUSE_CAP_EXPLICIT_INVAL_DATA) {
		conn->want |= FUSE_CAP_EXPLICIT_INVAL_DATA;
		conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	}
	conn->time_gran = 1;
}

static void fl_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	pthread_mutex_lock(&lock);
	struct node *dir = get(parent), *n = dir && S_ISDIR(dir->st.st_mode) ? find(dir, name) : NULL;
	if (!n) FAIL(ENOENT);
	reply_entry(req, n);
	pthread_mutex_unlock(&lock);
}

static void forget_one(fuse_ino_t ino, uint64_t nlookup)
{
	struct node *n = get(ino);
	if (!n) return;
	n->nlookup -= nlookup < n->nlookup ? nlookup : n->nlookup;
	maybe_free(n);
}

static void fl_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	pthread_mutex_lock(&lock);
	forget_one(ino, nlookup);
	pthread_mutex_unlock(&lock);
	fuse_reply_none(req);
}

static void fl_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < count; i++) forget_one(forgets[i].ino, forgets[i].nlookup);
	pthread_mutex_unlock(&lock);
	fuse_reply_none(req);
}

static void fl_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	pthread_mutex_lock(&lock);
	struct node *n = get(ino);
	if (!n) FAIL(ENOENT);
	fuse_reply_attr(req, &n->st, TIMEOUT);
	pthread_mutex_unlock(&lock);
}

static void fl_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi)
{
	(void)fi;
	pthread_mutex_lock(&lock);
	struct node *n = get(ino);
	if (!n) FAIL(ENOENT);
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (S_ISDIR(n->st.st_mode)) FAIL(EISDIR);
		if (attr->st_size < 0) FAIL(EINVAL);
		if (resize(n, attr->st_size) != 0) FAIL(ENOMEM);
		changed(n);
	}
	if (to_set & FUSE_SET_ATTR_MODE) n->st.st_mode = (n->st.st_mode & S_IFMT) | (attr->st_mode & 07777);
	if (to_set & FUSE_SET_ATTR_UID) n->st.st_uid = attr->st_uid;
	if (to_set & FUSE_SET_ATTR_GID) n->st.st_gid = attr->st_gid;
	if (to_set & FUSE_SET_ATTR_ATIME_NOW) now(&n->st.st_atim);
	else if (to_set & FUSE_SET_ATTR_ATIME) n->st.st_atim = attr->st_atim;
	if (to_set & FUSE_SET_ATTR_MTIME_NOW) now(&n->st.st_mtim);
	else if (to_set & FUSE_SET_ATTR_MTIME) n->st.st_mtim = attr->st_mtim;
	if (to_set & FUSE_SET_ATTR_CTIME) n->st.st_ctim = attr->st_ctim;
	else now(&n->st.st_ctim);
	fuse_reply_attr(req, &n->st, TIMEOUT);
	pthread_mutex_unlock(&lock);
}

static void fl_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	pthread_mutex_lock(&lock);
	struct node *n;
	int err = make(req, parent, name, S_IFDIR | (mode & 07777), &n);
	if (err) FAIL(err);
	reply_entry(req, n);
	pthread_mutex_unlock(&lock);
}

/* unlink and rmdir: `directory` says which the caller asked for. */
static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name, int directory)
{
	pthread_mutex_lock(&lock);
	struct node *dir = get(parent), *n = dir && S_ISDIR(dir->st.st_mode) ? find(dir, name) : NULL;
	if (!n) FAIL(ENOENT);
	if (directory && !S_ISDIR(n->st.st_mode)) FAIL(ENOTDIR);
	if (!directory && S_ISDIR(n->st.st_mode)) FAIL(EISDIR);
	if (directory && n->live) FAIL(ENOTEMPTY);
	unlink_node(n);
	done(req, 0);
}

static void fl_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) { remove_name(req, parent, name, 0); }
static void fl_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) { remove_name(req, parent, name, 1); }

/* What an open of `n` sets up: O_TRUNC done here (libfuse negotiates atomic O_TRUNC). */
static void open_node(struct node *n, struct fuse_file_info *fi)
{
	if ((fi->flags & O_TRUNC) && (fi->flags & O_ACCMODE) != O_RDONLY && n->st.st_size) {
		resize(n, 0); /* shrinking needs no memory */
		changed(n);
	}
	fi->fh = (fi->flags & O_APPEND) != 0;
	fi->keep_cache = 1; /* as cache/ opens: pages kept across opens, a close sends no FLUSH */
	fi->noflush = 1;
	n->opened++;
}

static void fl_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi)
{
	pthread_mutex_lock(&lock);
	struct node *n, *dir = get(parent);
	int err = make(req, parent, name, S_IFREG | (mode & 07777), &n);
	if (err == EEXIST && !(fi->flags & O_EXCL)) { /* made meanwhile: open it */
		n = find(dir, name);
		err = S_ISDIR(n->st.st_mode) ? EISDIR : 0;
	}
	if (err) FAIL(err);
	open_node(n, fi);
	struct fuse_entry_param e = entry_of(n);
	n->nlookup++;
	if (fuse_reply_create(req, &e, fi) != 0) { /* the caller is gone: no reference, no open */
		n->nlookup--;
		n->opened--;
	}
	pthread_mutex_unlock(&lock);
}

static void fl_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	pthread_mutex_lock(&lock);
	struct node *n = get(ino);
	if (!n) FAIL(ENOENT);
	if (S_ISDIR(n->st.st_mode)) FAIL(EISDIR);
	open_node(n, fi);
	if (fuse_reply_open(req, fi) != 0) n->opened--;
	pthread_mutex_unlock(&lock);
}

static void fl_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi; /* atime is not kept up to date (as with noatime) */
	pthread_mutex_lock(&lock);
	struct node *n = get(ino);
	if (!n) FAIL(ENOENT);
	size_t length = off < n->st.st_size ? n->st.st_size - off : 0;
	fuse_reply_buf(req, length ? n->data + off : NULL, length < size ? length : size);
	pthread_mutex_unlock(&lock);
}

static void fl_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
	pthread_mutex_lock(&lock);
	struct node *n = get(ino);
	if (!n) FAIL(ENOENT);
	if (fi->fh) off = n->st.st_size; /* O_APPEND */
	if ((size_t)off + size > (size_t)n->st.st_size && resize(n, off + size) != 0) FAIL(ENOSPC);
	memcpy(n->data + off, buf, size);
	changed(n);
	fuse_reply_write(req, size);
	pthread_mutex_unlock(&lock);
}

/* flush and fsync: nothing is anywhere but in memory. */
static void fl_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino; (void)fi;
	fuse_reply_err(req, 0);
}

static void fl_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino; (void)datasync; (void)fi;
	fuse_reply_err(req, 0);
}

/* release and releasedir: a handle goes; the node may go with it, and a directory's holes. */
static void fl_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	pthread_mutex_lock(&lock);
	struct node *n = get(ino);
	if (n) {
		n->opened--;
		if (S_ISDIR(n->st.st_mode)) compact(n);
		maybe_free(n);
	}
	done(req, 0);
}

static void fl_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	pthread_mutex_lock(&lock);
	struct node *n = get(ino);
	if (!n) FAIL(ENOENT);
	if (!S_ISDIR(n->st.st_mode)) FAIL(ENOTDIR);
	n->opened++;
	if (fuse_reply_open(req, fi) != 0) n->opened--;
	pthread_mutex_unlock(&lock);
}

/* Offsets: 0 ".", 1 "..", 2 + i the i-th child slot; each entry carries the next offset. */
static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
	pthread_mutex_lock(&lock);
	struct node *dir = get(ino);
	if (!dir) FAIL(ENOENT);
	char *buf = malloc(size);
	if (!buf) FAIL(ENOMEM);
	size_t used = 0;
	off_t i = off;
	for (; i < (off_t)dir->nchildren + 2; i++) {
		struct node *n = i == 0 ? dir : i == 1 ? (dir->parent ? dir->parent : dir) : dir->children[i - 2];
		if (!n) continue;
		const char *name = i == 0 ? "." : i == 1 ? ".." : n->name;
		size_t length;
		if (plus) {
			/* "." and "..": no entry (ino 0), so no reference for the kernel to hold */
			struct fuse_entry_param e = i < 2 ? (struct fuse_entry_param){ .attr = n->st } : entry_of(n);
			length = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, i + 1);
		} else {
			length = fuse_add_direntry(req, buf + used, size - used, name, &n->st, i + 1);
		}
		if (length > size - used) break;
		if (plus && i >= 2) n->nlookup++;
		used += length;
	}
	if (fuse_reply_buf(req, buf, used) != 0 && plus) /* not delivered: no references taken */
		for (off_t j = off < 2 ? 2 : off; j < i; j++)
			if (dir->children[j - 2]) dir->children[j - 2]->nlookup--;
	free(buf);
	pthread_mutex_unlock(&lock);
}

static void fl_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	readdir_common(req, ino, size, off, 0);
}

static void fl_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	readdir_common(req, ino, size, off, 1);
}

static void fl_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino; /* memory has no fixed size: a large, mostly free file system */
	struct statvfs s = { .f_bsize = 4096, .f_frsize = 4096, .f_blocks = 1 << 24, .f_bfree = 1 << 24,
	                     .f_bavail = 1 << 24, .f_files = 1 << 24, .f_ffree = 1 << 24, .f_namemax = 255 };
	fuse_reply_statfs(req, &s);
}

static void fl_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
	pthread_mutex_lock(&lock);
	if (flags & ~RENAME_NOREPLACE) FAIL(EINVAL); /* RENAME_EXCHANGE is not done */
	struct node *from = get(parent), *to = get(newparent);
	if (!from || !to || !S_ISDIR(from->st.st_mode)) FAIL(ENOENT);
	if (!S_ISDIR(to->st.st_mode)) FAIL(ENOTDIR);
	if (strlen(newname) > 255) FAIL(ENAMETOOLONG);
	struct node *n = find(from, name), *target = find(to, newname);
	if (!n) FAIL(ENOENT);
	if (target == n) { done(req, 0); return; } /* the same file: nothing to do */
	if (target) {
		if (flags & RENAME_NOREPLACE) FAIL(EEXIST);
		if (S_ISDIR(n->st.st_mode) && !S_ISDIR(target->st.st_mode)) FAIL(ENOTDIR);
		if (!S_ISDIR(n->st.st_mode) && S_ISDIR(target->st.st_mode)) FAIL(EISDIR);
		if (target->live) FAIL(ENOTEMPTY);
	}
	for (struct node *p = to; S_ISDIR(n->st.st_mode) && p; p = p->parent)
		if (p == n) FAIL(EINVAL); /* into its own subtree */
	char *copy = reserve(to) == 0 ? strdup(newname) : NULL; /* what may fail, before any change */
	if (!copy) FAIL(ENOMEM);
	if (target) unlink_node(target);
	detach(n);
	link_name(to, n, copy);
	if (S_ISDIR(n->st.st_mode)) { from->st.st_nlink--; to->st.st_nlink++; }
	now(&n->st.st_ctim);
	changed(from);
	changed(to);
	done(req, 0);
}

static const struct fuse_lowlevel_ops operations = {
	.init = fl_init, .lookup = fl_lookup, .forget = fl_forget, .forget_multi = fl_forget_multi,
	.getattr = fl_getattr, .setattr = fl_setattr, .mkdir = fl_mkdir, .unlink = fl_unlink,
	.rmdir = fl_rmdir, .rename = fl_rename, .create = fl_create, .open = fl_open, .read = fl_read,
	.write = fl_write, .flush = fl_flush, .release = fl_release, .fsync = fl_fsync,
	.opendir = fl_opendir, .readdir = fl_readdir, .readdirplus = fl_readdirplus,
	.releasedir = fl_release, .fsyncdir = fl_fsync, .statfs = fl_statfs,
};

int main(int argc, char *argv[])
{
	int foreground = 0;
	const char *mountpoint = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-f") == 0) {
			foreground = 1;
		} else if (argv[i][0] == '-' || mountpoint) { /* an unknown option, a second mount point */
			mountpoint = NULL;
			break;
		} else {
			mountpoint = argv[i];
		}
	}
	if (!mountpoint) {
		fprintf(stderr, "Usage: mtmfs-floor [-f] MOUNTPOINT\n");
		return 2;
	}
	nodes_capacity = nbuckets = 1024;
	nodes = calloc(nodes_capacity, sizeof *nodes);
	buckets = calloc(nbuckets, sizeof *buckets);
	struct node *root = calloc(1, sizeof *root);
	if (!nodes || !buckets || !root) return 1;
	root->st = (struct stat){ .st_ino = FUSE_ROOT_ID, .st_mode = S_IFDIR | 0755, .st_nlink = 2,
	                          .st_uid = getuid(), .st_gid = getgid(), .st_blksize = 4096 };
	now(&root->st.st_mtim);
	root->st.st_atim = root->st.st_ctim = root->st.st_mtim;
	nodes[FUSE_ROOT_ID] = root;
	nnodes = FUSE_ROOT_ID + 1;

	/* mtmfs's own mount options (MtmfsMount): the kernel checks permissions. */
	char program[] = "mtmfs-floor", dash_o[] = "-o",
	     options[] = "fsname=mtmfs-floor,subtype=mtmfs-floor,default_permissions,nosuid,nodev";
	char *fuse_argv[] = { program, dash_o, options, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
	struct fuse_session *se = fuse_session_new(&args, &operations, sizeof operations, NULL);
	fuse_opt_free_args(&args);
	if (!se) return 1;
	int rc = 1;
	if (fuse_set_signal_handlers(se) == 0) {
		if (fuse_session_mount(se, mountpoint) == 0) {
			fuse_daemonize(foreground);
			/* Up to 8 workers, as mtmfs runs (KernelOptions.maximumThreads). */
			struct fuse_loop_config *config = fuse_loop_cfg_create();
			if (config) {
				fuse_loop_cfg_set_max_threads(config, 8);
				rc = fuse_session_loop_mt(se, config) < 0; /* 0 after an unmount or a signal */
				fuse_loop_cfg_destroy(config);
			}
			fuse_session_unmount(se);
		}
		fuse_remove_signal_handlers(se);
	}
	fuse_session_destroy(se);
	return rc;
}
