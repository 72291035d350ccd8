#!/usr/bin/env python3
"""Mounts real property lists as settings/ and checks what mtmfs shows and writes (SPEC §4).

    check.py [--verbose] [--only NAME] PLIST_DIR MTMFS_BIN

For each file in PLIST_DIR whose name ends in "plist" (.plist, .bplist):

 1. a fresh data directory (`mtmfs init --kdf interactive`) whose Settings.plist is the file;
 2. mount it. plistlib is the reference (told the format is XML when its guess fails, as it
    guesses XML only from a leading `<?xml` or `<plist`). A file plistlib reads as a dict
    whose values all have a text form must be shown: every key under settings/ (dicts as
    directories, arrays as directories 0..n-1), each value rendered as SPEC §4 says. Any
    other file (unreadable, root not a dict, a keyed-archiver UID, a null, an integer out
    of -2^63..2^64-1) must make settings/ answer EIO and `.mtmfs/status` say
    settings_error=...;
 3. unmount: the file must be byte-identical;
 4. (readable ones) mount again, `echo` a new value into one scalar key (an integer if
    there is one) and edit another string key with `vim -es -c '%s/C/Z/' -c wq`, unmount:
    plistlib must find exactly those two keys changed (to the values meant), every other
    value, the key order and the format (XML or binary) as they were; in a binary file
    every integer keeps the width it had (a changed one too, if its new value fits).

Keys that cannot be file names (empty, containing "/", "." or "..", over 255 bytes) and
keys holding "%" are compared under the names SPEC §4's rule gives them (`file_name`).
Prints one line per plist and a final "N passed, M failed".
"""
import argparse
import base64
import hashlib
import copy
import datetime
import math
import os
import plistlib
import shutil
import struct
import subprocess
import sys
import tempfile

INT_MIN, UINT_MAX = -2**63, 2**64 - 1


class Failure(Exception):
    pass


def load(data):
    """plistlib's value, guessing XML as Core Foundation does."""
    try:
        return plistlib.loads(data)
    except plistlib.InvalidFileException:
        if data.startswith(b'bplist'):
            raise
        return plistlib.loads(data, fmt=plistlib.FMT_XML)


def unshowable(value, depth=0):
    """Why SPEC §4 refuses a value plistlib read, or None."""
    if depth > 500:
        return 'nesting deeper than mtmfs reads'
    if isinstance(value, plistlib.UID):
        return 'a keyed-archiver UID'
    if value is None:
        return 'a null'
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if INT_MIN <= value <= UINT_MAX else 'an integer out of range'
    if isinstance(value, datetime.datetime):
        return None if 1 <= value.year <= 9999 else 'a date out of range'
    if isinstance(value, dict):
        for item in value.values():
            reason = unshowable(item, depth + 1)
            if reason:
                return reason
    if isinstance(value, list):
        for item in value:
            reason = unshowable(item, depth + 1)
            if reason:
                return reason
    return None


def file_name(key):
    """The file name mtmfs gives a dictionary key (SPEC §4): `%` as `%25`, `/` as `%2F`,
    `.`/`..` as `%2E`/`%2E%2E`, the empty key `%`; over 255 bytes cut at a character
    boundary, with `~` and the first 8 hex digits of the key's SHA-256."""
    special = {'': '%', '.': '%2E', '..': '%2E%2E'}
    name = special.get(key) or key.replace('%', '%25').replace('/', '%2F')
    if len(name.encode('utf-8')) <= 255:
        return name
    while len(name.encode('utf-8')) > 255 - 9:
        name = name[:-1]
    return name + '~' + hashlib.sha256(key.encode('utf-8')).hexdigest()[:8]


def valid_name(key):
    """Whether the key is its own file name (the edits pick such keys: any would do)."""
    return file_name(key) == key


def render(value):
    """The bytes `cat` shows for a scalar (SPEC §4), reals excepted (see same_real)."""
    if isinstance(value, bool):
        text = 'true' if value else 'false'
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value
    elif isinstance(value, datetime.datetime):
        text = '%04d-%02d-%02dT%02d:%02d:%02dZ' % (value.year, value.month, value.day,
                                                   value.hour, value.minute, value.second)
    elif isinstance(value, bytes):
        text = base64.b64encode(value).decode()
    else:
        raise TypeError(type(value))
    return text.encode('utf-8') + b'\n'


