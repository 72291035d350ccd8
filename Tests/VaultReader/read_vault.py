#!/usr/bin/python3
"""Independent reader of the mtmfs vault format 3.

Written from docs/vault-format-3.md alone (no look at Sources/).

  read_vault.py VAULT_DIR --passphrase-file FILE [--json] [--strict]
  read_vault.py VAULT_DIR --locked [--json]        (clear parts only)
  read_vault.py --vectors DOC.md                   (check the document's test vectors)

Exit status: 0 read; 1 wrong passphrase (or empty passphrase); 2 the whole read stopped
(section 5a: vault unreadable / vault damaged); 3 with --strict, some file was skipped;
4 a --vectors mismatch; 64 usage.
"""

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import sys
import tempfile
from datetime import datetime, timezone

import nacl.bindings as nb
import nacl.exceptions

MAX_FILE = 67108864
OPS_MIN, OPS_MAX = 2, 4
MEM_MIN, MEM_MAX = 67108864, 1073741824
SLOT_MAGIC = b"MTMSLOT3"
CHANGE_MAGIC = b"MTMVLT03"
AD_SLOT = b"MTMVAULT3-slot"
AD_PROOF = b"MTMVAULT3-proof"
AD_CHANGE = b"MTMVAULT3-change"
ZERO_UUID = bytes(16)
NINE = ["label", "protocol", "server", "port", "path", "comment", "username", "password", "otp"]

RE_HEX16 = re.compile(rb"\A[0-9a-f]{16}\Z")
RE_CHANGE_NAME = re.compile(rb"\A([0-9a-f]{16})-([0-9a-f]{8})\.mtv\Z")
RE_SLOT_NAME = re.compile(rb"\A([0-9a-f]{16})-([0-9a-f]{16})\.slot\Z")
RE_ID = re.compile(rb"\A[0-9a-fA-F]{32}\Z")
RE_UUID_NAME = re.compile(rb"\A[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")


class VaultError(Exception):
    """Stops the whole read (section 5a, first table)."""


class WrongPassphrase(Exception):
    pass


class Skip(Exception):
    """A per-file error: the file is skipped and named with this reason."""


def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) and e.errno else str(e)


def unreadable(e):
    return "vault unreadable: " + errname(e)


class Cursor:
    def __init__(self, data, start=0):
        self.d, self.p = data, start

    def take(self, n):
        if self.p + n > len(self.d):
            # Guess: N is the offset at which the part that runs past the end starts.
            raise Skip("vault damaged: truncated at byte %d" % self.p)
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def u(self, n):
        return int.from_bytes(self.take(n), "big")


