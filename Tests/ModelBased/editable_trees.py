#!/usr/bin/env python3
"""Model-based test of mtmfs's editable trees (settings/ and accounts/, SPEC §0, §2, §4).

Seeded random sequences of operations over a pool of hard names — digits, `.bak`,
`.tmp`, dot names, `%` escapes, 255-byte names, unicode, names editors use (`K~`, `#K#`,
`4914` next to vim's `4913`) — are run on a real mount: create, write, append, truncate,
rename (onto keys, into and out of a dictionary), unlink, mkdir, type changes, array
elements (set, append, past the end, unlink), and the save sequences of real tools (vim
with and without backupcopy, sed -i, perl -pi, ed, install, mv and cp from another file
system, tee, `>`, `>>`, truncate, Python). After each step every name `ls` shows and
every file's content is compared with a model; after each seed the mount is unmounted,
`Settings.plist` is read with plistlib and compared with the model's keys, types and
values, and the mount is mounted again and compared once more.

A failure prints the tree, the seed, the step and the last steps, and the run exits 1.

What the model leaves out: key order in the plist (not visible through the files), the
kernel's caches (each check reads through the mount), guarding, and values that do not
fit their key's type given to editors (only direct writes try those, expecting EINVAL).

    editable_trees.py --mtmfs PATH [--seeds N] [--first-seed S] [--steps N] [--tree settings|accounts|both]
"""
import argparse
import errno
import os
import plistlib
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

PASSPHRASE = "model based test passphrase 7731\n"


class Failure(Exception):
    pass


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=60, **kw)


def sh(command, cwd):
    return subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, LC_ALL="C.UTF-8"))


def poll(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "surrogateescape")


def write(path, text, mode="w"):
    """Open, write, close; the errno of whichever call failed, or 0."""
    try:
        with open(path, mode + "b") as f:
            if text:
                f.write(text.encode())
        return 0
    except OSError as e:
        return e.errno


# ---------------------------------------------------------------------------------------
# settings/: the plist's rules for text (SPEC §4), as far as the value pool needs them

VALUES = ["abc", "42", "2.5", "true", "2024-01-02T03:04:05Z", "héllo wörld", "", "-7", "x y"]


def infer(text):
    t = text.strip()
    if t.lower() in ("true", "false"):
        return "bool"
    try:
        int(t)
        if t and (t[0].isdigit() or t[0] == "-"):
            return "integer"
    except ValueError:
        pass
    if any(c in t for c in ".eE") and t[:1] and (t[0].isdigit() or t[0] in "-."):
        try:
            float(t)
            return "real"
        except ValueError:
            pass
    if len(t) >= 20 and t.endswith("Z") and "T" in t:
        return "date"
    return "string"


def parse(text, typ):
    """The canonical text of `text` as a value of `typ`, or None when it does not fit."""
    if typ == "string":
        return text
    t = text.strip()
    if typ == "bool":
        v = {"true": "true", "yes": "true", "1": "true", "on": "true",
             "false": "false", "no": "false", "0": "false", "off": "false"}.get(t.lower())
        return v
    if typ == "integer":
        try:
            return str(int(t)) if t and t.lstrip("-").isdigit() else None
        except ValueError:
            return None
    if typ == "real":
        try:
            x = float(t) if t and not t.lower().startswith(("n", "i", "+n", "+i", "-n", "-i")) else None
        except ValueError:
            return None
        if x is None:
            return None
        r = repr(x)
        return r if ("." in r or "e" in r) else r + ".0"
    if typ == "date":
        return t if infer(t) == "date" else None
    return None


def key_of(name):
    """The plist key a file name shows (the naming rule of SPEC §4)."""
    if name == "%":
        return ""
    if name == "%2E":
        return "."
    if name == "%2E%2E":
        return ".."
    return name.replace("%2F", "/").replace("%25", "%")


class Value:
    def __init__(self, typ, canonical, shown=None):
        self.typ, self.canonical = typ, canonical
        self.shown = canonical if shown is None else shown

    def text(self):
        return self.shown + "\n"