def same_real(shown, value):
    """Shortest round-trip text with a '.' or an exponent (inf, -inf, nan as such)."""
    if not shown.endswith(b'\n'):
        return False
    text = shown[:-1].decode()
    if math.isnan(value):
        return text == 'nan'
    if math.isinf(value):
        return text == ('inf' if value > 0 else '-inf')
    return ('.' in text or 'e' in text) and float(text) == value and \
        struct.pack('>d', float(text)) == struct.pack('>d', value) and len(text) <= len(repr(value)) + 2


class Counts:
    def __init__(self):
        self.compared = self.skipped = 0


def compare_tree(path, value, counts, where):
    """The directory at `path` shows `value` (a dict or list)."""
    names = set(os.listdir(path))
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items()]
        wanted = {file_name(k) for k, _ in items}
        counts.skipped += sum(1 for k, _ in items if file_name(k) != k)  # (shown escaped)
        missing = wanted - names
        if missing:
            raise Failure('%s: keys not shown: %r' % (where or '/', sorted(missing)[:5]))
        extra = names - wanted
        if extra:
            raise Failure('%s: names that are not keys: %r' % (where or '/', sorted(extra)[:5]))
    else:
        items = [(str(i), v) for i, v in enumerate(value)]
        if names != {k for k, _ in items}:
            raise Failure('%s: array shows %r, not 0..%d' % (where, sorted(names)[:5], len(items) - 1))
    for key, item in items:
        name = file_name(key) if isinstance(value, dict) else key
        child, at = os.path.join(path, name), where + '/' + key
        if isinstance(item, (dict, list)):
            if not os.path.isdir(child):
                raise Failure('%s: a container that is not a directory' % at)
            compare_tree(child, item, counts, at)
            continue
        with open(child, 'rb') as f:
            shown = f.read()
        ok = same_real(shown, item) if isinstance(item, float) else shown == render(item)
        if not ok:
            raise Failure('%s: shows %r, plistlib has %r' % (at, shown[:80], item))
        counts.compared += 1


def binary_integer_widths(data):
    """{path: bytes} for every integer in a binary plist's dicts and arrays."""
    offset_size, ref_size = data[-26], data[-25]
    count, top, table = struct.unpack('>QQQ', data[-24:])
    offsets = [int.from_bytes(data[table + i * offset_size:table + (i + 1) * offset_size], 'big') for i in range(count)]
    widths = {}

    def length(marker, at):
        if marker & 0x0F != 0x0F:
            return marker & 0x0F, at
        size = 1 << (data[at] & 0x0F)
        return int.from_bytes(data[at + 1:at + 1 + size], 'big'), at + 1 + size

    def walk(index, path, depth=0):
        at = offsets[index]
        marker = data[at]
        if marker >> 4 == 0x1:
            widths[path] = 1 << (marker & 0x0F)
        elif marker >> 4 in (0xA, 0xD) and depth < 400:
            n, at = length(marker, at + 1)
            refs = [int.from_bytes(data[at + i * ref_size:at + (i + 1) * ref_size], 'big') for i in range(n * (2 if marker >> 4 == 0xD else 1))]
            if marker >> 4 == 0xA:
                for i, ref in enumerate(refs):
                    walk(ref, path + (str(i),), depth + 1)
            else:
                for key_ref, value_ref in zip(refs[:n], refs[n:]):
                    key = load_object(key_ref)
                    walk(value_ref, path + (key,), depth + 1)

    def load_object(index):
        at = offsets[index]
        marker = data[at]
        n, at = length(marker, at + 1)
        if marker >> 4 == 0x5:
            return data[at:at + n].decode('ascii')
        return data[at:at + 2 * n].decode('utf-16-be')

    walk(top, ())
    return widths


def fits(value, width):
    if width in (1, 2, 4):
        return 0 <= value < 1 << (8 * width)
    if width == 8:
        return INT_MIN <= value < 2**63
    return True