def read_nofollow(path):
    """Open with O_NOFOLLOW, check the size, read everything (section 5, check 1)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise Skip(unreadable(e))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Skip(unreadable(OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL, "")))
        if st.st_size > MAX_FILE:
            raise Skip("vault damaged: larger than 64 MiB")
        chunks = []
        total = 0
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
            total += len(b)
            if total > MAX_FILE:
                raise Skip("vault damaged: larger than 64 MiB")
        return b"".join(chunks)
    except OSError as e:
        raise Skip(unreadable(e))
    finally:
        os.close(fd)


def name_kind(name):
    """Reason for a name that is not a change file / slot (section 5)."""
    if b".sync-conflict-" in name:
        return "a synchroniser's conflict copy"
    if name.startswith(b".syncthing."):
        return "a synchroniser's temporary file"
    if name.endswith(b"~"):
        return "a backup copy"
    return "an unexpected name"


def silent_dot(name):
    return name.startswith(b".") and not name.startswith(b".syncthing.")


# ---------------------------------------------------------------- id (section 2)

def read_id(vault):
    p = os.path.join(vault, b"id")
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            data = b""
            while True:
                b = os.read(fd, 4096)
                if not b:
                    break
                data += b
                if len(data) > 4096:
                    break
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise VaultError("vault damaged: %s has no id file: not a vault folder" % os.fsdecode(vault))
    except OSError as e:
        raise VaultError(unreadable(e))
    if data.endswith(b"\n"):
        data = data[:-1]
    if not RE_ID.match(data):
        raise VaultError("vault damaged: its id file is not 32 hex digits")
    return bytes.fromhex(data.decode())


# ---------------------------------------------------------------- slots (section 3)

class Slot:
    pass


def parse_slot(name, data):
    c = Cursor(data)
    if c.take(8) != SLOT_MAGIC:
        raise Skip("vault damaged: not a key slot (bad magic)")
    if c.u(1) != 2:
        raise Skip("vault damaged: unknown key-derivation algorithm")
    c.take(1)  # reserved, not checked
    ops = c.u(8)
    mem = c.u(8)
    if ops < OPS_MIN or mem < MEM_MIN or ops > 2**32 - 1 or mem > 2**42:
        raise Skip("vault damaged: key-derivation parameters below the INTERACTIVE limits")
    if ops > OPS_MAX or mem > MEM_MAX:
        raise Skip("vault damaged: key-derivation limits above SENSITIVE")
    salt = c.take(16)
    r = c.u(2)
    retired = []
    for _ in range(r):
        ln = c.u(1)
        rn = c.take(ln)
        if not RE_SLOT_NAME.match(rn):
            raise Skip("vault damaged: retires a slot of an impossible name")
        retired.append(rn)
    h = c.p
    s = Slot()
    s.name = name
    s.clock = int(RE_SLOT_NAME.match(name).group(2), 16)
    s.header = data[:h]
    s.ops, s.mem, s.salt, s.retired = ops, mem, salt, retired
    s.wrap_nonce = c.take(24)
    s.wrapped = c.take(48)
    s.proof_nonce = c.take(24)
    s.proof = c.take(16)
    if c.p != len(data):
        raise Skip("vault damaged: stray bytes after the key slot")
    return s


def slot_ad(prefix, vault_id, s):
    return prefix + vault_id + b"keys/" + s.name + b"\x00" + s.header


def aead_open(ct, ad, nonce, key):
    try:
        return nb.crypto_aead_xchacha20poly1305_ietf_decrypt(ct, ad, nonce, key)
    except nacl.exceptions.CryptoError:
        return None


def proof_opens(vault_id, s, key):
    return aead_open(s.proof, slot_ad(AD_PROOF, vault_id, s), s.proof_nonce, key) == b""


def unlock(vault_id, slots, passphrase, trace=None):
    """Section 3, "Unlocking". Returns the master key or raises WrongPassphrase."""
    retired = set()
    for s in slots:
        retired.update(s.retired)
    order = sorted(slots, key=lambda s: (s.clock, s.name), reverse=True)
    keks = {}

    def try_slot(s):
        k = (s.salt, s.ops, s.mem)
        if k not in keks:
            try:
                keks[k] = nb.crypto_pwhash_alg(32, passphrase, s.salt, s.ops, s.mem,
                                               nb.crypto_pwhash_ALG_ARGON2ID13)
            except Exception:
                keks[k] = None
        kek = keks[k]
        if kek is None:
            return None
        if trace is not None:
            trace.setdefault("kek", {})[s.name] = kek
        m = aead_open(s.wrapped, slot_ad(AD_SLOT, vault_id, s), s.wrap_nonce, kek)
        if m is None or len(m) != 32:
            return None
        return m

    for s in order:
        if s.name in retired:
            continue
        k = try_slot(s)
        if k is not None and proof_opens(vault_id, s, k):
            return k
    for s in order:
        if s.name not in retired:
            continue
        k = try_slot(s)
        if k is None:
            continue
        retirers = [t for t in slots if s.name in t.retired]
        if not any(proof_opens(vault_id, t, k) for t in retirers):
            return k
    raise WrongPassphrase("wrong passphrase")


# ---------------------------------------------------------------- change files (section 4)

class Change:
    __slots__ = ("kind", "uuid", "name", "device", "clock", "index", "seen", "fields", "path")

    @property
    def id(self):
        # ordered by clock, then device, then index
        return (self.clock, self.device, self.index)


class ChangeFile:
    pass


def uuid_name_ok(uuid, name):
    if not RE_UUID_NAME.match(name):
        return False
    return bytes.fromhex(name.replace(b"-", b"").decode()) == uuid


def parse_change_clear(rel, device, fclock, data):
    """Checks 2-7 of section 5. rel = b'DEVICE/CLOCK-RANDOM.mtv'."""
    c = Cursor(data)
    if c.take(8) != CHANGE_MAGIC:
        raise Skip("vault damaged: not a change file (bad magic)")
    hd = c.u(8)
    hc = c.u(8)
    if hd != device or hc != fclock:
        raise Skip("vault damaged: renamed or moved (its header names %016x/%016x)" % (hd, hc))
    n = c.u(4)
    if n > len(data):
        raise Skip("vault damaged: impossible change count %d" % n)
    changes = []
    for _ in range(n):
        ch = Change()
        ch.kind = c.u(1)
        if ch.kind not in (1, 2):
            raise Skip("vault damaged: unknown change kind")
        ch.uuid = c.take(16)
        ln = c.u(1)
        ch.name = c.take(ln)
        try:
            ch.name.decode("utf-8")
            ok = uuid_name_ok(ch.uuid, ch.name)
        except UnicodeDecodeError:
            ok = False
        if not ok:
            raise Skip("vault damaged: a change whose name does not match its UUID")
        ch.clock = c.u(8)
        if ch.clock > fclock:
            raise Skip("vault damaged: a change later than its file")
        ch.index = c.u(2)
        s = c.u(2)
        ch.seen = []
        for _ in range(s):
            ch.seen.append((c.u(8), c.u(8), c.u(2)))  # stored as device, clock, index
        ch.device = device
        ch.fields = None
        ch.path = rel
        changes.append(ch)
    header = data[:c.p]
    nonce = c.take(24)
    sealed = data[c.p:]
    if len(sealed) < 528 or (len(sealed) - 16) % 512 != 0:
        raise Skip("vault damaged: truncated (%d bytes)" % len(sealed))
    f = ChangeFile()
    f.rel, f.header, f.nonce, f.sealed, f.changes = rel, header, nonce, sealed, changes
    return f


def change_ad(vault_id, f):
    return AD_CHANGE + vault_id + f.rel + b"\x00" + f.header


def unpad(p, block=512):
    if len(p) == 0 or len(p) % block:
        raise Skip("vault damaged: bad padding")
    i = len(p) - 1
    lo = len(p) - block
    while i >= lo and p[i] == 0:
        i -= 1
    if i < lo or p[i] != 0x80:
        raise Skip("vault damaged: bad padding")
    return p[:i]


def parse_plaintext(f, pt):
    bad = Skip("vault damaged: a malformed sealed part")
    c = Cursor(pt)
    out = []
    try:
        for ch in f.changes:
            nf = c.u(2)
            if ch.kind == 2 and nf != 0:
                raise bad
            fields = {}
            for _ in range(nf):
                nl = c.u(1)
                name = c.take(nl)
                name.decode("utf-8")
                m = c.u(1)
                seen = {}
                for _ in range(m):
                    d = c.u(8)
                    seen[d] = c.u(8)  # a device found twice counts with its later pair
                vl = c.u(4)
                val = c.take(vl)
                # Guess (not in the document): a field name twice in one change -> the
                # later one counts.
                fields[name] = (val, seen)
            out.append(fields)
    except (Skip, UnicodeDecodeError):
        raise bad
    if c.p != len(pt):
        raise bad
    for ch, fl in zip(f.changes, out):
        ch.fields = fl


def open_change_file(vault_id, f, key, trace=None):
    ad = change_ad(vault_id, f)
    pt = aead_open(f.sealed, ad, f.nonce, key)
    if pt is None:
        raise Skip("vault damaged: fails authentication (altered, truncated, renamed or from another vault)")
    up = unpad(pt)
    if trace is not None:
        trace.setdefault("files", {})[f.rel] = {"ad": ad, "sealed_len": len(f.sealed),
                                                "opened_len": len(pt), "plaintext": up}
    parse_plaintext(f, up)


# ---------------------------------------------------------------- the folder (section 5)

def load(vault, passphrase=None, trace=None):
    """Returns (accounts-merge input, skipped list, guard...) — see read()."""
    vault = os.fsencode(vault)
    try:
        top = os.listdir(vault)
    except OSError as e:
        raise VaultError(unreadable(e))
    vault_id = read_id(vault)
    skipped = []
    # keys/
    slots = []
    kdir = os.path.join(vault, b"keys")
    kexists = os.path.lexists(kdir)
    if kexists:
        try:
            knames = sorted(os.listdir(kdir))
        except OSError as e:
            raise VaultError(unreadable(e))
        for n in knames:
            rel = b"keys/" + n
            if silent_dot(n):
                continue
            if not RE_SLOT_NAME.match(n):
                skipped.append((rel, "not a key slot (%s)" % name_kind(n)))
                continue
            try:
                slots.append(parse_slot(n, read_nofollow(os.path.join(kdir, n))))
            except Skip as e:
                skipped.append((rel, str(e)))
    # device folders
    files = []
    for n in sorted(top):
        if n in (b"id", b"keys") or n.startswith(b"."):
            continue
        if not RE_HEX16.match(n):
            skipped.append((n, "not a device folder"))
            continue
        dpath = os.path.join(vault, n)
        try:
            if os.path.islink(dpath):
                raise NotADirectoryError(errno.ENOTDIR, "link")  # guess: a link is not listed
            entries = os.listdir(dpath)
        except OSError:
            continue  # cannot be listed: passed over silently
        device = int(n, 16)
        for e in sorted(entries):
            rel = n + b"/" + e
            if silent_dot(e):
                continue
            m = RE_CHANGE_NAME.match(e)
            if not m:
                skipped.append((rel, "not a change file (%s)" % name_kind(e)))
                continue
            try:
                files.append(parse_change_clear(rel, device, int(m.group(1), 16),
                                                read_nofollow(os.path.join(dpath, e))))
            except Skip as ex:
                skipped.append((rel, str(ex)))
    key = None
    if passphrase is not None:
        key = unlock(vault_id, slots, passphrase, trace)
        if trace is not None:
            trace["master_key"] = key
        good = []
        for f in files:
            try:
                open_change_file(vault_id, f, key, trace)
                good.append(f)
            except Skip as ex:
                skipped.append((f.rel, str(ex)))
        files = good
    files.sort(key=lambda f: f.rel)
    changes = [ch for f in files for ch in f.changes]
    skipped.sort()
    return {"vault_id": vault_id, "slots": slots, "changes": changes, "skipped": skipped,
            "unlocked": key is not None}


# ---------------------------------------------------------------- merge (section 6)

def merge_account(changes):
    """changes: this account's changes in section 5's order. Returns a dict or None."""
    by_id = {}
    order = []
    for ch in changes:
        first = by_id.get(ch.id)
        if first is None:
            # copy so a later copy can add fields without touching the source
            c = Change()
            for a in Change.__slots__:
                setattr(c, a, getattr(ch, a))
            c.fields = dict(ch.fields) if ch.fields is not None else None
            by_id[ch.id] = c
            order.append(c)
        elif ch.fields is not None and first.fields is not None:
            for k, v in ch.fields.items():
                if k not in first.fields:
                    first.fields[k] = v
    sets = [c for c in order if c.kind == 1]
    rems = [c for c in order if c.kind == 2]
    # clear seen lists, as change ids (clock, device, index)
    seen_of = {c.id: {(cl, d, i) for (d, cl, i) in c.seen} for c in order}
    E = {r.id for r in rems}
    changed = True
    while changed:
        changed = False
        for r in rems:
            if r.id not in E:
                continue
            ok = True
            for s in sets:
                if s.id in seen_of[r.id] or r.id in seen_of[s.id]:
                    continue
                if any(s.id in seen_of[r2] for r2 in E if r2 != r.id):
                    continue
                ok = False
                break
            if not ok:
                E.discard(r.id)
                changed = True
    covered = set()
    for rid in E:
        covered |= seen_of[rid]
    live = [s for s in sets if s.id not in covered]
    res = {
        "least_id": min((s.id for s in sets), default=None),
        "created_clock": min((s.clock for s in sets), default=None),
        "modified_clock": max((s.clock for s in sets), default=None),
        "effective_removals": sorted(E),
    }
    if not live:
        res["exists"] = False
        return res
    res["exists"] = True
    greatest = max(live, key=lambda s: s.id)
    res["name"] = greatest.name
    live_ids = {s.id for s in live}
    res["removal_conflicts"] = sorted(
        (r.id for r in rems if r.id not in E and not any(r.id in seen_of[s] for s in live_ids)),
        reverse=True)
    # fields
    values = {}
    for s in live:
        for f, (v, seen) in (s.fields or {}).items():
            values.setdefault(f, []).append((s.id, v, seen))
    fields = {}
    for f, vals in values.items():
        current = []
        for (vid, v, vseen) in vals:
            vclock, vdev, _ = vid
            sup = False
            for (wid, w, wseen) in vals:
                if vclock == 0:
                    if vdev in wseen:
                        sup = True
                        break
                elif wid != vid and wseen.get(vdev, -1) >= vclock:
                    sup = True
                    break
            if not sup:
                current.append((vid, v))
        current.sort(key=lambda x: x[0], reverse=True)
        fields[f] = {"value": current[0][1], "id": current[0][0], "conflicts": current[1:]}
    res["fields"] = fields
    return res


def merge(changes):
    groups = {}
    for ch in changes:
        groups.setdefault(ch.uuid, []).append(ch)
    out = {}
    for u, chs in groups.items():
        out[u] = merge_account(chs)
    return out


# ---------------------------------------------------------------- interpretation (section 6a)

def decode_trusted(v):
    progs = []
    if v is None or len(v) < 2:
        return progs
    p = int.from_bytes(v[:2], "big")
    off = 2
    for _ in range(p):
        if off + 34 > len(v):
            break
        h = v[off:off + 32]
        ln = int.from_bytes(v[off + 32:off + 34], "big")
        if off + 34 + ln > len(v):
            break
        try:
            path = v[off + 34:off + 34 + ln].decode("utf-8")
        except UnicodeDecodeError:
            break
        progs.append({"sha256": h.hex(), "path": path})
        off += 34 + ln
    return progs


def compose_url(f):
    server = f.get("server", b"")
    if not server:
        return b""
    u = b""
    if f.get("protocol"):
        u += f["protocol"] + b"://"
    u += server
    if f.get("port"):
        u += b":" + f["port"]
    u += f.get("path", b"")
    return u


def ms_of(clock):
    return clock >> 16


def iso(ms):
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def read(vault, passphrase=None, trace=None):
    st = load(vault, passphrase, trace)
    merged = merge(st["changes"])
    guard = False
    zero = merged.pop(ZERO_UUID, None)
    if zero and zero["exists"] and st["unlocked"]:
        g = zero["fields"].get(b"guard")
        guard = g is not None and g["value"] == b"1"
    accounts = []
    for u, m in merged.items():
        if not m["exists"]:
            continue
        a = {"uuid": u, "name": m["name"], "least_id": m["least_id"],
             "created_ms": ms_of(m["created_clock"]), "modified_ms": ms_of(m["modified_clock"]),
             "removal_conflicts": m["removal_conflicts"]}
        if st["unlocked"]:
            fv = {}
            conflicts = {}
            for fname, info in m["fields"].items():
                try:
                    name = fname.decode("utf-8")
                except UnicodeDecodeError:
                    name = fname.decode("utf-8", "replace")
                if info["value"] != b"":
                    fv[name] = info["value"]
                if info["conflicts"]:
                    conflicts[name] = info["conflicts"]
            a["fields"] = fv
            a["conflicts"] = conflicts
            a["trusted"] = decode_trusted(fv.get("trusted"))
            a["url"] = compose_url(fv)
            attrs = {}
            for k, v in fv.items():
                if k.startswith("attribute:") and v:
                    attrs[k[len("attribute:"):]] = v
            a["attributes"] = attrs
            ss = dict(attrs)
            for fld, an in (("server", "server"), ("username", "user"), ("protocol", "protocol"),
                            ("port", "port"), ("path", "object")):
                if fv.get(fld):
                    ss[an] = fv[fld]
            a["secret_service"] = {"label": fv.get("label", b""), "attributes": ss,
                                   "content_type": fv.get("secret-content-type") or b"text/plain"}
        accounts.append(a)
    accounts.sort(key=lambda a: a["least_id"])
    return {"vault_id": st["vault_id"], "unlocked": st["unlocked"], "guard": guard,
            "accounts": accounts, "skipped": st["skipped"]}


# ---------------------------------------------------------------- output

def jval(b):
    if isinstance(b, bytes):
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"hex": b.hex()}
    return b


def esc(b):
    s = b.decode("utf-8", "backslashreplace")
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def idj(i):
    clock, dev, idx = i
    return {"device": "%016x" % dev, "clock": "%016x" % clock, "index": idx, "time_ms": ms_of(clock)}


def to_json(r):
    out = {"vault_id": r["vault_id"].hex(), "unlocked": r["unlocked"], "guard": r["guard"],
           "accounts": [], "skipped": [{"path": p.decode(), "reason": why} for p, why in r["skipped"]]}
    for a in r["accounts"]:
        j = {"uuid": a["name"].decode(), "uuid_bytes": a["uuid"].hex(),
             "created_ms": a["created_ms"], "modified_ms": a["modified_ms"],
             "removal_conflicts": [idj(i) for i in a["removal_conflicts"]]}
        if r["unlocked"]:
            j["fields"] = {k: jval(v) for k, v in sorted(a["fields"].items())}
            j["url"] = jval(a["url"])
            j["attributes"] = {k: jval(v) for k, v in sorted(a["attributes"].items())}
            j["trusted"] = a["trusted"]
            j["conflicts"] = {k: [dict(idj(i), value=jval(v)) for i, v in lst]
                              for k, lst in sorted(a["conflicts"].items())}
            j["secret_service"] = {"label": jval(a["secret_service"]["label"]),
                                   "content_type": jval(a["secret_service"]["content_type"]),
                                   "attributes": {k: jval(v) for k, v in
                                                  sorted(a["secret_service"]["attributes"].items())}}
        out["accounts"].append(j)
    return out


def print_text(r, vault):
    print("vault %s  id %s  %s" % (vault, r["vault_id"].hex(), "unlocked" if r["unlocked"] else "locked (clear parts only)"))
    print("guarding: %s" % ("on" if r["guard"] else "off"))
    print("accounts: %d" % len(r["accounts"]))
    for a in r["accounts"]:
        print()
        print("account %s" % a["name"].decode())
        print("  created %s  modified %s" % (iso(a["created_ms"]), iso(a["modified_ms"])))
        if r["unlocked"]:
            f = a["fields"]
            for n in NINE:
                if n in f:
                    print("  %-10s %s" % (n + ":", esc(f[n])))
            if a["url"]:
                print("  %-10s %s  (derived)" % ("url:", esc(a["url"])))
            for n in sorted(f):
                if n in NINE or n == "trusted" or n.startswith("attribute:"):
                    continue
                print("  %s: %s" % (n, esc(f[n])))
            for n, v in sorted(a["attributes"].items()):
                print("  attribute %s: %s" % (n, esc(v)))
            if a["trusted"]:
                print("  trusted:")
                for p in a["trusted"]:
                    print("    %s  %s" % (p["sha256"], p["path"]))
            else:
                print("  trusted: (none)")
            for n, lst in sorted(a["conflicts"].items()):
                for i, v in lst:
                    print("  conflict %s: %s\t%016x\t%s" % (n, esc(v), i[1], iso(ms_of(i[0]))))
        for i in a["removal_conflicts"]:
            print("  conflict removed: %016x\t%s" % (i[1], iso(ms_of(i[0]))))
    print()
    print("skipped: %d" % len(r["skipped"]))
    for p, why in r["skipped"]:
        print("  %s -> %s" % (p.decode(errors="replace"), why))


def read_passphrase(path):
    with open(path, "rb") as fh:
        data = fh.read()
    line = data.split(b"\n", 1)[0]
    if line.endswith(b"\r"):
        line = line[:-1]
    return line


# ---------------------------------------------------------------- --vectors

def hexblock(lines):
    """Hex of an annotated block: on each line, leading hex tokens until the first other token."""
    out = b""
    for ln in lines:
        for tok in ln.split():
            if re.fullmatch(r"[0-9a-f]+", tok) and len(tok) % 2 == 0:
                out += bytes.fromhex(tok)
            else:
                break
    return out


def code_blocks(doc):
    blocks = []
    lines = doc.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(.*)$", lines[i])
        if m:
            info = m.group(1).strip()
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            blocks.append((i, info, lines[i + 1:j]))
            i = j + 1
        else:
            i += 1
    return lines, blocks


class Checker:
    def __init__(self):
        self.ok = self.bad = 0

    def eq(self, what, got, want):
        if got == want:
            self.ok += 1
            print("ok    %s" % what)
        else:
            self.bad += 1
            print("FAIL  %s\n        got  %r\n        want %r" % (what, got, want))


def mk(kind, dev, clock, idx, uuid=b"\x01" * 16, seen=(), fields=None):
    c = Change()
    c.kind, c.uuid, c.device, c.clock, c.index = kind, uuid, dev, clock, idx
    c.name = b"x"
    c.seen = [(d, cl, i) for (cl, d, i) in seen]
    c.fields = {k.encode(): (v.encode(), s) for k, (v, s) in (fields or {}).items()} if kind == 1 else {}
    c.path = b""
    return c


def check_merge_examples(ck):
    """Section 6's worked examples, built as changes and merged."""
    a, b = 0xA, 0xB
    t1, t2, t3, t4 = 10, 20, 30, 40
    s1 = mk(1, a, t1, 0, fields={"username": ("alice", {}), "password": ("first", {})})
    s2 = mk(1, a, t2, 0, fields={"password": ("from-a", {a: t1})})
    s3 = mk(1, b, t3, 0, fields={"password": ("from-b", {a: t1})})
    m = merge_account([s1, s2, s3])
    ck.eq("§6 example 1: password shown", m["fields"][b"password"]["value"], b"from-b")
    ck.eq("§6 example 1: password conflicts", [v for _, v in m["fields"][b"password"]["conflicts"]], [b"from-a"])
    ck.eq("§6 example 1: username", m["fields"][b"username"]["value"], b"alice")
    s4 = mk(1, a, t4, 0, fields={"password": ("resolved", {a: t2, b: t3})})
    m = merge_account([s1, s2, s3, s4])
    ck.eq("§6 example 1: s4 resolves", (m["fields"][b"password"]["value"], m["fields"][b"password"]["conflicts"]),
          (b"resolved", []))
    s3same = mk(1, b, t2, 0, fields={"password": ("from-b", {a: t1})})
    m = merge_account([s1, s2, s3same])
    ck.eq("§6 example 1, same clock: greater device shown", m["fields"][b"password"]["value"], b"from-b")
    # removal against an edit
    r1 = mk(2, a, t2, 0, seen=[s1.id])
    s2e = mk(1, b, t3, 0, fields={"password": ("edited", {a: t1})})
    m = merge_account([s1, r1, s2e])
    ck.eq("§6 example 2: X exists, r1 void", (m["exists"], m["effective_removals"]), (True, []))
    ck.eq("§6 example 2: fields", (m["fields"][b"username"]["value"], m["fields"][b"password"]["value"]),
          (b"alice", b"edited"))
    ck.eq("§6 example 2: r1 unanswered", m["removal_conflicts"], [r1.id])
    s3b = mk(1, b, t4, 0, seen=[r1.id], fields={"comment": ("x", {})})
    m = merge_account([s1, r1, s2e, s3b])
    ck.eq("§6 example 2: s3 answers r1, still void", (m["removal_conflicts"], m["effective_removals"], m["exists"]),
          ([], [], True))
    r2 = mk(2, a, 50, 0, seen=[s1.id, s2e.id, s3b.id])
    m = merge_account([s1, r1, s2e, s3b, r2])
    ck.eq("§6 example 2: r2 effective, X gone", m["exists"], False)
    m = merge_account([s1, r1, s2e, s3b, r2, s1])
    ck.eq("§6 example 2: s1 restored changes nothing", m["exists"], False)


