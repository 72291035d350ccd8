#!/usr/bin/env python3
"""Power-cut crash states for mtmfs, in the manner of ALICE (OSDI'14) and CrashMonkey (OSDI'18).

A workload runs through a mount whose daemon runs under strace from its first instruction. The
daemon's system calls on its data directory D are replayed into a model of a file system, and
for a set of cut points the tool writes out the states a power cut could leave on the disk.
Each state is mounted and checked against the promises the workload was given (SPEC §0, §5):
what an fsync, a close of a settings key or an account field, an fsync of a directory, an
SQLite commit inside cache/ and a returned unmount acknowledged must be there; and the store
must be whole (SQLite integrity, `mtmfs check`, no data file that no row names).

What the model covers (the daemon's own calls on D; paths ending in -shm are left out: SQLite
rebuilds its shared-memory index, and no state contains one):
  * File data, by inode (a rename moves the inode, a link adds a name): write, writev, pwrite64,
    pwritev[2], copy_file_range (offsets of write/writev tracked through open, lseek and
    O_APPEND), ftruncate, truncate, O_TRUNC, fallocate (preallocate, punch hole, zero range).
    fsync/fdatasync of a file, sync and syncfs make durable every data op on it that COMPLETED
    before the sync STARTED. Every later op is kept or lost on its own, a write page by page
    (4096-byte pages of the file); a file's size is what the kept ops make it.
  * Names: create (O_CREAT, creat), mkdir, symlink, link, rename (RENAME_EXCHANGE too), unlink,
    rmdir, in one global order (of completion). Every one completed before the start of the
    last returned fsync of ANY directory under D (or sync/syncfs) is durable; of the rest a
    prefix of any length is kept (ext4's journal commits names in order).
  * Cut points: after every returned fsync/fdatasync, after every name op, and the end (the
    daemon exited). Per cut: every unsynced op lost (the canonical power cut), every op kept
    (what a kill -9 leaves), and K seeded random mixes; identical states are checked once.
  * A promise is checked in a state only if it was made (time.time() right after the promising
    call returned) before the cut's event completed. Event times are strace's start (-ttt) and
    start + duration (-T), so the daemon's calls and the promises share one clock.
Not modelled: torn writes inside a page, garbage (rather than old bytes or zeros) in lost pages,
names reordered beyond a prefix, writes through mmap (invisible to strace; only SQLite's -shm
uses them), modes, owners, times and xattrs (states get 0700 dirs and 0600 files).
"""
import argparse, collections, hashlib, os, random, re, shutil, sqlite3, stat, subprocess, sys, tempfile, time, uuid

PAGE = 4096
SYSCALLS = ('openat,open,creat,write,pwrite64,writev,pwritev,pwritev2,ftruncate,truncate,fallocate,'
            'fsync,fdatasync,sync_file_range,syncfs,sync,rename,renameat,renameat2,unlink,unlinkat,'
            'mkdir,mkdirat,rmdir,link,linkat,symlink,symlinkat,copy_file_range,lseek,close,dup,dup2,'
            'dup3,fcntl')
NAME_OPS = ('create', 'link', 'unlink', 'rename', 'exchange')
SYNC_OPS = ('fsync', 'dsync', 'gsync')      # a file's, a directory's, everything's (sync, syncfs)
STORES = ('cache', 'settings', 'accounts')
# Path arguments of the name calls: (index of the dirfd or None, index of the path).
PATH_ARGS = {'rename': [(None, 0), (None, 1)], 'renameat': [(0, 1), (2, 3)], 'renameat2': [(0, 1), (2, 3)],
             'link': [(None, 0), (None, 1)], 'linkat': [(0, 1), (2, 3)], 'symlink': [(None, 1)],
             'symlinkat': [(1, 2)], 'mkdir': [(None, 0)], 'mkdirat': [(0, 1)], 'unlink': [(None, 0)],
             'unlinkat': [(0, 1)], 'rmdir': [(None, 0)], 'truncate': [(None, 0)]}

def log(*a):
    print(*a, flush=True)