class SettingsModel:
    """The plist as a dictionary of names (as files show them) to `Value`, dictionaries
    (`dict`) and arrays (`list` of `Value`); removed keys' types (the mount's tombstones)."""

    def __init__(self):
        self.root = {"IsFirstRun": Value("bool", "true"), "ActiveServiceAccountUUID": Value("string", "")}
        self.tombstones = {}

    def after_remount(self):
        self.tombstones = {}

        def canon(d):
            for k, v in d.items():
                if isinstance(v, Value):
                    v.shown = v.canonical
                elif isinstance(v, dict):
                    canon(v)
                else:
                    for e in v:
                        e.shown = e.canonical
        canon(self.root)

    def as_plist(self):
        def conv(v):
            if isinstance(v, Value):
                if v.typ == "bool":
                    return v.canonical == "true"
                if v.typ == "integer":
                    return int(v.canonical)
                if v.typ == "real":
                    return float(v.canonical)
                if v.typ == "date":
                    return ("date", v.canonical)
                return v.canonical
            if isinstance(v, dict):
                return {key_of(k): conv(x) for k, x in v.items()}
            return [conv(x) for x in v]
        return conv(self.root)


def plist_normal(value):
    import datetime
    if isinstance(value, dict):
        return {k: plist_normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plist_normal(v) for v in value]
    if isinstance(value, datetime.datetime):
        return ("date", value.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return value


ROOT_NAMES = ["K", "2024", "notes.bak", "x.tmp", "x.swp", ".hidden", "½", "一二三", "a%25b", "a%2Fb",
              "%", "%2E", "L" * 255, "4914", "x.save.bak", "Value"]
EDITOR_NAMES = ["K~", "#K#"]  # made by a program that exits: keys once it has
DICT = "Dict"
ARRAY = "Arr"
TOOLS = ["python", "vim", "vim backupcopy=yes", "sed -i", "perl -pi", "ed", "install", "mv", "cp", "tee", ">"]


class Runner:
    def __init__(self, mtmfs, tree, seed, steps):
        self.mtmfs, self.tree, self.seed, self.steps = mtmfs, tree, seed, steps
        self.rng = random.Random(seed)
        self.log = []
        self.scratch = tempfile.mkdtemp(prefix=f"mtmfs-model-{tree}-{seed}.")
        self.data = os.path.join(self.scratch, "data")
        self.mount_point = os.path.join(self.scratch, "m")
        self.outside = os.path.join(self.scratch, "outside")  # another file system? same one: /tmp
        os.mkdir(self.mount_point)
        os.mkdir(self.outside)
        self.pass_file = os.path.join(self.scratch, "pass")
        with open(self.pass_file, "w") as f:
            f.write(PASSPHRASE)

    # -- mount --------------------------------------------------------------------------
    def mount(self):
        r = run([self.mtmfs, "mount", "--data-dir", self.data, self.mount_point])
        if r.returncode != 0:
            raise Failure(f"mount failed: {r.stderr}")
        if self.tree == "accounts":
            r = run([self.mtmfs, "unlock", "--passphrase-file", self.pass_file, self.mount_point])
            if r.returncode != 0:
                raise Failure(f"unlock failed: {r.stderr}")

    def unmount(self):
        r = run([self.mtmfs, "unmount", self.mount_point])
        if r.returncode != 0:
            raise Failure(f"unmount failed: {r.stderr}")

    def close(self):
        subprocess.run(["fusermount3", "-uz", self.mount_point], capture_output=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def note(self, text):
        self.log.append(text)

    def check(self, condition, what):
        if not condition:
            raise Failure(what)

    # -- settings -----------------------------------------------------------------------
    def settings_path(self, *parts):
        return os.path.join(self.mount_point, "settings", *parts)

    def run_settings(self):
        r = run([self.mtmfs, "init", "--data-dir", self.data, "--kdf", "interactive", "--passphrase-file", self.pass_file])
        if r.returncode != 0:
            raise Failure(f"init failed: {r.stderr}")
        self.mount()
        m = SettingsModel()
        self.check(os.mkdir(self.settings_path(DICT)) is None, "mkdir")
        m.root[DICT] = {}
        os.mkdir(self.settings_path(ARRAY))
        os.setxattr(self.settings_path(ARRAY), "user.plist.type", b"array")
        m.root[ARRAY] = []
        for step in range(self.steps):
            self.settings_step(m, step)
            self.compare_settings(m, f"step {step}")
        self.unmount()
        with open(os.path.join(self.data, "Settings.plist"), "rb") as f:
            stored = plist_normal(plistlib.load(f))
        self.check(stored == m.as_plist(), f"after the unmount the plist holds {stored!r}, the model {m.as_plist()!r}")
        self.mount()
        m.after_remount()
        self.compare_settings(m, "after a remount")
        self.unmount()

    def compare_settings(self, m, when):
        def compare(path, model):
            shown = sorted(os.listdir(self.settings_path(*path)))
            if isinstance(model, dict):
                expected = sorted(model)
            else:
                expected = sorted(str(i) for i in range(len(model)))
            self.check(shown == expected, f"{when}: ls {'/'.join(path) or '.'} shows {shown}, the model {expected}")
            items = model.items() if isinstance(model, dict) else ((str(i), v) for i, v in enumerate(model))
            for name, value in items:
                if isinstance(value, Value):
                    got = read(self.settings_path(*path, name))
                    self.check(got == value.text(), f"{when}: {'/'.join(path + [name])} reads {got!r}, the model {value.text()!r}")
                else:
                    compare(path + [name], value)
        compare([], m.root)

    def settings_step(self, m, step):
        rng = self.rng
        op = rng.choice(["write", "write", "write", "append", "truncate", "rename", "unlink", "tool", "tool",
                         "element", "element", "editor name", "type"])
        # A directory and a name in it (the root or Dict).
        where = [] if rng.random() < 0.8 else [DICT]
        d = m.root if not where else m.root[DICT]
        name = rng.choice(ROOT_NAMES + [n for n in EDITOR_NAMES if n in d])
        path = self.settings_path(*where, name)
        current = d.get(name)
        if isinstance(current, (dict, list)):
            return
        value = rng.choice(VALUES)
        self.note(f"{op} {'/'.join(where + [name])!r} {value!r}")
        if op == "write":
            e = write(path, value + ("\n" if rng.random() < 0.7 else ""))
            self.apply_write(m, d, name, value, e, (where, name))
        elif op == "append":
            if current is None or current.typ != "string" or current.canonical == "":
                return
            e = write(path, "tail\n", "a")
            self.check(e == 0, f"append to a string key: errno {e}")
            current.canonical = current.shown = current.canonical + "\ntail"
        elif op == "truncate":
            if current is None:
                return
            r = sh(f"truncate -s 0 '{name}'", os.path.dirname(path))
            if current.typ == "string":
                self.check(r.returncode == 0, f"truncate of a string key: {r.stderr}")
                current.canonical = current.shown = ""
            else:
                self.check(r.returncode != 0 and "Invalid argument" in r.stderr, f"truncate of a {current.typ}: {r}")
        elif op == "rename":
            if current is None:
                return
            to_where = [] if rng.random() < 0.7 else [DICT]
            td = m.root if not to_where else m.root[DICT]
            new = rng.choice(ROOT_NAMES)
            target = td.get(new)
            if isinstance(target, (dict, list)) or (to_where == where and new == name):
                return
            self.note(f"  -> {'/'.join(to_where + [new])!r}")
            try:
                os.rename(path, self.settings_path(*to_where, new))
                e = 0
            except OSError as ex:
                e = ex.errno
            if target is not None and target.typ != current.typ:
                canonical = parse(current.canonical, target.typ)
                if canonical is None:
                    self.check(e == errno.EINVAL, f"a rename onto a {target.typ} of a {current.typ} {current.canonical!r}: errno {e}")
                    return
                moved = Value(target.typ, canonical)
            else:
                moved = Value(current.typ, current.canonical)
            self.check(e == 0, f"rename: errno {e}")
            del d[name]  # (a rename leaves no remembered type behind, only a removal)
            m.tombstones.pop((tuple(to_where), new), None)
            td[new] = moved
        elif op == "unlink":
            if current is None:
                return
            os.unlink(path)
            del d[name]
            m.tombstones[(tuple(where), name)] = current.typ
            # It leaves the plist a moment later (until then a refused rewrite brings it back).
            self.check(poll(lambda: key_of(name) not in self.stored(where)), f"{name} never left the plist")
        elif op == "tool":
            if current is None:
                return
            fitting = [v for v in VALUES if parse(v, current.typ) is not None and v != "" and "\n" not in v]
            value = rng.choice(fitting)
            tool = rng.choice(TOOLS)
            self.note(f"  {tool} sets {value!r}")
            self.save_with(tool, path, value)
            current.canonical = parse(value, current.typ)
            current.shown = value if current.typ == "string" else value.strip()
        elif op == "editor name":
            if where:
                return
            new = rng.choice(EDITOR_NAMES)
            if new in d:
                return
            typ = m.tombstones.get(((), new)) or infer(value)
            canonical = parse(value, typ)
            r = sh(f"printf '%s\\n' '{value}' > '{new}'", self.settings_path())
            if canonical is None:
                self.check(r.returncode != 0, f"{new} of remembered type {typ} took {value!r}")
                return
            self.check(r.returncode == 0, f"{new}: {r.stderr}")
            # Its maker (sh) exited: the mount makes it a key (seen in the plist).
            plist = os.path.join(self.data, "Settings.plist")
            self.check(poll(lambda: new in plistlib.load(open(plist, "rb"))),
                       f"{new}, left by a program that exited, never became a key")
            m.tombstones.pop(((), new), None)
            d[new] = Value(typ, canonical, value if typ == "string" else value.strip())
        elif op == "type":
            if current is None or current.typ == "string":
                return
            os.setxattr(path, "user.plist.type", b"string")
            current.typ = "string"  # (the text the file shows becomes the string)
            current.canonical = current.shown
        elif op == "element":
            self.element_step(m, value)

    def stored(self, where):
        """The plist's dictionary at `where`, as the file holds it now."""
        while True:
            try:
                with open(os.path.join(self.data, "Settings.plist"), "rb") as f:
                    root = plistlib.load(f)
                break
            except (OSError, plistlib.InvalidFileException):
                time.sleep(0.01)
        for part in where:
            root = root[key_of(part)]
        return root

    def apply_write(self, m, d, name, value, e, at):
        current = d.get(name)
        if current is None:
            where, _ = at
            typ = m.tombstones.get((tuple(where), name)) or infer(value)
            canonical = parse(value, typ)
            if canonical is None:
                self.check(e == errno.EINVAL, f"a new key of remembered type {typ} took {value!r}: errno {e}")
                return
            self.check(e == 0, f"a new key {name!r}: errno {e}")
            m.tombstones.pop((tuple(where), name), None)
            d[name] = Value(typ, canonical, value if typ == "string" else value.strip())
            return
        canonical = parse(value, current.typ)
        if canonical is None:
            self.check(e == errno.EINVAL, f"a {current.typ} took {value!r}: errno {e}")
            return
        if e != 0:
            try:
                real = os.getxattr(self.settings_path(*at[0], name), "user.plist.type").decode()
            except OSError as ex:
                real = f"(errno {ex.errno})"
            raise Failure(f"a write of {value!r} to a {current.typ} (the mount says {real}): errno {e}")
        current.canonical = canonical
        current.shown = value if current.typ == "string" else value.strip()

    def element_step(self, m, value):
        rng = self.rng
        items = m.root[ARRAY]
        kind = rng.choice(["set", "append", "append", "past end", "unlink", "tool"])
        self.note(f"  element {kind} ({len(items)} elements)")
        if kind == "append" or (kind == "set" and not items):
            e = write(self.settings_path(ARRAY, str(len(items))), value + "\n")
            typ = infer(value)
            self.check(e == 0, f"append an element: errno {e}")
            items.append(Value(typ, parse(value, typ), value if typ == "string" else value.strip()))
        elif kind == "set":
            i = rng.randrange(len(items))
            e = write(self.settings_path(ARRAY, str(i)), value + "\n")
            canonical = parse(value, items[i].typ)
            if canonical is None:
                self.check(e == errno.EINVAL, f"element {i} ({items[i].typ}) took {value!r}: errno {e}")
            else:
                self.check(e == 0, f"element {i}: errno {e}")
                items[i].canonical = canonical
                items[i].shown = value if items[i].typ == "string" else value.strip()
        elif kind == "past end":
            e = write(self.settings_path(ARRAY, str(len(items) + 1)), value + "\n")
            self.check(e == errno.EINVAL, f"an element past the end: errno {e}")
        elif kind == "unlink" and items:
            i = rng.randrange(len(items))
            os.unlink(self.settings_path(ARRAY, str(i)))
            del items[i]
            for later in items[i:]:
                later.shown = later.canonical  # (renumbered: new files, showing their values)
            self.check(poll(lambda: len(self.stored([])[ARRAY]) == len(items)), "an element never left the plist")
            # It leaves a moment later, and the later elements renumber then.
            want = [str(k) for k in range(len(items))]
            self.check(poll(lambda: sorted(os.listdir(self.settings_path(ARRAY)), key=int) == want),
                       f"after an element's unlink the array shows {os.listdir(self.settings_path(ARRAY))}, not {want}")
        elif kind == "tool" and items:
            i = rng.randrange(len(items))
            fitting = [v for v in VALUES if parse(v, items[i].typ) is not None and v != ""]
            value = rng.choice(fitting)
            tool = rng.choice(TOOLS)
            self.note(f"  {tool} sets element {i} to {value!r}")
            self.save_with(tool, self.settings_path(ARRAY, str(i)), value)
            items[i].canonical = parse(value, items[i].typ)
            items[i].shown = value if items[i].typ == "string" else value.strip()

    def save_with(self, tool, path, value):
        """`path`'s content replaced by `value` and a newline, the way `tool` saves."""
        directory, name = os.path.dirname(path), os.path.basename(path)
        outside = os.path.join(self.outside, "v")
        with open(outside, "w") as f:
            f.write(value + "\n")
        q = value.replace("'", "''")
        commands = {
            "python": None,
            "vim": f"vim -es -u NONE -i NONE -N -c '%d' -c \"call setline(1, '{q}')\" -c wq '{name}'",
            "vim backupcopy=yes": f"vim -es -u NONE -i NONE -N -c 'set backupcopy=yes' -c '%d' -c \"call setline(1, '{q}')\" -c wq '{name}'",
            "sed -i": f"sed -i -e '1!d' -e '1s|.*|{value}|' '{name}'",
            "perl -pi": f"perl -0777 -pi -e 's|.*|{value}\\n|s' '{name}'",
            "ed": f"printf '%s\\n' '1,$d' 'a' '{value}' '.' 'w' 'q' | ed -s '{name}'",
            "install": f"install -m 644 '{outside}' '{name}'",
            "mv": f"cp '{outside}' '{outside}.m' && mv '{outside}.m' '{name}'",
            "cp": f"cp '{outside}' '{name}'",
            "tee": f"tee '{name}' < '{outside}' > /dev/null",
            ">": f"cat '{outside}' > '{name}'",
        }
        if tool == "python":
            e = write(path, value + "\n")
            self.check(e == 0, f"python: errno {e}")
            return
        r = sh(commands[tool], directory)
        self.check(r.returncode == 0, f"{tool}: exit {r.returncode}: {r.stderr.strip()}")

    # -- accounts -----------------------------------------------------------------------
    def account_path(self, *parts):
        return os.path.join(self.mount_point, "accounts", self.account, *parts)

    FIELDS = {"label": ["GitHub", "a b", "日本"], "username": ["alice", "bob"], "password": ["s3cret", "p w", "x"],
              "comment": ["c1", ""], "protocol": ["https", "imap", ""], "server": ["h.example", "a.b.c"],
              "port": ["443", "8080", ""], "path": ["/p", "/a/b", ""]}
    BAD = {"protocol": ["1bad", "a b"], "server": ["bad host", "-x"], "port": ["99999", "abc", "080"], "path": ["nopath", "/a b"]}
    NOT_FIELDS = ["notes", "password.bak", "2024", ".hidden", "x.tmp", "url.txt"]

    def url(self, f):
        if not f["server"]:
            return ""
        return (f["protocol"] + "://" if f["protocol"] else "") + f["server"] + (":" + f["port"] if f["port"] else "") + f["path"]

    def run_accounts(self):
        r = run([self.mtmfs, "init", "--data-dir", self.data, "--kdf", "interactive", "--passphrase-file", self.pass_file])
        if r.returncode != 0:
            raise Failure(f"init failed: {r.stderr}")
        self.mount()
        self.account = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        os.mkdir(os.path.join(self.mount_point, "accounts", self.account))
        fields = {k: "" for k in self.FIELDS}
        attributes = {}
        for step in range(self.steps):
            self.accounts_step(fields, attributes)
            self.compare_accounts(fields, attributes, f"step {step}")
        self.unmount()
        self.mount()
        self.compare_accounts(fields, attributes, "after a remount")
        self.unmount()

    def compare_accounts(self, fields, attributes, when):
        for name, value in list(fields.items()) + [("url", self.url(fields))]:
            got = read(self.account_path(name))
            self.check(got == value + "\n", f"{when}: {name} reads {got!r}, the model {value + chr(10)!r}")
        shown = sorted(os.listdir(self.account_path("attributes")))
        self.check(shown == sorted(attributes), f"{when}: attributes/ shows {shown}, the model {sorted(attributes)}")
        for name, value in attributes.items():
            got = read(self.account_path("attributes", name))
            self.check(got == value + "\n", f"{when}: attributes/{name} reads {got!r}")
        listing = set(os.listdir(self.account_path()))
        extra = listing - set(fields) - {"url", "attributes", "trusted", "otp", "conflicts"}
        self.check(not extra, f"{when}: the account shows {sorted(extra)}")

    def accounts_step(self, fields, attributes):
        rng = self.rng
        op = rng.choice(["write", "write", "bad", "url", "unlink", "tool", "not a field", "attribute", "attribute"])
        if op == "write":
            name = rng.choice(list(self.FIELDS))
            value = rng.choice(self.FIELDS[name])
            self.note(f"write {name} {value!r}")
            e = write(self.account_path(name), value + "\n")
            self.check(e == 0, f"write {name}: errno {e}")
            fields[name] = value
        elif op == "bad":
            name = rng.choice(list(self.BAD))
            value = rng.choice(self.BAD[name])
            self.note(f"bad {name} {value!r}")
            e = write(self.account_path(name), value + "\n")
            self.check(e == errno.EINVAL, f"a bad {name} {value!r}: errno {e}")
        elif op == "url":
            parts = {k: rng.choice([v for v in self.FIELDS[k] if v or k in ("port", "path")]) for k in ("protocol", "server", "port", "path")}
            text = self.url(parts)
            self.note(f"url {text!r}")
            e = write(self.account_path("url"), text + "\n")
            self.check(e == 0, f"write url: errno {e}")
            fields.update(parts)
        elif op == "unlink":
            name = rng.choice(list(self.FIELDS) + ["url"])
            self.note(f"rm {name}")
            os.unlink(self.account_path(name))
            cleared = ["protocol", "server", "port", "path"] if name == "url" else [name]
            for k in cleared:
                fields[k] = ""
            # Cleared a moment later; the file shows again (every account has every field).
            self.check(poll(lambda: os.path.exists(self.account_path(name)) and read(self.account_path(name)) ==
                            (self.url(fields) if name == "url" else fields[name]) + "\n"),
                       f"{name} after its rm: {os.path.exists(self.account_path(name))}")
        elif op == "tool":
            name = rng.choice(["label", "username", "password", "comment"])
            value = rng.choice([v for v in self.FIELDS[name] if v])
            tool = rng.choice(["python", "vim", "vim backupcopy=yes", "sed -i", "install", "mv", "cp", ">"])
            self.note(f"{tool} sets {name} to {value!r}")
            self.save_with(tool, self.account_path(name), value)
            fields[name] = value
        elif op == "not a field":
            name = rng.choice(self.NOT_FIELDS)
            self.note(f"create {name}")
            e = write(self.account_path(name), "v\n")
            self.check(e == errno.EINVAL, f"{name}, no field: errno {e}")
        elif op == "attribute":
            name = rng.choice(["xdg:schema", "with.dot", "%2E", "a%2Fb", "plain", "with%2Edot", "xdg%3Aschema", "%41"])
            valid = name not in ("with%2Edot", "xdg%3Aschema", "%41")
            if name in attributes and rng.random() < 0.4:
                self.note(f"rm attributes/{name}")
                os.unlink(self.account_path("attributes", name))
                del attributes[name]
                return
            value = rng.choice(["v1", "v 2", "ü"])
            self.note(f"attribute {name} {value!r}")
            e = write(self.account_path("attributes", name), value + "\n")
            if valid:
                self.check(e == 0, f"attribute {name}: errno {e}")
                attributes[name] = value
            else:
                self.check(e == errno.EINVAL, f"attribute {name}, a name the rule never makes: errno {e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mtmfs", required=True)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tree", choices=["settings", "accounts", "both"], default="both")
    args = parser.parse_args()
    trees = ["settings", "accounts"] if args.tree == "both" else [args.tree]
    passed = failed = 0
    for tree in trees:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            runner = Runner(os.path.abspath(args.mtmfs), tree, seed, args.steps)
            try:
                if tree == "settings":
                    runner.run_settings()
                else:
                    runner.run_accounts()
                passed += 1
                print(f"{tree} seed {seed}: {args.steps} steps held", flush=True)
            except (Failure, OSError, subprocess.TimeoutExpired) as e:
                failed += 1
                print(f"{tree} seed {seed}: FAILED at step {len(runner.log)}: {e}", flush=True)
                for line in runner.log[-int(os.environ.get("MODEL_HISTORY", "12")):]:
                    print(f"    {line}")
            finally:
                runner.close()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