def run_vectors(docpath):
    ck = Checker()
    doc = open(docpath, encoding="utf-8").read()
    lines, blocks = code_blocks(doc)
    tmp = tempfile.mkdtemp(prefix="vault-vectors-")
    try:
        vault = os.path.join(tmp, "vault")
        os.makedirs(vault)
        files = {}
        for lineno, info, body in blocks:
            if not info.startswith("hex-v3 "):
                continue
            path = info.split(None, 1)[1].strip()
            data = bytes.fromhex("".join(body).replace(" ", ""))
            files[path] = data
            # the size given in the heading just before the block
            head = "\n".join(lines[max(0, lineno - 3):lineno])
            m = re.search(r"`%s` \((\d+) bytes\)" % re.escape(path), head)
            ck.eq("size of %s as the heading gives" % path, len(data), int(m.group(1)) if m else None)
            full = os.path.join(vault, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as fh:
                fh.write(data)
        ck.eq("vector files found", len(files), 7)
        passphrase = re.search(r"Passphrase `([^`]+)`", doc).group(1).encode()
        kek_m = re.search(r"KEK = Argon2id\(`([^`]+)`, salt `([0-9a-f]+)`,\s*opslimit (\d+), memlimit (\d+)\) =\s*`([0-9a-f]{64})`", doc)
        ck.eq("KEK passphrase is the vectors'", kek_m.group(1).encode(), passphrase)
        mk_m = re.search(r"gives the master\s+key `([0-9a-f]{64})`", doc)
        slotname = [p for p in files if p.startswith("keys/")][0].split("/", 1)[1].encode()
        slot = parse_slot(slotname, files["keys/" + slotname.decode()])
        ck.eq("slot salt / limits", (slot.salt.hex(), slot.ops, slot.mem),
              (kek_m.group(2), int(kek_m.group(3)), int(kek_m.group(4))))
        vault_id = read_id(os.fsencode(vault))
        ck.eq("vault id", vault_id, bytes(range(16)))
        # AD_slot worked example (section 3)
        for lineno, info, body in blocks:
            if body and body[0].startswith("4d544d5641554c54332d736c6f74"):
                ck.eq("AD_slot = section 3's worked example", slot_ad(AD_SLOT, vault_id, slot), hexblock(body))
                ck.eq("AD_slot length 118", len(hexblock(body)), 118)
            if body and body[0].startswith("4d544d5641554c54332d6368616e6765"):
                first = "1011121314151617/01a3185c50000001-78797a7b.mtv"
                f = parse_change_clear(first.encode(), 0x1011121314151617, 0x01a3185c50000001, files[first])
                ck.eq("change AD = section 4's worked example", change_ad(vault_id, f), hexblock(body))
                ck.eq("change AD length 173", len(hexblock(body)), 173)
        kek = nb.crypto_pwhash_alg(32, passphrase, slot.salt, slot.ops, slot.mem, nb.crypto_pwhash_ALG_ARGON2ID13)
        ck.eq("KEK", kek.hex(), kek_m.group(5))
        ck.eq("AD_proof length 119", len(slot_ad(AD_PROOF, vault_id, slot)), 119)
        trace = {}
        r = read(vault, passphrase, trace)
        ck.eq("master key", trace["master_key"].hex(), mk_m.group(1))
        ck.eq("slot proof opens under it", proof_opens(vault_id, slot, trace["master_key"]), True)
        tf = trace["files"]
        names = sorted(p for p in files if p.endswith(".mtv"))
        ck.eq("AD lengths (173; the removal's 191)", [len(tf[n.encode()]["ad"]) for n in names],
              [173, 173, 173, 173, 191])
        ck.eq("sealed 528, opened 512", {(v["sealed_len"], v["opened_len"]) for v in tf.values()}, {(528, 512)})
        plens = [int(x) for x in re.search(r"the plaintexts are\s+([\d, and]+) bytes", doc).group(1)
                 .replace("and", ",").replace(" ", "").split(",") if x]
        ck.eq("unpadded plaintext lengths", [len(tf[n.encode()]["plaintext"]) for n in names], plens)
        want1 = bytes.fromhex("0002" "08757365726e616d65" "00" "00000005616c696365"
                              "0870617373776f7264" "00" "0000000768756e74657232")
        ck.eq("first plaintext (section 4 worked example)", tf[names[0].encode()]["plaintext"], want1)
        m3 = re.search(r"38\s+bytes: `([0-9a-f ]+\n?[0-9a-f ]*)`", doc)
        ck.eq("third plaintext (section 4 worked example)", tf[names[2].encode()]["plaintext"],
              bytes.fromhex(re.sub(r"\s", "", m3.group(1))))
        ck.eq("removal plaintext 0000", tf[names[4].encode()]["plaintext"], b"\x00\x00")
        # the table of files
        A, B = 0x1011121314151617, 0x8081828384858687
        devs = {"A": A, "B": B}
        clk = lambda s: int("01a3185c5000000" + s[-1], 16)
        st = load(vault, passphrase)
        bypath = {}
        for ch in st["changes"]:
            bypath.setdefault(ch.path.decode(), []).append(ch)
        for row in re.finditer(r"^\| `([0-9a-f]{16}/[^`]+\.mtv)` \| (set|removal) `([0-9a-fA-F]{8})-…`, id \((A|B), `…(\d\d)`, (\d+)\), seen ([^|]+)\| ([^|]+)\|$", doc, re.M):
            path, kind, uprefix, dv, c, idx, seen, flds = row.groups()
            chs = bypath.get(path, [])
            ok = len(chs) == 1
            if ok:
                ch = chs[0]
                want_seen = []
                for sm in re.finditer(r"\((A|B), `…(\d\d)`, (\d+)\)", seen):
                    want_seen.append((devs[sm.group(1)], clk(sm.group(2)), int(sm.group(3))))
                got = (ch.kind, ch.name[:8].decode(), ch.device, ch.clock, ch.index, ch.seen)
                want = (1 if kind == "set" else 2, uprefix, devs[dv], clk(c), int(idx), want_seen)
                ck.eq("table row %s: clear part" % path, got, want)
                wf = {}
                for fm in re.finditer(r"`([a-z-]+)` = `([^`]*)` \(\{([^}]*)\}\)", flds):
                    sp = {}
                    for pm in re.finditer(r"(A|B): `…(\d\d)`", fm.group(3)):
                        sp[devs[pm.group(1)]] = clk(pm.group(2))
                    wf[fm.group(1).encode()] = (fm.group(2).encode(), sp)
                ck.eq("table row %s: fields" % path, ch.fields, wf)
            else:
                ck.eq("table row %s: one change" % path, len(chs), 1)
        # the expected result (section "Test vectors", prose after the table)
        j = to_json(r)
        ck.eq("accounts", [a["uuid"] for a in j["accounts"]], ["6BA7B810-9DAD-11D1-80B4-00C04FD430C8"])
        if j["accounts"]:
            a = j["accounts"][0]
            ck.eq("fields", a["fields"], {"username": "alice", "password": "from-b"})
            ck.eq("conflicts", a["conflicts"], {"password": [{"device": "1011121314151617",
                  "clock": "01a3185c50000003", "index": 0, "time_ms": 1800000000000, "value": "from-a"}]})
            ck.eq("no removal conflict", a["removal_conflicts"], [])
            ck.eq("no trusted list", a["trusted"], [])
        ck.eq("guarding off", j["guard"], False)
        ck.eq("no file skipped", j["skipped"], [])
        # doc-described behaviours on altered copies of the vector folder
        def variant(name, mutate, want):
            v = os.path.join(tmp, name)
            shutil.copytree(vault, v)
            mutate(v)
            try:
                got = to_json(read(v, passphrase))["skipped"]
            except (VaultError, WrongPassphrase) as e:
                got = "%s: %s" % (type(e).__name__, e)
            ck.eq("altered folder: " + name, got, want)
        f1 = names[0]

        def flip(v):
            p = os.path.join(v, f1)
            d = bytearray(open(p, "rb").read())
            d[-1] ^= 1
            open(p, "wb").write(bytes(d))
        variant("flipped-byte", flip, [{"path": f1, "reason": "vault damaged: fails authentication (altered, truncated, renamed or from another vault)"}])

        def moved(v):
            os.rename(os.path.join(v, f1), os.path.join(v, "1011121314151617/01a3185c50000009-78797a7b.mtv"))
        variant("renamed", moved, [{"path": "1011121314151617/01a3185c50000009-78797a7b.mtv",
                                    "reason": "vault damaged: renamed or moved (its header names 1011121314151617/01a3185c50000001)"}])

        def renamed_random(v):
            os.rename(os.path.join(v, f1), os.path.join(v, "1011121314151617/01a3185c50000001-00000000.mtv"))
        variant("renamed-random", renamed_random, [{"path": "1011121314151617/01a3185c50000001-00000000.mtv",
                "reason": "vault damaged: fails authentication (altered, truncated, renamed or from another vault)"}])

        def trunc(v):
            p = os.path.join(v, f1)
            d = open(p, "rb").read()
            open(p, "wb").write(d[:-100])
        variant("truncated", trunc, [{"path": f1, "reason": "vault damaged: truncated (428 bytes)"}])

        def conflict_copy(v):
            shutil.copy(os.path.join(v, f1), os.path.join(v, "1011121314151617/01a3185c50000001-78797a7b.sync-conflict-20250101-000000-ABCDEFG.mtv"))
            open(os.path.join(v, "README"), "w").write("x")
            open(os.path.join(v, "1011121314151617/.tmp-writer"), "w").write("x")
            open(os.path.join(v, "keys/old.slot~"), "w").write("x")
        variant("synchroniser-names", conflict_copy, [
            {"path": "1011121314151617/01a3185c50000001-78797a7b.sync-conflict-20250101-000000-ABCDEFG.mtv",
             "reason": "not a change file (a synchroniser's conflict copy)"},
            {"path": "README", "reason": "not a device folder"},
            {"path": "keys/old.slot~", "reason": "not a key slot (a backup copy)"}])

        def other_id(v):
            open(os.path.join(v, "id"), "w").write("ff" * 16 + "\n")
        variant("other-id", other_id, "WrongPassphrase: wrong passphrase")
        variant("no-id", lambda v: os.remove(os.path.join(v, "id")),
                "VaultError: vault damaged: %s has no id file: not a vault folder" % os.path.join(tmp, "no-id"))
        variant("bad-id", lambda v: open(os.path.join(v, "id"), "w").write("xyz\n"),
                "VaultError: vault damaged: its id file is not 32 hex digits")
        variant("no-keys", lambda v: shutil.rmtree(os.path.join(v, "keys")), "WrongPassphrase: wrong passphrase")
        try:
            read(vault, b"correct horse battery stapler")
            ck.eq("wrong passphrase refused", "opened", "WrongPassphrase")
        except WrongPassphrase:
            ck.eq("wrong passphrase refused", "WrongPassphrase", "WrongPassphrase")
        # a guarded vault and a trusted list, written here with the vectors' master key
        key = trace["master_key"]

        def write_change(v, dev, clock, chs):
            hdr = CHANGE_MAGIC + dev.to_bytes(8, "big") + clock.to_bytes(8, "big") + len(chs).to_bytes(4, "big")
            pt = b""
            for kind, uuid, name, fields in chs:
                hdr += bytes([kind]) + uuid + bytes([len(name)]) + name + clock.to_bytes(8, "big") + b"\0\0\0\0"
                pt += len(fields).to_bytes(2, "big")
                for fn, fv in fields:
                    pt += bytes([len(fn)]) + fn + b"\0" + len(fv).to_bytes(4, "big") + fv
            padded = pt + b"\x80" + b"\0" * (511 - len(pt) % 512)
            rel = ("%016x/%016x-01020304.mtv" % (dev, clock)).encode()
            nonce = os.urandom(24)
            ad = AD_CHANGE + vault_id + rel + b"\0" + hdr
            ct = nb.crypto_aead_xchacha20poly1305_ietf_encrypt(padded, ad, nonce, key)
            os.makedirs(os.path.join(v, "%016x" % dev), exist_ok=True)
            open(os.path.join(v, rel.decode()), "wb").write(hdr + nonce + ct)
        g = os.path.join(tmp, "guarded")
        shutil.copytree(vault, g)
        tr = (2).to_bytes(2, "big") + b"\x11" * 32 + (9).to_bytes(2, "big") + b"/bin/true" + \
            b"\x22" * 32 + (4).to_bytes(2, "big") + b"/x\xffy" + b"junk"
        uu = bytes.fromhex("6ba7b8109dad11d180b400c04fd430c8")
        write_change(g, 0x1011121314151617, 0x01a3185c50000010,
                     [(1, ZERO_UUID, b"00000000-0000-0000-0000-000000000000", [(b"guard", b"1")]),
                      (1, uu, b"6ba7b810-9dad-11d1-80b4-00c04fd430c8",
                       [(b"trusted", tr), (b"attribute:xdg:schema", b"org.example"), (b"password", b""),
                        (b"futurefield", b"kept")])])
        j = to_json(read(g, passphrase))
        ck.eq("guard = 1 reads on", j["guard"], True)
        a = j["accounts"][0]
        ck.eq("trusted decoded leniently (stops at non-UTF-8 path)", a["trusted"],
              [{"sha256": "11" * 32, "path": "/bin/true"}])
        ck.eq("cleared password unset; conflict from-a stays current; name of greatest change",
              (a["uuid"], "password" in a["fields"], a["attributes"], a["fields"].get("futurefield")),
              ("6ba7b810-9dad-11d1-80b4-00c04fd430c8", False, {"xdg:schema": "org.example"}, "kept"))
        write_change(g, 0x8081828384858687, 0x01a3185c50000011,
                     [(1, ZERO_UUID, b"00000000-0000-0000-0000-000000000000", [(b"guard", b"0")])])
        ck.eq("guard = 0 later reads off", to_json(read(g, passphrase))["guard"], False)
        check_merge_examples(ck)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (ck.ok, ck.bad))
    return 0 if ck.bad == 0 else 4