def run(cmd, timeout=60):
    """Runs cmd; returns (rc, stdout+stderr). A timeout is rc 124."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors='replace').strip()
    except subprocess.TimeoutExpired:
        return 124, 'timed out after %ss: %s' % (timeout, ' '.join(cmd))
    except OSError as e:
        return 126, '%s: %s' % (cmd[0], e)

def is_mounted(m):
    with open('/proc/mounts') as f:
        return any(l.split()[1] == m and l.split()[2] == 'fuse.mtmfs' for l in f)

def force_unmount(m, data_dir):
    """Detaches m lazily and kills the daemon that served data_dir (the pid in its mtmfs.lock),
    only if that pid still runs mtmfs on data_dir."""
    if is_mounted(m):
        run(['fusermount3', '-uz', m], timeout=20)
    try:
        pid = int(re.search(r'pid (\d+)', open(os.path.join(data_dir, 'mtmfs.lock')).read()).group(1))
        if data_dir.encode() in open('/proc/%d/cmdline' % pid, 'rb').read():
            os.kill(pid, 9)
    except (OSError, AttributeError, ValueError):
        pass

# ----------------------------------------------------------------------------- the workload

class Workload:
    """Drives the mount and records promises: dicts with t (time the promising call returned),
    store, kind ('prefix', 'exact', 'absent', 'rows', 'value'), path (relative to the mount)
    and want. A 'value' promise's want is an index into history[path]: the promised value and
    every later one the workload wrote to that key or field are acceptable."""

    def __init__(self, mtmfs, mnt, passfile, seed):
        self.mtmfs, self.m, self.passfile = mtmfs, mnt, passfile
        self.rng = random.Random(seed)
        self.promises, self.history, self.files = [], {}, {}

    def promise(self, store, kind, path, want=None, t=None):
        self.promises.append(dict(t=time.time() if t is None else t, store=store, kind=kind, path=path, want=want))

    def put(self, rel, chunks, append=False, fsync=True, promise=True):
        """Writes chunks to cache file rel; after each, an fsync and (unless the file is to be
        deleted or renamed) the promise that it starts with everything written so far."""
        fd = os.open(os.path.join(self.m, rel), os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0), 0o600)
        for chunk in chunks:
            done = memoryview(chunk)
            while done:
                done = done[os.write(fd, done):]
            self.files[rel] = self.files.get(rel, b'') + chunk
            if fsync:
                os.fsync(fd)
            if fsync and promise:
                self.promise('cache', 'prefix', rel, self.files[rel])
        os.close(fd)

    def fsync_dir(self, rel):
        fd = os.open(os.path.join(self.m, rel), os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)

    def value(self, store, rel, text):
        """A settings key or account field: open('w'), write, close; durable at close."""
        with open(os.path.join(self.m, rel), 'w') as f:
            f.write(text)
        hist = self.history.setdefault(rel, [])
        hist.append(text.encode())
        self.promise(store, 'value', rel, len(hist) - 1)

    def setup(self):
        """A previous session, before the snapshot (unmounted cleanly): a large file that the
        traced session appends to first, and a settings key. Its promises hold at every cut."""
        self.put('cache/old.bin', [self.rng.randbytes(200_000)])
        self.value('settings', 'settings/Key0', 'value0\n')
        for p in self.promises:
            p['t'] = 0.0

    def run(self):
        """The traced session. The order matters: old.bin's append comes first, before anything
        else syncs SQLite's log; a large file's deletion, an unsynced append to a large file and
        an unsynced large file come last, just before the unmount."""
        rb, C = self.rng.randbytes, 'cache/'
        self.put(C + 'old.bin', [rb(100_000)], append=True)      # a large file of the last session
        self.put(C + 'base.bin', [rb(300_000), rb(100_000)])     # (a) written, fsynced, appended
        self.put(C + 'gone.bin', [rb(150_000)], promise=False)   # deleted at the end
        for i in range(5):                                       # (b) small files
            self.put(C + 'small%d' % i, [rb(self.rng.randint(1024, 30 * 1024))])
        self.put(C + 'tmp.txt', [b'temporary\n'], promise=False)  # (c) created, fsynced, deleted
        os.unlink(os.path.join(self.m, C + 'tmp.txt'))
        del self.files[C + 'tmp.txt']
        self.fsync_dir(C)
        self.promise('cache', 'absent', C + 'tmp.txt')
        db = sqlite3.connect(os.path.join(self.m, C + 'db.sqlite'), isolation_level=None, timeout=30)
        db.execute('PRAGMA journal_mode=WAL')                    # (d) SQLite inside cache/
        db.execute('PRAGMA synchronous=FULL')
        db.execute('CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)')
        for i in range(1, 21):
            db.execute('BEGIN')
            db.execute('INSERT INTO t(v) VALUES (?)', (rb(self.rng.randint(100, 3000)),))
            db.execute('COMMIT')
            self.promise('cache', 'rows', C + 'db.sqlite', i)
        db.close()
        self.put(C + 'draft.txt', [rb(5000)], promise=False)     # (e) rename + fsync of the dir
        os.rename(os.path.join(self.m, C + 'draft.txt'), os.path.join(self.m, C + 'final.txt'))
        self.fsync_dir(C)
        self.files[C + 'final.txt'] = self.files.pop(C + 'draft.txt')
        self.promise('cache', 'prefix', C + 'final.txt', self.files[C + 'final.txt'])
        self.promise('cache', 'absent', C + 'draft.txt')
        for key, value in [('Key1', 'value1'), ('Key2', 'value2'), ('Key3', 'value3'),
                           ('Key2', 'value2b'), ('Key2', 'value2c')]:
            self.value('settings', 'settings/' + key, value + '\n')
        rc, out = run([self.mtmfs, 'unlock', '--passphrase-file', self.passfile, self.m])
        if rc:
            raise SystemExit('unlock failed: ' + out)
        acct = 'accounts/' + str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        os.mkdir(os.path.join(self.m, acct))
        for field, value in [('label', 'Crash test'), ('username', 'alice'), ('password', 'secret-1'),
                             ('password', 'secret-2')]:
            self.value('accounts', acct + '/' + field, value + '\n')
        os.unlink(os.path.join(self.m, C + 'gone.bin'))
        del self.files[C + 'gone.bin']
        self.put(C + 'base.bin', [rb(50_000)], append=True, fsync=False)   # promised at unmount
        self.put(C + 'unsynced.bin', [rb(200_000)], fsync=False)
        rc, out = run([self.mtmfs, 'unmount', self.m], timeout=120)
        if rc:
            raise SystemExit('unmount failed: ' + out)
        # A returned unmount promises everything: every file's final content, every deletion.
        t = time.time()
        for path, data in self.files.items():
            self.promise('cache', 'exact', path, data, t=t)
        for path in (C + 'tmp.txt', C + 'gone.bin', C + 'draft.txt'):
            self.promise('cache', 'absent', path, t=t)
        self.promise('cache', 'rows', C + 'db.sqlite', 20, t=t)
        for path, hist in self.history.items():
            self.promise(path.split('/')[0], 'value', path, len(hist) - 1, t=t)

# ----------------------------------------------------------------------------- the strace log

def unescape(s):
    """Bytes of a strace string body: all \\xHH under -xx; other C escapes decoded too."""
    if re.fullmatch(r'(?:\\x[0-9a-fA-F]{2})*', s):
        return bytes.fromhex(s.replace('\\x', ''))
    simple = {'n': '\n', 't': '\t', 'r': '\r', 'v': '\v', 'f': '\f'}
    def one(m):
        e = m.group(1)
        return chr(int(e[1:], 16)) if e[0] == 'x' else chr(int(e, 8) & 255) if e[0] in '01234567' else simple.get(e, e)
    return re.sub(r'\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)', one, s, flags=re.S).encode('latin-1')

def split_call(text):
    """'name(a, b, [c, d]) = r ...' -> (name, [top-level args], rest after ')'). Quotes, -y
    annotations ('3<\\x2f...>', 'AT_FDCWD<...>') and brackets are respected."""
    i = text.find('(')
    if i <= 0:
        return None
    args, depth, cur, j, quoted = [], 0, i + 1, i + 1, False
    while j < len(text):
        c = text[j]
        if quoted:
            j += c == '\\'
            quoted = c != '"'
        elif c == '"':
            quoted = True
        elif c == '<' and (text[j - 1].isalnum() or text[j - 1] == '_'):
            j = text.find('>', j)
            if j < 0:
                return None
        elif c in '([{':
            depth += 1
        elif c in ')]}':
            if depth == 0:
                args.append(text[cur:j].strip())
                return text[:i], [a for a in args if a], text[j + 1:]
            depth -= 1
        elif c == ',' and depth == 0:
            args.append(text[cur:j].strip())
            cur = j + 1
        j += 1
    return None

def fd_arg(tok):
    """'15<\\x2f...>' or 'AT_FDCWD<...>' -> (15 or None, decoded annotation or None)."""
    m = re.match(r'(-?\d+|AT_FDCWD)(?:<(.*)>)?$', tok or '', re.S)
    if not m:
        return None, None
    ann = unescape(m.group(2)).decode('utf-8', 'surrogateescape') if m.group(2) is not None else None
    return (None if m.group(1) == 'AT_FDCWD' else int(m.group(1))), ann

def str_arg(tok):
    m = re.match(r'"(.*)"(\.\.\.)?$', tok, re.S)
    if not m or m.group(2):
        raise ValueError('not a whole string (raise -s?): ' + tok[:80])
    return unescape(m.group(1))

def iov_arg(tok):
    return b''.join(unescape(s) for s in re.findall(r'iov_base="((?:[^"\\]|\\.)*)"', tok))

def num_arg(tok):
    m = re.match(r'\[?(-?\d+)', tok)
    return int(m.group(1)) if m else None

def read_records(path):
    """The strace log as records (start, end, pid, name, args, ret, ret_annotation, line no),
    sorted by completion. '<unfinished ...>' and '<... NAME resumed>' halves are joined per
    pid; start is the first half's timestamp, end = start + the -T duration."""
    pending, recs = {}, []
    with open(path, 'rb') as f:
        for n, raw in enumerate(f):
            m = re.match(r'(\d+)\s+(\d+\.\d+)\s(.*)$', raw.decode('latin-1').rstrip('\n'), re.S)
            if not m:
                continue
            pid, ts, text = int(m.group(1)), float(m.group(2)), m.group(3)
            if text.endswith('<unfinished ...>'):
                pending[pid] = (ts, text[:-len('<unfinished ...>')].rstrip())
                continue
            resumed = re.match(r'<\.\.\. \w+ resumed>(.*)$', text, re.S)
            if resumed:
                if pid not in pending:
                    continue
                ts, head = pending.pop(pid)
                text = head + resumed.group(1)
            call = split_call(text)
            if not call:
                continue                      # '--- SIGCHLD ... ---', '+++ exited ... +++'
            name, args, rest = call
            r = re.match(r'\s*=\s*(-?\d+|\?)(?:<(.*?)>)?(?:\s+[A-Z(].*?)?(?:\s+<(\d+\.\d+)>)?\s*$', rest, re.S)
            if not r or r.group(1) == '?':
                continue
            ann = unescape(r.group(2)).decode('utf-8', 'surrogateescape') if r.group(2) else None
            recs.append((ts, ts + float(r.group(3) or 0), pid, name, args, int(r.group(1)), ann, n))
    recs.sort(key=lambda r: (r[1], r[7]))
    return recs