def pick_edits(root):
    """(path, new value, shell text) for `echo`, and (path, char) for vim: an integer first."""
    scalars, strings = [], []

    def walk(value, path):
        for key, item in value.items():
            if not valid_name(key):
                continue
            if isinstance(item, dict):
                walk(item, path + (key,))
            elif not isinstance(item, list):
                scalars.append((path + (key,), item))
                if isinstance(item, str) and '\r' not in item and '\n' not in item and \
                        any(c.isascii() and c.isalnum() and c != 'Z' for c in item):
                    strings.append((path + (key,), item))

    walk(root, ())
    vim = None
    if strings:
        path, text = strings[0]
        char = next(c for c in text if c.isascii() and c.isalnum() and c != 'Z')
        vim = (path, char, text.replace(char, 'Z', 1))
    def is_int(value):
        return isinstance(value, int) and not isinstance(value, bool)
    # An integer first, one above Int64.max if there is one (its 16-byte width must stay).
    ordered = sorted(scalars, key=lambda s: (not is_int(s[1]), not (is_int(s[1]) and s[1] > 2**63 - 1)))
    for path, value in ordered:
        if vim and path == vim[0]:
            continue
        if isinstance(value, bool):
            new, text = (not value), ('false' if value else 'true')
        elif isinstance(value, int):
            new = value + 1 if value < UINT_MAX else value - 1
            text = str(new)
        elif isinstance(value, float):
            new = 2.5 if value != 2.5 else 3.25
            text = repr(new)
        elif isinstance(value, str):
            if any(ord(c) < 0x20 for c in value):
                continue
            new = value + ' edited'
            text = new
        elif isinstance(value, datetime.datetime):
            new = datetime.datetime(2021, 3, 4, 5, 6, 7)
            text = '2021-03-04T05:06:07Z'
        elif isinstance(value, bytes):
            new = b'edited'
            text = base64.b64encode(new).decode()
        else:
            continue
        return (path, new, text), vim
    return None, vim


def get(root, path):
    for key in path:
        root = root[key]
    return root


def set_path(root, path, value):
    for key in path[:-1]:
        root = root[key]
    root[path[-1]] = value