# ---------------------------------------------------------------- main

def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="Read an mtmfs vault format 3 folder.")
    ap.add_argument("vault", nargs="?")
    ap.add_argument("--passphrase-file")
    ap.add_argument("--locked", action="store_true", help="no passphrase: list the clear parts only")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--strict", action="store_true", help="exit 3 when a file was skipped")
    ap.add_argument("--vectors", metavar="DOC.md")
    a = ap.parse_args(argv)
    if a.vectors:
        return run_vectors(a.vectors)
    if not a.vault or (not a.passphrase_file and not a.locked):
        ap.print_usage(sys.stderr)
        print("read_vault.py: give VAULT_DIR and --passphrase-file FILE (or --locked)", file=sys.stderr)
        return 64
    pp = None
    if a.passphrase_file:
        try:
            pp = read_passphrase(a.passphrase_file)
        except OSError as e:
            print("read_vault.py: cannot read the passphrase file: %s" % e, file=sys.stderr)
            return 64
        if not pp:
            print("read_vault.py: empty passphrase (mtmfs refuses an empty passphrase)", file=sys.stderr)
            return 1
    try:
        r = read(a.vault, pp)
    except WrongPassphrase as e:
        print("read_vault.py: %s" % e, file=sys.stderr)
        return 1
    except VaultError as e:
        print("read_vault.py: %s" % e, file=sys.stderr)
        return 2
    if a.json:
        json.dump(to_json(r), sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        print_text(r, a.vault)
    if a.strict and r["skipped"]:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