# ----------------------------------------------------------------------------- the model

# One modelled change: kind 'data' (ino, pieces: ('w', off, bytes) within one page, ('t', size),
# ('z', off, len, keep_size), ('g', size, b'')), a NAME_OPS kind (a, b: relative paths; ino for
# create and link) or a SYNC_OPS kind (ino for a file's sync). start, end: strace's times.
Event = collections.namedtuple('Event', 'start end kind desc ino a b pieces', defaults=(None, None, None, ()))

def write_pieces(off, data):
    """A write split at the file's page boundaries: each piece is kept or lost on its own."""
    cuts = [off] + list(range((off // PAGE + 1) * PAGE, off + len(data), PAGE)) + [off + len(data)]
    return [('w', a, data[a - off:b - off]) for a, b in zip(cuts, cuts[1:]) if b > a]

def apply_piece(buf, p):
    if p[0] in 'wg':                            # a write; a preallocation that extends the size
        buf.extend(bytes(max(0, p[1] - len(buf))))
        buf[p[1]:p[1] + len(p[2])] = p[2]
    elif p[0] == 't':
        del buf[p[1]:]
        buf.extend(bytes(p[1] - len(buf)))
    elif p[0] == 'z':
        end = p[1] + p[2]
        if not p[3]:
            buf.extend(bytes(max(0, end - len(buf))))
        stop = min(end, len(buf))
        if p[1] < stop:
            buf[p[1]:stop] = bytes(stop - p[1])

def apply_name(names, e):
    """Applies a name event to names (relative path -> inode); a rename moves a subtree."""
    if e.kind in ('create', 'link'):
        names[e.a] = e.ino
    elif e.kind == 'unlink':
        names.pop(e.a, None)
    else:
        def sub(p):
            return {q: i for q, i in names.items() if q == p or q.startswith(p + '/')}
        src, dst = sub(e.a), sub(e.b)
        for q in list(src) + list(dst):
            del names[q]
        names.update({e.b + q[len(e.a):]: i for q, i in src.items()})
        if e.kind == 'exchange':
            names.update({e.a + q[len(e.b):]: i for q, i in dst.items()})

class Model:
    """Replays the daemon's calls in order of completion into Events, keeping the current name
    table, each inode's current content and the open descriptors (fd -> [ino, offset, append];
    the daemon's threads share one table; dups share the entry, hence the offset)."""

    def __init__(self, data_dir, snapshot):
        self.d, self.kind, self.init, self.cur, self.names = data_dir, {}, {}, {}, {}
        for rel, (kind, content) in snapshot.items():
            self.names[rel] = self.new_inode(kind, content)
        self.init_names = dict(self.names)
        self.fds, self.cwd, self.events, self.warnings = {}, None, [], set()

    def new_inode(self, kind, content=b''):
        ino = len(self.kind) + 1
        self.kind[ino], self.init[ino], self.cur[ino] = kind, content, bytearray(content if kind == 'f' else b'')
        return ino

    def rel(self, path):
        """path relative to D ('' for D itself); None outside D and for -shm files."""
        if path is None:
            return None
        path = os.path.normpath(path[:-10] if path.endswith(' (deleted)') else path)
        if path == self.d:
            return ''
        return path[len(self.d) + 1:] if path.startswith(self.d + '/') and not path.endswith('-shm') else None

    def path_arg(self, dirtok, tok):
        p = str_arg(tok).decode('utf-8', 'surrogateescape')
        base = fd_arg(dirtok)[1] if dirtok else self.cwd
        return self.rel(p if p.startswith('/') or not base else os.path.join(base, p))

    def open_file(self, tok):
        """The fd table entry of an fd argument on D: the table's when the -y annotation agrees
        with it (or names a deleted file), else one made from the annotation's path."""
        num, ann = fd_arg(tok)
        r = self.rel(ann)
        if ann is None or r is None:
            return self.fds.get(num) if ann is None else None
        ent = self.fds.get(num)
        if ent and (ann.endswith(' (deleted)') or self.names.get(r) == ent[0]):
            return ent
        if ann.endswith(' (deleted)') or r not in self.names:
            self.warnings.add('fd %s on %s: not in the model' % (num, ann))
            return None
        self.fds[num] = [self.names[r], 0, False]
        return self.fds[num]

    def describe(self, rec):
        """The call as a line for reports: paths relative to D (D/...), data as its length."""
        def short(tok):
            num, ann = fd_arg(tok)
            if tok.startswith('"'):
                b = str_arg(tok)
                path = b.decode('utf-8', 'replace') if b.startswith(b'/') and len(b) < 512 else None
                return repr(self.rel(path) or path) if path else '<%d bytes>' % len(b)
            if ann is not None:
                return '%s<%s>' % ('AT_FDCWD' if num is None else num, ann if self.rel(ann) is None else 'D/' + self.rel(ann))
            return tok if len(tok) < 60 else tok[:60] + '…'
        return '%s(%s) = %s' % (rec[3], ', '.join(short(a) for a in rec[4]), rec[5])

    def emit(self, rec, kind, **kw):
        self.events.append(Event(rec[0], rec[1], kind, self.describe(rec), **kw))
        if kind in NAME_OPS:
            apply_name(self.names, self.events[-1])

    def data(self, rec, ino, pieces):
        for p in pieces:
            apply_piece(self.cur[ino], p)
        self.emit(rec, 'data', ino=ino, pieces=pieces)

    def write(self, rec, ent, off, data):
        if off is None or off < 0:            # write, writev: at the offset, or the end (O_APPEND)
            off = len(self.cur[ent[0]]) if ent[2] else ent[1]
            ent[1] = off + len(data)
        self.data(rec, ent[0], write_pieces(off, data))

    def step(self, rec):
        _, _, pid, name, args, ret, ann, _ = rec
        if ret < 0:
            return
        for a in args:
            if a.startswith('AT_FDCWD<'):
                self.cwd = fd_arg(a)[1]
        if name in ('openat', 'open', 'creat'):
            self.fds.pop(ret, None)
            at = name == 'openat'
            flags = 'O_CREAT|O_TRUNC' if name == 'creat' else args[2 if at else 1]
            r = self.rel(ann) if ann else self.path_arg(args[0] if at else None, args[1 if at else 0])
            if r is None:
                return
            if r not in self.names:
                if 'O_CREAT' not in flags:
                    self.warnings.add('open of %s: not in the model' % r)
                    return
                self.emit(rec, 'create', ino=self.new_inode('f'), a=r)
            ino = self.names[r]
            self.fds[ret] = [ino, 0, 'O_APPEND' in flags]
            if 'O_TRUNC' in flags and self.kind[ino] == 'f' and self.cur[ino]:
                self.data(rec, ino, [('t', 0)])
        elif name == 'close':
            self.fds.pop(fd_arg(args[0])[0], None)
        elif name in ('dup', 'dup2', 'dup3') or (name == 'fcntl' and 'F_DUPFD' in args[1]):
            self.fds.pop(ret, None)
            if fd_arg(args[0])[0] in self.fds:
                self.fds[ret] = self.fds[fd_arg(args[0])[0]]
        elif name in ('sync', 'syncfs'):
            self.emit(rec, 'gsync')
        elif name in PATH_ARGS:
            self.name_op(rec, [self.path_arg(args[d] if d is not None else None, args[p])
                               for d, p in PATH_ARGS[name]])
        elif args and name != 'sync_file_range':
            ent = self.open_file(args[0])
            if ent is None:
                return
            if name in ('fsync', 'fdatasync'):
                self.emit(rec, 'dsync' if self.kind[ent[0]] == 'd' else 'fsync', ino=ent[0])
            elif name == 'lseek':
                ent[1] = ret
            elif name in ('write', 'pwrite64'):
                self.write(rec, ent, num_arg(args[3]) if name == 'pwrite64' else None, str_arg(args[1])[:ret])
            elif name in ('writev', 'pwritev', 'pwritev2'):
                self.write(rec, ent, num_arg(args[3]) if name != 'writev' else None, iov_arg(args[1])[:ret])
            elif name == 'ftruncate':
                self.data(rec, ent[0], [('t', num_arg(args[1]))])
            elif name == 'fallocate':
                mode, off, n = args[1], num_arg(args[2]), num_arg(args[3])
                if 'PUNCH_HOLE' in mode or 'ZERO_RANGE' in mode:
                    self.data(rec, ent[0], [('z', off, n, 'KEEP_SIZE' in mode)])
                elif 'COLLAPSE' in mode or 'INSERT' in mode:
                    self.warnings.add('fallocate mode not modelled: ' + mode)
                elif 'KEEP_SIZE' not in mode:
                    self.data(rec, ent[0], [('g', off + n, b'')])
            elif name == 'copy_file_range' and ret > 0:
                dst = self.open_file(args[2])
                off_in = ent[1] if args[1] == 'NULL' else num_arg(args[1])
                ent[1] += ret if args[1] == 'NULL' else 0
                if dst is not None:
                    self.write(rec, dst, None if args[3] == 'NULL' else num_arg(args[3]),
                               bytes(self.cur[ent[0]][off_in:off_in + ret]))

    def name_op(self, rec, paths):
        name, a, b = rec[3], paths[0], paths[-1]
        if name == 'truncate':
            if a in self.names:
                self.data(rec, self.names[a], [('t', num_arg(rec[4][1]))])
        elif name in ('mkdir', 'mkdirat', 'symlink', 'symlinkat'):
            if b is not None:
                self.emit(rec, 'create', a=b, ino=self.new_inode(
                    'd' if name.startswith('mkdir') else 'l', b'' if name.startswith('mkdir') else str_arg(rec[4][0])))
        elif name in ('unlink', 'unlinkat', 'rmdir'):
            if b is not None:
                self.emit(rec, 'unlink', a=b)
        elif a is None and b is None:
            return
        elif a not in self.names:
            self.warnings.add('%s %s -> %s: not modelled (source unknown)' % (name, a, b))
        elif b is None:                        # renamed or linked out of D
            if name.startswith('rename'):
                self.emit(rec, 'unlink', a=a)
        elif name.startswith('link'):
            self.emit(rec, 'link', a=b, ino=self.names[a])
        else:
            self.emit(rec, 'exchange' if 'RENAME_EXCHANGE' in ''.join(rec[4][4:]) else 'rename', a=a, b=b)

# ----------------------------------------------------------------------------- crash states

def snapshot(d):
    """Every dir, file (with contents) and symlink under d, by relative path ('' = d)."""
    out = {'': ('d', b'')}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            if os.path.islink(p):
                out[os.path.relpath(p, d)] = ('l', os.readlink(p).encode())
            elif os.path.isdir(p):
                out[os.path.relpath(p, d)] = ('d', b'')
            elif not n.endswith('-shm'):
                out[os.path.relpath(p, d)] = ('f', open(p, 'rb').read())
    return out

def crash_state(model, cut, mode, rng):
    """The state a power cut right after events[cut] can leave: mode 'lost' (every unsynced op
    lost), 'kept' (every op kept) or 'random' (each unsynced piece, and how many unsynced name
    ops, drawn from rng). Returns {relative path: (kind, content)}."""
    evs = model.events[:cut + 1]
    p_keep = {'lost': 0.0, 'kept': 1.0}.get(mode) if mode != 'random' else rng.choice([0.2, 0.5, 0.8])
    gsync = max((e.start for e in evs if e.kind == 'gsync'), default=-1.0)
    barrier = max([gsync] + [e.start for e in evs if e.kind == 'dsync'])
    ns = [e for e in evs if e.kind in NAME_OPS]
    durable = sum(1 for e in ns if e.end < barrier)     # a prefix: events are in completion order
    n = {'lost': durable, 'kept': len(ns)}.get(mode) if mode != 'random' else rng.randint(durable, len(ns))
    names = dict(model.init_names)
    for e in ns[:n]:
        apply_name(names, e)
    synced = {}
    for e in evs:
        if e.kind == 'fsync':
            synced[e.ino] = max(synced.get(e.ino, -1.0), e.start)
    live, bufs = set(names.values()), {}
    for e in evs:
        if e.kind == 'data' and e.ino in live:
            buf = bufs.setdefault(e.ino, bytearray(model.init[e.ino]))
            covered = e.end < max(gsync, synced.get(e.ino, -1.0))
            for p in e.pieces:
                if covered or p_keep == 1.0 or (p_keep and rng.random() < p_keep):
                    apply_piece(buf, p)
    return {rel: (model.kind[i], bytes(bufs[i]) if i in bufs else model.init[i]) for rel, i in names.items()}

def state_hash(state):
    h = hashlib.sha256()
    for rel in sorted(state):
        kind, content = state[rel]
        h.update(b'%s\0%s\0%d\0' % (rel.encode('utf-8', 'surrogateescape'), kind.encode(), len(content)) + content)
    return h.hexdigest()

def write_state(state, d):
    """The state as a data directory: dirs 0700, files 0600, owned by the caller."""
    os.mkdir(d, 0o700)
    for rel in sorted(state, key=lambda r: (r.count('/'), r)):
        kind, content = state[rel]
        p = os.path.join(d, rel)
        if rel == '' or kind == 'd':
            os.makedirs(p, mode=0o700, exist_ok=True)
            os.chmod(p, 0o700)
            continue
        os.makedirs(os.path.dirname(p), mode=0o700, exist_ok=True)
        if kind == 'l':
            os.symlink(content, p)
        else:
            with open(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600), 'wb') as f:
                f.write(content)

# ----------------------------------------------------------------------------- checks

class Checker:
    """Checks one state: through a mount, then on the unmounted data directory."""

    def __init__(self, mtmfs, mnt, passfile, history, only):
        self.mtmfs, self.m, self.passfile, self.history, self.only = mtmfs, mnt, passfile, history, only
        self.counts = {s: 0 for s in STORES}

    def check(self, d, promises):
        """Mounts the state in d, checks the promises, unmounts, checks the data directory.
        Returns the failures, one line each."""
        rc, out = run([self.mtmfs, 'mount', '--data-dir', d, self.m])
        if rc or not is_mounted(self.m):
            force_unmount(self.m, d)
            return ['mount failed (rc %d): %s' % (rc, out)]
        fails = []
        try:
            sizes = self.cache_sizes()
            locked = False
            if any(p['store'] == 'accounts' for p in promises):
                rc, out = run([self.mtmfs, 'unlock', '--passphrase-file', self.passfile, self.m])
                if rc:
                    locked = True
                    fails.append('unlock failed (rc %d): %s' % (rc, out))
            for p in promises:
                if p['kind'] != 'rows' and not (locked and p['store'] == 'accounts'):
                    self.counts[p['store']] += 1
                    fails += self.check_promise(p, sizes)
            if 'cache' in self.only:
                fails += self.read_all_cache(sizes)
            for p in promises:
                if p['kind'] == 'rows':       # last: SQLite writes to the database it opens
                    self.counts['cache'] += 1
                    fails += self.check_rows(p)
        except OSError as e:
            fails.append('while checking through the mount: %s' % e)
        rc, out = run([self.mtmfs, 'unmount', self.m], timeout=120)
        if rc or is_mounted(self.m):
            fails.append('unmount failed (rc %d): %s' % (rc, out))
            force_unmount(self.m, d)
        return fails + self.check_data_dir(d)

    def cache_sizes(self):
        """st_size of every regular file of cache/, taken before any is opened (an open may
        bring up to date a size that stat, ls and the kernel went by)."""
        sizes = {}
        for root, _, files in os.walk(os.path.join(self.m, 'cache')):
            for n in files:
                st = os.lstat(os.path.join(root, n))
                if stat.S_ISREG(st.st_mode):
                    sizes[os.path.relpath(os.path.join(root, n), self.m)] = st.st_size
        return sizes

    def check_promise(self, p, sizes):
        path, kind, want = os.path.join(self.m, p['path']), p['kind'], p['want']
        if kind == 'absent':
            return ['%s exists, its deletion was promised' % p['path']] if os.path.lexists(path) else []
        try:
            with open(path, 'rb') as f:
                data = f.read()
        except OSError as e:
            return ['%s: %s (promised: %s)' % (p['path'], e.strerror, kind)]
        if kind == 'value':
            allowed = self.history[p['path']][want:]
            return [] if data in allowed else ['%s reads %r, promised one of %r' % (p['path'], data[:60], allowed)]
        what = '%s %d bytes promised' % ('exactly' if kind == 'exact' else 'a prefix of', len(want))
        size = sizes.get(p['path'], -1)
        if size < len(want) or (kind == 'exact' and size != len(want)):
            return ['%s: stat says %d bytes, %s' % (p['path'], size, what)]
        if data == want if kind == 'exact' else data.startswith(want):
            return []
        diff = next((i for i, (x, y) in enumerate(zip(data, want)) if x != y), min(len(data), len(want)))
        return ['%s: %d bytes read, %s (first difference at byte %d)' % (p['path'], len(data), what, diff)]

    def read_all_cache(self, sizes):
        """Every regular file of cache/ reads back, without error, exactly the st_size that
        stat said before any file was opened."""
        fails = []
        for rel, size in sorted(sizes.items()):
            try:
                with open(os.path.join(self.m, rel), 'rb') as f:
                    got = len(f.read())
                if got != size:
                    fails.append('%s: st_size %d but %d bytes read' % (rel, size, got))
            except OSError as e:
                fails.append('%s: read failed: %s' % (rel, e))
        return fails

    def check_rows(self, p):
        path = os.path.join(self.m, p['path'])
        if not os.path.exists(path):
            return ['%s missing, %d committed rows promised' % (p['path'], p['want'])]
        try:
            db = sqlite3.connect(path, timeout=30)
            ic = db.execute('PRAGMA integrity_check').fetchall()
            n = db.execute('SELECT count(*) FROM t').fetchone()[0]
            db.close()
        except sqlite3.Error as e:
            return ['%s: SQLite error %s (%d committed rows promised)' % (p['path'], e, p['want'])]
        fails = [] if ic == [('ok',)] else ['%s: integrity_check says %s' % (p['path'], ic[:3])]
        return fails + ([] if n >= p['want'] else ['%s: %d rows, %d committed' % (p['path'], n, p['want'])])

    def check_data_dir(self, d):
        """After the unmount: `mtmfs check` (the lines of the stores checked), cache.sqlite's
        integrity, and no data file in cache.data/ that no row names."""
        fails = []
        rc, out = run([self.mtmfs, 'check', '--data-dir', d])
        if rc:
            store_of = {'vault': 'accounts', 'Settings.plist': 'settings', 'cache.sqlite': 'cache'}
            bad = [l for l in out.splitlines() if not l.endswith(': ok')]
            if not bad or any(store_of.get(l.split(':')[0], 'cache') in self.only for l in bad):
                fails.append('mtmfs check exit %d: %s' % (rc, ' | '.join(bad or [out])))
        if 'cache' not in self.only:
            return fails
        db = os.path.join(d, 'cache.sqlite')
        rc, out = run(['sqlite3', db, 'PRAGMA integrity_check'])
        if rc or out != 'ok':
            fails.append('cache.sqlite integrity_check: %s' % out[:200])
        rc, out = run(['sqlite3', db, 'SELECT data FROM inodes WHERE data IS NOT NULL'])
        if rc:
            return fails + ['cache.sqlite: %s' % out[:200]]
        folder = os.path.join(d, 'cache.data')
        orphans = sorted(set(os.listdir(folder)) - set(out.split())) if os.path.isdir(folder) else []
        if orphans:
            fails.append('cache.data/ holds %d data file(s) that no row names (a data file outliving its '
                         'file): %s' % (len(orphans), ', '.join(orphans)))
        return fails

# ----------------------------------------------------------------------------- main

def traced_session(args, work, passfile):
    """init; a first session (untraced) and its clean unmount; sync; the snapshot; then the
    traced session: strace starts the daemon, the workload runs, the unmount ends both."""
    d, mnt = os.path.join(work, 'data'), os.path.join(work, 'mnt')
    os.mkdir(mnt)
    wl = Workload(args.mtmfs, mnt, passfile, args.seed)
    try:
        for cmd in (['init', '--data-dir', d, '--kdf', 'interactive', '--passphrase-file', passfile],
                    ['mount', '--data-dir', d, mnt], wl.setup, ['unmount', mnt], ['sync']):
            rc, out = (0, cmd()) if callable(cmd) else run(([] if cmd == ['sync'] else [args.mtmfs]) + cmd, 120)
            if rc:
                raise SystemExit('%s failed: %s' % (cmd[0], out))
    except BaseException:
        force_unmount(mnt, d)
        raise
    snap = snapshot(d)
    if args.keep:
        shutil.copytree(d, os.path.join(work, 'initial'), symlinks=True)
    trace = os.path.join(work, 'trace')
    with open(os.path.join(work, 'daemon.log'), 'wb') as errlog:
        st = subprocess.Popen(['strace', '-f', '-qq', '-ttt', '-T', '-y', '-xx', '-s', '8388608', '-e',
                               'trace=' + SYSCALLS, '-o', trace, args.mtmfs, 'mount', '-f', '--data-dir', d, mnt],
                              stdout=errlog, stderr=errlog)
    try:
        deadline = time.time() + 60
        while not is_mounted(mnt):
            if time.time() > deadline or st.poll() is not None:
                raise SystemExit('the traced mount did not come up; see %s/daemon.log' % work)
            time.sleep(0.05)
        wl.run()
        st.wait(timeout=120)
    finally:
        if st.poll() is None:
            force_unmount(mnt, d)
            st.kill()
            st.wait()
    return d, mnt, snap, trace, wl

def main():
    ap = argparse.ArgumentParser(description='power-cut crash states for mtmfs (SPEC §0, §5)')
    ap.add_argument('--mtmfs', required=True, help='the mtmfs binary (copied: a rebuild meanwhile is harmless)')
    ap.add_argument('--short', action='store_true', help='about 2/3 of the cuts and one random state per cut')
    ap.add_argument('--seed', type=int, default=1, help='of the workload and the random states')
    ap.add_argument('--states-per-cut', type=int, help='random states per cut (default 3; 1 with --short)')
    ap.add_argument('--keep', action='store_true', help='keep the work directory: trace, events, failing states')
    ap.add_argument('--only', choices=STORES, help="check only this store's promises and checks")
    args = ap.parse_args()
    k = args.states_per_cut if args.states_per_cut is not None else (1 if args.short else 3)
    only = (args.only,) if args.only else STORES
    work = os.path.realpath(tempfile.mkdtemp(prefix='crashstates-', dir='/tmp'))
    shutil.copy2(args.mtmfs, os.path.join(work, 'mtmfs'))
    # mtmfs runs mtmfs-core beside it for every command but run, inject, read and find.
    core = os.path.join(os.path.dirname(os.path.realpath(args.mtmfs)), 'mtmfs-core')
    if os.path.exists(core):
        shutil.copy2(core, os.path.join(work, 'mtmfs-core'))
    args.mtmfs, passfile, mnt = os.path.join(work, 'mtmfs'), os.path.join(work, 'passphrase'), os.path.join(work, 'mnt')
    with open(passfile, 'w') as f:
        f.write('correct horse battery staple 42 crash states\n')
    state_dir, passed, failed = None, 0, 0
    try:
        d, mnt, snap, trace, wl = traced_session(args, work, passfile)
        model = Model(d, snap)
        for rec in read_records(trace):
            model.step(rec)
        for w in sorted(model.warnings):
            log('model warning:', w)
        evs = model.events
        cuts = [i for i, e in enumerate(evs) if e.kind in NAME_OPS + SYNC_OPS]
        if args.short:
            cuts = [c for j, c in enumerate(cuts) if j % 3 == 0 or evs[c].kind in SYNC_OPS and j % 2 == 0]
        cuts = [(c, evs[c].end, evs[c].desc) for c in cuts] + [(len(evs) - 1, float('inf'), 'the end: daemon exited')]
        promises = sorted((p for p in wl.promises if p['store'] in only), key=lambda p: p['t'])
        if args.keep:
            with open(os.path.join(work, 'events.txt'), 'w') as f:
                f.writelines('%d %.6f %.6f %s %s\n' % (i, e.start, e.end, e.kind, e.desc) for i, e in enumerate(evs))
            with open(os.path.join(work, 'promises.txt'), 'w') as f:
                f.writelines('%.6f %s %s %s\n' % (p['t'], p['store'], p['kind'], p['path']) for p in promises)
        log('trace: %d events on the data directory (%d name ops, %d syncs); %d cuts; %d promises'
            % (len(evs), sum(e.kind in NAME_OPS for e in evs), sum(e.kind in SYNC_OPS for e in evs),
               len(cuts), len(promises)))
        checker = Checker(args.mtmfs, mnt, passfile, wl.history, only)
        seen, generated, distinct = set(), 0, {}
        for ci, (cut, t, desc) in enumerate(cuts):
            due = [p for p in promises if p['t'] < t]
            for label in ['lost', 'kept'] + ['random%d' % j for j in range(k)]:
                rng = random.Random('%d-%d-%s' % (args.seed, cut, label))
                state = crash_state(model, cut, label.rstrip('0123456789'), rng)
                generated += 1
                key = (state_hash(state), len(due))
                if key in seen:
                    continue
                seen.add(key)
                state_dir = os.path.join(work, 'state-%d-%s' % (ci, label))
                write_state(state, state_dir)
                fails = checker.check(state_dir, due)
                if fails:
                    failed += 1
                    log('FAIL cut %d (event %d of %d: %s) variant %s:' % (ci, cut, len(evs), desc, label))
                    for f in fails:
                        log('    ' + f)
                        kind = re.sub(r'(?<=st_size )\d+|\d+(?= bytes)|(?<=byte )\d+|(?<=rc )\d+', 'N', f)
                        distinct.setdefault(kind, (ci, label, desc, f))
                else:
                    passed += 1
                if not (fails and args.keep):
                    shutil.rmtree(state_dir, ignore_errors=True)
                state_dir = None
        log('states generated: %d, states checked: %d (the rest duplicates)' % (generated, passed + failed))
        log('promises checked: ' + ', '.join('%s %d' % (s, checker.counts[s]) for s in STORES))
        log('failures: %d states, %d distinct:' % (failed, len(distinct)))
        for ci, label, desc, f in distinct.values():
            log('  - %s\n      first at cut %d (%s), variant %s' % (f, ci, desc, label))
    finally:
        if is_mounted(mnt):
            force_unmount(mnt, state_dir or os.path.join(work, 'data'))
        if args.keep:
            log('work directory kept: ' + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    log('%d passed, %d failed' % (passed, failed))
    sys.exit(1 if failed else 0)

if __name__ == '__main__':
    main()