def deep_equal(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack('>d', a) == struct.pack('>d', b) or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    return a == b


class Harness:
    def __init__(self, mtmfs, verbose):
        self.mtmfs, self.verbose = mtmfs, verbose

    def run(self, *args, timeout=60, check=True):
        done = subprocess.run(args, capture_output=True, timeout=timeout)
        if check and done.returncode != 0:
            raise Failure('%s exited %d: %s' % (' '.join(map(str, args[:2])), done.returncode,
                                                (done.stderr or done.stdout).decode(errors='replace').strip()[:200]))
        return done

    def mount(self, data, mnt):
        self.run(self.mtmfs, 'mount', '--data-dir', data, mnt)

    def unmount(self, mnt):
        self.run(self.mtmfs, 'unmount', mnt, timeout=120)

    def check(self, path):
        original = open(path, 'rb').read()
        try:
            value = load(original)
            reason = unshowable(value) if isinstance(value, dict) else 'the root is a %s' % type(value).__name__
        except Exception as e:  # noqa: BLE001 — any refusal by plistlib
            value, reason = None, 'plistlib: %s' % (str(e)[:60] or type(e).__name__)
        work = tempfile.mkdtemp(prefix='mtmfs-realplist-')
        data, mnt, passphrase = os.path.join(work, 'data'), os.path.join(work, 'mnt'), os.path.join(work, 'pass')
        os.mkdir(mnt)
        with open(passphrase, 'w') as f:
            f.write(base64.b64encode(os.urandom(24)).decode() + '\n')
        mounted = False
        try:
            self.run(self.mtmfs, 'init', '--data-dir', data, '--kdf', 'interactive', '--passphrase-file', passphrase)
            settings = os.path.join(data, 'Settings.plist')
            shutil.copyfile(path, settings)
            self.mount(data, mnt)
            mounted = True
            if reason:
                try:
                    os.listdir(os.path.join(mnt, 'settings'))
                    raise Failure('settings/ is listed, but the file should be refused (%s)' % reason)
                except OSError as e:
                    if e.errno != 5:
                        raise Failure('settings/ answers %s, not EIO (%s)' % (os.strerror(e.errno), reason))
                status = open(os.path.join(mnt, '.mtmfs', 'status')).read()
                line = next((l for l in status.splitlines() if l.startswith('settings_error=')), None)
                if not line:
                    raise Failure('no settings_error in .mtmfs/status (%s)' % reason)
                self.unmount(mnt)
                mounted = False
                if open(settings, 'rb').read() != original:
                    raise Failure('a refused file was rewritten')
                shown = line[len('settings_error='):].replace(settings + ': ', '')
                return 'settings_error as expected (%s): %s' % (reason, shown[:100])
            counts = Counts()
            compare_tree(os.path.join(mnt, 'settings'), value, counts, '')
            self.unmount(mnt)
            mounted = False
            if open(settings, 'rb').read() != original:
                raise Failure('the file changed though nothing was written')
            summary = '%d values shown alike, %d of them under escaped names' % (counts.compared, counts.skipped)
            return summary + self.edit(data, mnt, settings, original, value)
        finally:
            if mounted:
                subprocess.run([self.mtmfs, 'unmount', '--lazy', mnt], capture_output=True, timeout=120)
            if not self.verbose:
                shutil.rmtree(work, ignore_errors=True)

    def edit(self, data, mnt, settings, original, value):
        echo, vim = pick_edits(value)
        if not echo and not vim:
            return '; no scalar key to edit'
        self.mount(data, mnt)
        try:
            expected = copy.deepcopy(value)
            done = []
            if echo:
                target = os.path.join(mnt, 'settings', *echo[0])
                # dash's echo reads backslashes as escapes: printf writes such text as it is.
                line = 'echo "$1" > "$2"' if '\\' not in echo[2] else 'printf "%s\\n" "$1" > "$2"'
                self.run('sh', '-c', line, 'sh', echo[2], target)
                set_path(expected, echo[0], echo[1])
                done.append('echo %s' % '/'.join(echo[0]))
            if vim:
                target = os.path.join(mnt, 'settings', *vim[0])
                self.run('vim', '-es', '-i', 'NONE', '-c', '%%s/%s/Z/' % vim[1], '-c', 'wq', target)
                set_path(expected, vim[0], vim[2])
                done.append('vim %s' % '/'.join(vim[0]))
        finally:
            self.unmount(mnt)
        written = open(settings, 'rb').read()
        if written.startswith(b'bplist00') != original.startswith(b'bplist00'):
            raise Failure('the format changed (%s)' % ', '.join(done))
        after = load(written)
        if not deep_equal(after, expected):
            changed = [k for k in set(after) | set(expected) if not deep_equal(after.get(k), expected.get(k))]
            raise Failure('after %s, top-level keys differ from what was meant: %r' % (', '.join(done), changed[:5]))
        if original.startswith(b'bplist00'):
            before_widths, after_widths = binary_integer_widths(original), binary_integer_widths(written)
            for path, width in before_widths.items():
                if path in after_widths and after_widths[path] != width and fits(get(after, path), width):
                    raise Failure('integer %s was %d bytes wide, now %d' % ('/'.join(path), width, after_widths[path]))
        return '; %s: exactly those keys changed, format kept' % ' and '.join(done)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('directory')
    parser.add_argument('mtmfs')
    parser.add_argument('--only')
    parser.add_argument('--verbose', action='store_true', help='keep the work directories')
    args = parser.parse_args()
    harness = Harness(os.path.abspath(args.mtmfs), args.verbose)
    names = sorted(n for n in os.listdir(args.directory)
                   if n.endswith('plist') and os.path.isfile(os.path.join(args.directory, n)))
    if args.only:
        names = [n for n in names if args.only in n]
    passed = failed = 0
    for name in names:
        try:
            result = harness.check(os.path.join(args.directory, name))
            print('PASS %s: %s' % (name, result), flush=True)
            passed += 1
        except (Failure, OSError, subprocess.TimeoutExpired) as e:
            print('FAIL %s: %s' % (name, e), flush=True)
            failed += 1
    print('%d passed, %d failed' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
