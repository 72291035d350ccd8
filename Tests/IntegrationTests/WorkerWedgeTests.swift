import Foundation
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// No request may wait for something that only another request's answer would release
/// while every worker waits the same way (SPEC §7: the mount answers).
@Suite(.enabled(if: FuseAvailability.isAvailable, "needs /dev/fuse")) struct WorkerWedgeTests {
    /// An OPEN after a change invalidates its inode's pages on the spot, and the kernel's
    /// invalidation waits for each page's lock. A read-ahead of another handle keeps its
    /// pages locked until its READ is answered. Here eight OPENs (as many as the mount's
    /// workers) wait for the settings lock, held by the reload of a large outside change,
    /// while eight earlier handles read the same keys: their READs queue with the pages
    /// locked. Once the lock is free, each OPEN goes on to its invalidation; if all eight
    /// wait there, no worker is left to answer a READ, and the mount hangs for good.
    @Test func opensInvalidatingPagesLockedByQueuedReadsStillAnswer() throws {
        let store = try MountedStore()
        defer { store.close() }
        let pid = try #require(try store.status()["pid"])
        let run = Run.program("python3", ["-c", """
            import os, sys, time, threading, plistlib, glob
            mnt, data, daemon = sys.argv[1:4]
            device = os.stat(mnt).st_dev
            S = lambda k: os.path.join(mnt, "settings", k)
            keys = ["Wedge%d" % i for i in range(8)]
            for k in keys:
                with open(S(k), "w") as f: f.write("v" * 20000 + "\\n")
            plist = os.path.join(data, "Settings.plist")
            with open(plist, "rb") as f: root = plistlib.load(f)
            root.update({"Filler%07d" % i: "value %d" % i for i in range(400000)})
            with open(plist + ".new", "wb") as f: plistlib.dump(root, f, fmt=plistlib.FMT_BINARY)
            early = [os.open(S(k), os.O_RDONLY) for k in keys]    # admitted: they keep pages
            with open(S("Note"), "w") as f: f.write("changed\\n")  # so the next opens invalidate
            os.stat(mnt); os.stat(os.path.join(mnt, "settings"))
            for k in keys: os.stat(S(k))                          # cached names: no LOOKUP below
            opened, read = [], []
            def opener(k): os.close(os.open(S(k), os.O_RDONLY)); opened.append(k)
            def reader(fd): os.pread(fd, 65536, 0); read.append(fd)
            def waiting(): return sum(open(t + "/wchan").read() == "futex_do_wait" for t in glob.glob("/proc/%s/task/*" % daemon))
            idle = waiting()
            os.rename(plist + ".new", plist)   # the daemon reloads it under the settings lock
            time.sleep(0.2)
            threads = [threading.Thread(target=opener, args=(k,), daemon=True) for k in keys]
            for t in threads: t.start()
            time.sleep(0.3)                    # the eight OPENs hold every worker
            more = [threading.Thread(target=reader, args=(fd,), daemon=True) for fd in early]
            for t in more: t.start()
            time.sleep(0.3)
            inside = waiting() - idle
            if opened or read or inside < 8:
                print("not set up: the reload ended too soon (%d opened, %d read, %d workers waiting)" % (len(opened), len(read), inside))
                os._exit(4)
            deadline = time.time() + 20
            for t in threads + more: t.join(max(0, deadline - time.time()))
            print("%d of 8 opens and %d of 8 reads answered" % (len(opened), len(read)), flush=True)
            if len(opened) + len(read) == 16: os._exit(0)
            # Wedged, the daemon cannot even die (its workers wait in the kernel for pages
            # only an answer would unlock), nor can this script (its OPENs wait uninterruptibly):
            # abort the connection, as root may through fusectl.
            connections = "/sys/fs/fuse/connections"
            if not os.listdir(connections): os.system("mount -t fusectl none " + connections)
            with open("%s/%d/abort" % (connections, os.minor(device)), "w") as f: f.write("1")
            os._exit(3)
            """, store.mountPoint, store.dataDirectory, pid], timeout: 90)
        try #require(run.status != 4, "\(run)")
        #expect(run.status == 0, "\(run)")
        if run.status != 0 { Run.program("fusermount3", ["-uz", store.mountPoint]) }
        #expect(Run.program("stat", [store.path("settings/Wedge0")], timeout: 10).status == 0)
    }
}
