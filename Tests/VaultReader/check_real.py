#!/usr/bin/python3
"""Make real vaults with the real mtmfs and check read_vault.py against what the mount shows.

  check_real.py [-v] [--mtmfs PATH]

Every scenario: drive a mount with sh/echo/cat/mkdir/rm, record what `cat` shows for every
account and field (and attributes/, trusted, conflicts/), unmount, run read_vault.py --json
on DATA_DIR/vault and compare. Exit 0 only if everything matches; the last line is
"N passed, M failed".
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
READER = os.path.join(HERE, "read_vault.py")
MTMFS = os.path.join(os.path.dirname(os.path.dirname(HERE)), ".build", "debug", "mtmfs")  # (--mtmfs PATH)
NINE = ["label", "protocol", "server", "port", "path", "comment", "username", "password", "otp"]
VERBOSE = False

passed = failed = 0
mounts = []


def log(*a):
    if VERBOSE:
        print(*a, flush=True)


def note(msg):
    print("note: " + msg, flush=True)


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        log("ok    " + what)
    else:
        failed += 1
        print("FAIL  " + what + (("\n      " + detail) if detail else ""), flush=True)


def mtmfs(*args, input=None, ok=(0,), timeout=180):
    """Run mtmfs; retry while the binary is missing or being replaced by a build."""
    for attempt in range(60):
        try:
            r = subprocess.run([MTMFS] + list(args), input=input, capture_output=True, timeout=timeout)
        except (FileNotFoundError, PermissionError, OSError) as e:
            log("mtmfs not runnable (%s), retrying" % e)
            time.sleep(5)
            continue
        if r.returncode in (126, 127):
            time.sleep(5)
            continue
        if ok is not None and r.returncode not in ok:
            raise RuntimeError("mtmfs %s -> %d: %s %s" % (" ".join(args), r.returncode,
                                                          r.stdout.decode(errors="replace"),
                                                          r.stderr.decode(errors="replace")))
        return r
    raise RuntimeError("mtmfs could not be run")


def sh(script, *args, timeout=60):
    r = subprocess.run(["sh", "-c", script, "sh"] + list(args), capture_output=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError("sh %r %r -> %d: %s" % (script, args, r.returncode, r.stderr.decode(errors="replace")))
    return r


def put(path, value):
    """echo VALUE > PATH (printf, so that backslashes stay as they are)."""
    sh('printf "%s\\n" "$1" > "$2"', value, path)


def put_raw(path, data):
    sh('printf "%s" "$1" > "$2"', data, path)


def cat(path):
    r = subprocess.run(["cat", path], capture_output=True, timeout=60)
    if r.returncode != 0:
        return None
    return r.stdout


def mount(data, mnt, pp):
    os.makedirs(mnt, exist_ok=True)
    mtmfs("mount", "--data-dir", data, mnt)
    mounts.append(mnt)
    mtmfs("unlock", "--passphrase-file", pp, mnt)


def unmount(mnt):
    mtmfs("unmount", mnt)
    if mnt in mounts:
        mounts.remove(mnt)


def is_uuid(n):
    return re.fullmatch(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", n) is not None


def snapshot(mnt):
    """What the mount shows, through cat."""
    acc = {}
    base = os.path.join(mnt, "accounts")
    order = [n for n in os.listdir(base) if is_uuid(n)]
    for n in order:
        d = os.path.join(base, n)
        a = {"fields": {f: cat(os.path.join(d, f)) for f in NINE + ["url"]}}
        a["trusted"] = cat(os.path.join(d, "trusted"))
        ad = os.path.join(d, "attributes")
        a["attributes"] = {x: cat(os.path.join(ad, x)) for x in os.listdir(ad)} if os.path.isdir(ad) else {}
        cd = os.path.join(d, "conflicts")
        a["conflicts"] = {x: cat(os.path.join(cd, x)) for x in os.listdir(cd)} if os.path.isdir(cd) else {}
        acc[n] = a
    return {"accounts": acc, "order": order}


def reader(vault, pp, extra=()):
    r = subprocess.run(["/usr/bin/python3", READER, vault] + (["--passphrase-file", pp] if pp else []) +
                       ["--json"] + list(extra), capture_output=True, timeout=300)
    j = None
    if r.returncode == 0:
        j = json.loads(r.stdout)
    return r.returncode, j, r.stderr.decode(errors="replace")


def digits(s):
    return re.sub(r"[^0-9]", "", s)


def esc(v):
    return v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def compare(tag, snap, j, order_is_check=True):
    """Compare the reader's JSON with the mount's snapshot."""
    check("%s: reader skipped no file" % tag, j["skipped"] == [], repr(j["skipped"]))
    racc = {a["uuid"]: a for a in j["accounts"]}
    check("%s: same accounts (%d)" % (tag, len(snap["accounts"])),
          sorted(racc) == sorted(snap["accounts"]),
          "reader %s\n      mount  %s" % (sorted(racc), sorted(snap["accounts"])))
    ro = [a["uuid"] for a in j["accounts"]]
    if order_is_check:
        check("%s: reader's account order (§6) = the mount's readdir order" % tag, ro == snap["order"],
              "reader %s\n      mount  %s" % (ro, snap["order"]))
    elif ro != snap["order"]:
        note("%s: account order differs from the live mount's: reader %s, mount %s" % (tag, ro, snap["order"]))
    for u, s in snap["accounts"].items():
        a = racc.get(u)
        if a is None:
            continue
        for f in NINE:
            want = s["fields"][f]
            got = (a["fields"].get(f, "") + "\n").encode()
            if want is None and f not in a["fields"]:
                # the mount hides a field file after `rm FIELD` (until the next mount); the
                # value is empty, i.e. unset, which is what the reader says
                note("%s: %s/%s has no file in the mount (rm'd); reader: unset" % (tag, u[:8], f))
                want = b"\n"
            check("%s: %s %s" % (tag, u[:8], f), got == want, "reader %r, cat %r" % (got, want))
        got = (a["url"] + "\n").encode()
        check("%s: %s url (derived)" % (tag, u[:8]), got == s["fields"]["url"],
              "reader %r, cat %r" % (got, s["fields"]["url"]))
        ga = {k: (v + "\n").encode() for k, v in a["attributes"].items()}
        check("%s: %s attributes" % (tag, u[:8]), ga == s["attributes"], "reader %r, mount %r" % (ga, s["attributes"]))
        # trusted: one line per program, with its path and hash
        lines = [l for l in (s["trusted"] or b"").decode(errors="replace").split("\n") if l.strip()]
        ok = len(lines) == len(a["trusted"]) and all(
            p["path"] in l and p["sha256"] in l for p, l in zip(a["trusted"], lines))
        check("%s: %s trusted (%d programs)" % (tag, u[:8], len(a["trusted"])), ok,
              "reader %r, cat %r" % (a["trusted"], s["trusted"]))
        # conflicts of the nine fields, and removed
        want_c = {}
        for f, lst in a["conflicts"].items():
            if f in NINE:
                want_c[f] = lst
        if a["removal_conflicts"]:
            want_c["removed"] = a["removal_conflicts"]
        check("%s: %s conflict files" % (tag, u[:8]), sorted(want_c) == sorted(s["conflicts"]),
              "reader %r, mount %r" % (sorted(want_c), sorted(s["conflicts"])))
        for f, lst in want_c.items():
            text = s["conflicts"].get(f)
            if text is None:
                continue
            lines = text.decode(errors="replace").rstrip("\n").split("\n")
            ok = len(lines) == len(lst)
            for c, l in zip(lst, lines):
                cols = l.split("\t")
                t = datetime.fromtimestamp(c["time_ms"] / 1000, tz=timezone.utc).strftime("%Y%m%d%H%M%S")
                if f == "removed":
                    ok = ok and c["device"] in cols and any(digits(x).startswith(t) for x in cols)
                else:
                    ok = ok and len(cols) >= 3 and cols[0] == esc(c["value"]) and cols[1] == c["device"] \
                        and digits(cols[2]).startswith(t)
            check("%s: %s conflicts/%s" % (tag, u[:8], f), ok, "reader %r\n      cat %r" % (lst, text))


def new_uuid(upper=False):
    u = str(uuid.uuid4())
    return u.upper() if upper else u


def scenario_plain(tmp):
    data, mnt = os.path.join(tmp, "D"), os.path.join(tmp, "M")
    pp, pp2 = os.path.join(tmp, "P"), os.path.join(tmp, "P2")
    open(pp, "w").write("first pass phrase\n")
    open(pp2, "w").write("second pass phrase\n")
    mtmfs("init", "--data-dir", data, "--kdf", "interactive", "--passphrase-file", pp)
    vault = os.path.join(data, "vault")
    rc, j, err = reader(vault, pp)
    check("empty vault: reader reads it", rc == 0 and j["accounts"] == [] and j["skipped"] == [],
          "%d %r %s" % (rc, j, err))
    mount(data, mnt, pp)
    acc = os.path.join(mnt, "accounts")
    u1, u2, u3, u4, u5 = (new_uuid() for _ in range(5))
    for u in (u1, u2, u3, u4, u5):
        sh('mkdir "$1"', os.path.join(acc, u))
    d1 = os.path.join(acc, u1)
    vals = {"label": "Büro ☃ mail", "protocol": "imaps", "server": "mail.example.org", "port": "993",
            "path": "/inbox", "comment": "tab\there \\ backslash", "username": "alice@example.org",
            "password": "p4ss w0rd!\"'$`", "otp": "otpauth://totp/x?secret=JBSWY3DPEHPK3PXP"}
    for f, v in vals.items():
        put(os.path.join(d1, f), v)
    put(os.path.join(d1, "attributes", "xdg:schema"), "org.gnome.keyring.NetworkPassword")
    put(os.path.join(d1, "attributes", "application"), "evolution")
    d2 = os.path.join(acc, u2)
    put(os.path.join(d2, "url"), "https://h.example:8443/p")
    put(os.path.join(d2, "username"), "bob")
    put(os.path.join(d2, "password"), "will be cleared")
    put_raw(os.path.join(d2, "password"), "")          # echo -n > password
    put(os.path.join(d2, "comment"), "will be rm'd")
    sh('rm "$1"', os.path.join(d2, "comment"))
    d3 = os.path.join(acc, u3)
    put(os.path.join(d3, "label"), "to be removed")
    put(os.path.join(d3, "password"), "gone")
    sh('rm -r "$1"', d3)
    d5 = os.path.join(acc, u5)
    put_raw(os.path.join(d5, "comment"), "two\n\n")     # a value ending in \n
    for i in range(5):
        put(os.path.join(d5, "label"), "version %d" % i)
    put(os.path.join(d5, "attributes", "tmp"), "x")
    sh('rm "$1"', os.path.join(d5, "attributes", "tmp"))
    # a directory named in uppercase (the format keeps the name as given)
    u6 = new_uuid(upper=True)
    r = subprocess.run(["mkdir", os.path.join(acc, u6)], capture_output=True)
    if r.returncode == 0:
        put(os.path.join(acc, u6, "username"), "upper")
    else:
        log("note: mkdir of an uppercase UUID refused: %s" % r.stderr.decode().strip())
    empty = cat(os.path.join(acc, u4, "label"))
    check("cat of a never-written field shows one newline", empty == b"\n", repr(empty))
    check("cat of a cleared field shows one newline", cat(os.path.join(d2, "password")) == b"\n")
    snap = snapshot(mnt)
    check("removed account gone from the mount", u3 not in snap["accounts"])
    unmount(mnt)
    rc, j, err = reader(vault, pp)
    check("plain: reader exit 0", rc == 0, err)
    if j:
        compare("plain", snap, j)
        check("plain: guarding off", j["guard"] is False)
    rc, jl, err = reader(vault, None, ["--locked"])
    check("plain: locked listing has the same accounts", rc == 0 and
          sorted(a["uuid"] for a in jl["accounts"]) == sorted(snap["accounts"]), err)
    rc, _, err = reader(vault, pp2)
    check("plain: wrong passphrase exits 1 with 'wrong passphrase'", rc == 1 and "wrong passphrase" in err, err)
    return data, vault, pp, pp2, snap


def scenario_passwd(tmp, data, vault, pp, pp2, snap):
    mtmfs("passwd", "--data-dir", data, "--kdf", "interactive", "--passphrase-file", pp,
          "--new-passphrase-file", pp2)
    slots = sorted(os.listdir(os.path.join(vault, "keys")))
    log("slots after passwd: %s" % slots)
    rc, j, err = reader(vault, pp2)
    check("passwd: new passphrase opens", rc == 0, err)
    if j:
        compare("passwd", snap, j)
    rc, _, err = reader(vault, pp)
    check("passwd: old passphrase is refused (slot retired by a genuine slot)",
          rc == 1 and "wrong passphrase" in err, "rc %d %s" % (rc, err))
    # more writes, enough for a fold, under the new passphrase
    mnt = os.path.join(tmp, "M")
    mount(data, mnt, pp2)
    acc = os.path.join(mnt, "accounts")
    u = sorted(snap["accounts"])[0]
    for i in range(80):
        put(os.path.join(acc, u, "comment"), "comment %d" % i)
    put(os.path.join(acc, u, "password"), "after passwd")
    time.sleep(3)  # the fold runs on a background thread
    snap2 = snapshot(mnt)
    unmount(mnt)
    slots2 = sorted(os.listdir(os.path.join(vault, "keys")))
    log("slots after the next unlock: %s" % slots2)
    nfiles = sum(len(os.listdir(os.path.join(vault, d))) for d in os.listdir(vault) if re.fullmatch(r"[0-9a-f]{16}", d))
    log("change files after 81 writes: %d (fewer means a fold happened)" % nfiles)
    sys.dont_write_bytecode = True
    sys.path.insert(0, HERE)
    import read_vault as rv
    folded = 0
    for dv in os.listdir(vault):
        if re.fullmatch(r"[0-9a-f]{16}", dv):
            for fn in os.listdir(os.path.join(vault, dv)):
                m = re.fullmatch(r"([0-9a-f]{16})-[0-9a-f]{8}\.mtv", fn)
                if m:
                    f = rv.parse_change_clear(("%s/%s" % (dv, fn)).encode(), int(dv, 16), int(m.group(1), 16),
                                              open(os.path.join(vault, dv, fn), "rb").read())
                    if any(c.clock < int(m.group(1), 16) for c in f.changes):
                        folded += 1
    check("passwd+writes: a folded file (change clocks older than the file clock) is in the folder",
          folded >= 1, "%d change files, none folded" % nfiles)
    rc, j, err = reader(vault, pp2)
    check("passwd+writes: reader exit 0", rc == 0, err)
    if j:
        # the live mount still holds the changes a fold dropped: its order may differ
        compare("passwd+writes", snap2, j, order_is_check=False)
    mount(data, mnt, pp2)
    snap2 = snapshot(mnt)
    unmount(mnt)
    if j:
        compare("passwd+writes, remounted", snap2, j)
    rc, _, err = reader(vault, pp)
    check("passwd+writes: old passphrase still refused", rc == 1, err)
    return snap2


def scenario_two_devices(tmp, data, vault, pp2, snap):
    data2 = os.path.join(tmp, "D2")
    shutil.copytree(data, data2, symlinks=True)
    lock = os.path.join(data2, "mtmfs.lock")
    m1, m2 = os.path.join(tmp, "M1"), os.path.join(tmp, "M2")
    mount(data, m1, pp2)
    mount(data2, m2, pp2)
    names = sorted(snap["accounts"])
    ua, ub = names[0], names[1]
    a1, a2 = os.path.join(m1, "accounts"), os.path.join(m2, "accounts")
    put(os.path.join(a1, ua, "password"), "from-1")
    put(os.path.join(a1, ua, "label"), "label-1")
    sh('rm -r "$1"', os.path.join(a1, ub))
    time.sleep(0.05)
    put(os.path.join(a2, ua, "password"), "from-2")
    put_raw(os.path.join(a2, ua, "label"), "")
    put(os.path.join(a2, ub, "username"), "edited-2")
    put(os.path.join(a2, ua, "attributes", "application"), "from-device-2")
    put(os.path.join(a1, ua, "attributes", "application"), "from-device-1")
    unmount(m1)
    unmount(m2)
    vault2 = os.path.join(data2, "vault")
    devs1 = {d for d in os.listdir(vault) if re.fullmatch(r"[0-9a-f]{16}", d)}
    devs2 = {d for d in os.listdir(vault2) if re.fullmatch(r"[0-9a-f]{16}", d)}
    new = devs2 - devs1
    check("two devices: the copy wrote under a new device id", len(new) == 1, "%r %r" % (devs1, devs2))
    for d in new:
        shutil.copytree(os.path.join(vault2, d), os.path.join(vault, d))
    # the merged folder read before mtmfs mounts it again
    m = os.path.join(tmp, "M")
    mount(data, m, pp2)
    snap3 = snapshot(m)
    unmount(m)
    log("conflicts shown: %r" % {u: a["conflicts"] for u, a in snap3["accounts"].items()})
    check("two devices: the mount shows some conflict",
          any(a["conflicts"] for a in snap3["accounts"].values()))
    rc, j, err = reader(vault, pp2)
    check("two devices: reader exit 0", rc == 0, err)
    if j:
        compare("two devices", snap3, j)
        ja = {a["uuid"]: a for a in j["accounts"]}
        if ua in ja:
            check("two devices: password conflict read",
                  "password" in ja[ua]["conflicts"], repr(ja[ua]["conflicts"]))
            check("two devices: attribute conflict read (not shown by the mount)",
                  "attribute:application" in ja[ua]["conflicts"], repr(ja[ua]["conflicts"]))
        if ub in ja:
            check("two devices: removal conflict read", len(ja[ub]["removal_conflicts"]) == 1,
                  repr(ja[ub]["removal_conflicts"]))
    shutil.rmtree(data2, ignore_errors=True)


def scenario_guarded(tmp):
    # As root every program is writable by its user, and mtmfs refuses to trust such a
    # program with a guarded access; so fields are written with guarding off, and the
    # trusted lists are made with `mtmfs trust` (which needs only the passphrase).
    data, mnt, pp = os.path.join(tmp, "G"), os.path.join(tmp, "GM"), os.path.join(tmp, "GP")
    open(pp, "w").write("guarded pass\n")
    mtmfs("init", "--data-dir", data, "--kdf", "interactive", "--guard", "--passphrase-file", pp)
    vault = os.path.join(data, "vault")
    rc, j, err = reader(vault, pp)
    check("guarded init: reader says guarding on", rc == 0 and j["guard"] is True and j["accounts"] == [],
          "%d %r %s" % (rc, j, err))
    mount(data, mnt, pp)
    u, u2 = new_uuid(), new_uuid()
    d, d2 = os.path.join(mnt, "accounts", u), os.path.join(mnt, "accounts", u2)
    sh('mkdir "$1"', d)
    initial = cat(os.path.join(d, "trusted"))
    note("guarded: trusted list of an account made by mkdir as root: %r" % initial)
    mtmfs("guard", "off", "--passphrase-file", pp, mnt)
    sh('mkdir "$1"', d2)
    put(os.path.join(d, "username"), "guarded-user")
    put(os.path.join(d, "password"), "guarded-secret")
    put(os.path.join(d, "label"), "guarded")
    put(os.path.join(d2, "password"), "other")
    mtmfs("trust", "--passphrase-file", pp, d, os.path.realpath("/bin/sh"), shutil.which("cat"), shutil.which("mkdir"))
    mtmfs("trust", "--passphrase-file", pp, d2, shutil.which("cat"))
    mtmfs("trust", "--passphrase-file", pp, d, shutil.which("cat"))   # again: moves to the end
    snap = snapshot(mnt)
    unmount(mnt)
    rc, j, err = reader(vault, pp)
    check("guard off: reader exit 0", rc == 0, err)
    if j:
        check("guard off: guarding off", j["guard"] is False)
        compare("guard off", snap, j)
        ja = {a["uuid"]: a for a in j["accounts"]}
        check("guard off: trusted list order: sh, mkdir, cat (re-trusted last)",
              [os.path.basename(p["path"]) for p in ja.get(u, {}).get("trusted", [])] ==
              [os.path.basename(os.path.realpath("/bin/sh")), "mkdir", "cat"],
              repr(ja.get(u, {}).get("trusted")))
    mount(data, mnt, pp)
    mtmfs("guard", "on", "--passphrase-file", pp, mnt)
    mtmfs("untrust", "--passphrase-file", pp, d2, shutil.which("cat"))
    tr = {x: cat(os.path.join(mnt, "accounts", x, "trusted")) for x in (u, u2)}
    lab = cat(os.path.join(d, "label"))
    unmount(mnt)
    rc, j, err = reader(vault, pp)
    check("guard on: reader exit 0, guarding on", rc == 0 and j["guard"] is True, err)
    if j:
        ja = {a["uuid"]: a for a in j["accounts"]}
        for x in (u, u2):
            lines = [l for l in (tr[x] or b"").decode().split("\n") if l.strip()]
            got = ja.get(x, {}).get("trusted", [])
            check("guard on: %s trusted list = cat trusted (%d)" % (x[:8], len(lines)),
                  len(lines) == len(got) and all(p["path"] in l and p["sha256"] in l for p, l in zip(got, lines)),
                  "reader %r, cat %r" % (got, tr[x]))
        check("guard on: label readable and equal", lab == (ja.get(u, {}).get("fields", {}).get("label", "") + "\n").encode(),
              repr(lab))


def scenario_damage(tmp, vault, pp2):
    v = os.path.join(tmp, "damaged")
    shutil.copytree(vault, v, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    dev = sorted(d for d in os.listdir(v) if re.fullmatch(r"[0-9a-f]{16}", d))[0]
    f = sorted(os.listdir(os.path.join(v, dev)))[-1]
    p = os.path.join(v, dev, f)
    b = bytearray(open(p, "rb").read())
    b[-5] ^= 0x40
    open(p, "wb").write(bytes(b))
    shutil.copy(os.path.join(v, "id"), os.path.join(v, dev, f[:-4] + ".sync-conflict-20260101-000000-AAAAAAA.mtv"))
    rc, j, err = reader(v, pp2)
    want = [{"path": "%s/%s" % (dev, f), "reason": "vault damaged: fails authentication "
             "(altered, truncated, renamed or from another vault)"},
            {"path": "%s/%s" % (dev, f[:-4] + ".sync-conflict-20260101-000000-AAAAAAA.mtv"),
             "reason": "not a change file (a synchroniser's conflict copy)"}]
    check("damaged real file: skipped and named, the rest loads",
          rc == 0 and sorted(j["skipped"], key=lambda x: x["path"]) == sorted(want, key=lambda x: x["path"]),
          "%d %r %s" % (rc, j and j["skipped"], err))
    rc, _, err = reader(v, pp2, ["--strict"])
    check("damaged real file: --strict exits 3", rc == 3, err)
    open(os.path.join(v, "id"), "w").write("not an id\n")
    rc, _, err = reader(v, pp2)
    check("bad id: exit 2, 'its id file is not 32 hex digits'", rc == 2 and "not 32 hex digits" in err, err)
    os.remove(os.path.join(v, "id"))
    rc, _, err = reader(v, pp2)
    check("no id: exit 2, 'has no id file'", rc == 2 and "has no id file" in err, err)
    rc, _, err = reader(os.path.join(tmp, "nonexistent"), pp2)
    check("no folder: exit 2, 'vault unreadable: ENOENT'", rc == 2 and "vault unreadable: ENOENT" in err, err)


def main():
    global VERBOSE, MTMFS
    args = sys.argv[1:]
    if "-v" in args:
        VERBOSE = True
    if "--mtmfs" in args:
        MTMFS = args[args.index("--mtmfs") + 1]
    tmp = tempfile.mkdtemp(prefix="vault-real-")
    try:
        steps = []
        try:
            data, vault, pp, pp2, snap = scenario_plain(tmp)
            snap2 = scenario_passwd(tmp, data, vault, pp, pp2, snap)
            scenario_two_devices(tmp, data, vault, pp2, snap2)
            scenario_damage(tmp, vault, pp2)
        except Exception as e:
            check("plain/passwd/two-device scenarios ran", False, "%s: %s" % (type(e).__name__, e))
        try:
            scenario_guarded(tmp)
        except Exception as e:
            check("guarded scenario ran", False, "%s: %s" % (type(e).__name__, e))
    finally:
        for m in list(mounts):
            try:
                subprocess.run([MTMFS, "unmount", m], capture_output=True, timeout=60)
            except Exception:
                pass
            subprocess.run(["fusermount3", "-uz", m], capture_output=True)
        time.sleep(0.5)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
