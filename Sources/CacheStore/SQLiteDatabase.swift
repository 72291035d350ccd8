import CSQLite
import Posix

/// An SQLite failure: the result code, SQLite's message and the statement that failed.
///
/// Thread-safety: a value; `Sendable`.
public struct SQLiteError: Error, CustomStringConvertible, Sendable {
    public let code: Int32
    public let message: String
    public let sql: String?

    public var description: String {
        "SQLite error \(code) (\(message))" + (sql.map { " in `\($0)`" } ?? "")
    }
}

/// One SQLite connection (`sqlite3*`), closed on deinit.
///
/// Thread-safety: none of its own; SQLite is built serialized, but statements and
/// transactions must be used from one thread at a time (the owner locks around them).
public final class SQLiteDatabase {
    let handle: OpaquePointer

    /// Opens (or creates, with `create`) the database at `path`.
    public init(path: String, create: Bool = false, readOnly: Bool = false) throws(SQLiteError) {
        var db: OpaquePointer?
        let flags = (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(db)
            throw SQLiteError(code: rc, message: message, sql: nil)
        }
        handle = db
    }

    deinit { sqlite3_close_v2(handle) }

    /// Frames in the write-ahead log after this connection's last commit (SQLite counts from
    /// where it last started the log over): what a checkpoint has left to copy, at most.
    /// Kept once `countLogFrames` was called.
    public private(set) var logFrames = 0

    /// After a RESTART or TRUNCATE checkpoint that succeeded, the next commit starts the
    /// log over: nothing is left to copy until then.
    public func noteLogCopied() { logFrames = 0 }

    /// Keeps `logFrames` after every commit (the log's file keeps its size when SQLite
    /// starts the log over: the file says nothing of what is still to copy). This replaces
    /// SQLite's automatic checkpoint (its hook), as `PRAGMA wal_autocheckpoint` would
    /// replace this: the owner checkpoints.
    public func countLogFrames() {
        sqlite3_wal_hook(handle, { context, _, _, pages in
            if let context { Unmanaged<SQLiteDatabase>.fromOpaque(context).takeUnretainedValue().logFrames = Int(pages) }
            return SQLITE_OK
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Runs one or more statements that return no rows.
    public func execute(_ sql: String) throws(SQLiteError) {
        var errorMessage: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &errorMessage)
        guard rc == SQLITE_OK else {
            let message = errorMessage.map { String(cString: $0) } ?? String(cString: sqlite3_errstr(rc))
            sqlite3_free(errorMessage)
            throw SQLiteError(code: rc, message: message, sql: sql)
        }
    }

    /// Inside an explicit transaction (SQLite may have rolled one back on an error).
    public var isInTransaction: Bool { sqlite3_get_autocommit(handle) == 0 }

    /// A checkpoint of the write-ahead log (`SQLITE_CHECKPOINT_PASSIVE`, `…_TRUNCATE`):
    /// frames in the log and frames copied into the database after it.
    public func checkpoint(mode: Int32) throws(SQLiteError) -> (log: Int, copied: Int) {
        var log: Int32 = 0, copied: Int32 = 0
        let rc = sqlite3_wal_checkpoint_v2(handle, nil, mode, &log, &copied)
        guard rc == SQLITE_OK || rc == SQLITE_BUSY else { throw error(rc, "checkpoint") }
        return (Int(log), Int(copied))
    }

    /// A checkpoint that waits at most `seconds` for readers and writers (then SQLITE_BUSY
    /// is thrown); the connection's own busy timeout is restored after.
    public func checkpoint(mode: Int32, waitingAtMost seconds: Double) throws(SQLiteError) {
        sqlite3_busy_timeout(handle, Int32(seconds * 1000))
        defer { sqlite3_busy_timeout(handle, 5000) }
        let rc = sqlite3_wal_checkpoint_v2(handle, nil, mode, nil, nil)
        guard rc == SQLITE_OK else { throw error(rc, "checkpoint") }
    }

    /// Pages on the free list (nil when SQLite cannot say).
    public var freePages: Int64? { (try? scalarText("PRAGMA freelist_count")).flatMap { $0.flatMap { Int64($0) } } }

    /// The database's page size in bytes.
    public var pageSize: Int { Int((try? scalarText("PRAGMA page_size")).flatMap { $0.flatMap { Int($0) } } ?? 4096) }

    /// The first two columns of every row of a query, as integers.
    public func pairs(_ sql: String) throws(SQLiteError) -> [(Int64, Int64)] {
        var statement: OpaquePointer?
        var rc = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard rc == SQLITE_OK else { throw error(rc, sql) }
        defer { sqlite3_finalize(statement) }
        var values: [(Int64, Int64)] = []
        while true {
            rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { return values }
            guard rc == SQLITE_ROW else { throw error(rc, sql) }
            values.append((sqlite3_column_int64(statement, 0), sqlite3_column_int64(statement, 1)))
        }
    }

    /// The first column of every row of a query, as integers.
    public func integers(_ sql: String) throws(SQLiteError) -> [Int64] {
        var statement: OpaquePointer?
        var rc = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard rc == SQLITE_OK else { throw error(rc, sql) }
        defer { sqlite3_finalize(statement) }
        var values: [Int64] = []
        while true {
            rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { return values }
            guard rc == SQLITE_ROW else { throw error(rc, sql) }
            values.append(sqlite3_column_int64(statement, 0))
        }
    }

    /// Every column of the first row of a query, as integers (empty: no row).
    public func integerRow(_ sql: String) throws(SQLiteError) -> [Int64] {
        var statement: OpaquePointer?
        var rc = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard rc == SQLITE_OK else { throw error(rc, sql) }
        defer { sqlite3_finalize(statement) }
        rc = sqlite3_step(statement)
        if rc == SQLITE_DONE { return [] }
        guard rc == SQLITE_ROW else { throw error(rc, sql) }
        return (0..<sqlite3_column_count(statement)).map { sqlite3_column_int64(statement, $0) }
    }

    /// Runs `body` with `tick` called every `steps` virtual-machine steps of SQLite (for
    /// saying that a long statement is still working).
    public func withProgress<T>(every steps: Int32, _ tick: @escaping () -> Void,
                                _ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
        let box = Unmanaged.passRetained(ProgressBox(tick))
        defer { box.release() }
        sqlite3_progress_handler(handle, steps, { context in
            if let context { Unmanaged<ProgressBox>.fromOpaque(context).takeUnretainedValue().tick() }
            return 0
        }, box.toOpaque())
        defer { sqlite3_progress_handler(handle, 0, nil, nil) }
        return try body()
    }

    /// The first column of the first row of a query, as text.
    public func scalarText(_ sql: String) throws(SQLiteError) -> String? {
        var statement: OpaquePointer?
        var rc = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard rc == SQLITE_OK else { throw error(rc, sql) }
        defer { sqlite3_finalize(statement) }
        rc = sqlite3_step(statement)
        if rc == SQLITE_DONE { return nil }
        guard rc == SQLITE_ROW else { throw error(rc, sql) }
        return sqlite3_column_text(statement, 0).map { String(cString: $0) }
    }

    func error(_ rc: Int32, _ sql: String?) -> SQLiteError {
        SQLiteError(code: rc, message: String(cString: sqlite3_errmsg(handle)), sql: sql)
    }
}

/// The cache store's database file (`cache.sqlite`).
///
/// Thread-safety: stateless; `createEmpty` works on its own connection.
public enum CacheDatabase {
    /// SQLite `application_id` of an mtmfs cache ("MTMC").
    public static let applicationID: Int32 = 0x4D54_4D43

    /// Creates an empty cache database in WAL mode, durable before it returns.
    public static func createEmpty(at path: String) throws(SQLiteError) {
        let db = try SQLiteDatabase(path: path, create: true)
        // Incremental vacuum (space given back, see CacheStore.reclaimStep) can only be chosen
        // while the file is empty, before the header is written.
        try db.execute("PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL; PRAGMA application_id=\(applicationID);")
        // SQLite creates files 0644 (less the umask); the store is private. The -wal and
        // -shm files copy the database's mode.
        do {
            try Syscall.chmod(path, mode: 0o600)
        } catch {
            throw SQLiteError(code: SQLITE_CANTOPEN, message: "chmod 0600: \(error)", sql: nil)
        }
    }
}

/// A prepared statement, reused: `reset` between uses, finalized on deinit.
///
/// Thread-safety: none; used under the lock of its connection's owner.
final class Statement {
    let handle: OpaquePointer
    let sql: String
    unowned let database: SQLiteDatabase

    init(_ database: SQLiteDatabase, _ sql: String) throws(SQLiteError) {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(database.handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw database.error(rc, sql) }
        self.handle = statement
        self.sql = sql
        self.database = database
    }

    deinit { sqlite3_finalize(handle) }

    /// Binds the arguments in order (clearing earlier bindings first).
    @discardableResult
    func bind(_ values: any SQLiteBindable...) -> Statement {
        bind(values)
        return self
    }

    func bind(_ values: [any SQLiteBindable]) {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        for (offset, value) in values.enumerated() { value.bind(to: handle, at: Int32(offset + 1)) }
    }

    /// Steps once: true for a row, false when done.
    func step() throws(SQLiteError) -> Bool {
        let rc = sqlite3_step(handle)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE { return false }
        let error = database.error(rc, sql)
        sqlite3_reset(handle)
        throw error
    }

    /// Runs to completion (for statements that return no rows).
    func run() throws(SQLiteError) {
        while try step() {}
        sqlite3_reset(handle)
    }

    func int(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }
    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }
    func blob(_ column: Int32) -> UnsafeRawBufferPointer {
        let count = Int(sqlite3_column_bytes(handle, column))
        return UnsafeRawBufferPointer(start: sqlite3_column_blob(handle, column), count: count)
    }
    func bytes(_ column: Int32) -> [UInt8] { Array(blob(column)) }
    func text(_ column: Int32) -> String {
        sqlite3_column_text(handle, column).map { String(cString: $0) } ?? ""
    }
    func done() { sqlite3_reset(handle) }
}

extension SQLiteDatabase {
    var changes: Int { Int(sqlite3_changes(handle)) }
    /// Rows changed by every statement since the connection opened (triggers' included).
    var totalChanges: Int64 { sqlite3_total_changes64(handle) }
    var lastInsertedRow: Int64 { sqlite3_last_insert_rowid(handle) }
}

/// A Swift value that binds to a statement parameter as the SQLite type it is: integers as
/// INTEGER, strings as TEXT, bytes as BLOB (an empty one as a zero-length BLOB, not NULL),
/// nil as NULL. Nothing else can be bound, so no value silently becomes NULL.
///
/// Thread-safety: conformers are values; `bind` touches only the statement it is given.
protocol SQLiteBindable {
    func bind(to statement: OpaquePointer, at index: Int32)
}

extension Int64: SQLiteBindable {
    func bind(to statement: OpaquePointer, at index: Int32) { sqlite3_bind_int64(statement, index, self) }
}

extension Int: SQLiteBindable {
    func bind(to statement: OpaquePointer, at index: Int32) { sqlite3_bind_int64(statement, index, Int64(self)) }
}

extension String: SQLiteBindable {
    func bind(to statement: OpaquePointer, at index: Int32) {
        sqlite3_bind_text(statement, index, self, -1, SQLiteBinding.transient)
    }
}

extension UnsafeRawBufferPointer: SQLiteBindable {
    func bind(to statement: OpaquePointer, at index: Int32) {
        // A zero-length blob (not NULL, which a nil pointer would bind).
        if let baseAddress, count > 0 {
            sqlite3_bind_blob(statement, index, baseAddress, Int32(count), SQLiteBinding.transient)
        } else {
            sqlite3_bind_zeroblob(statement, index, 0)
        }
    }
}

extension Array: SQLiteBindable where Element == UInt8 {
    func bind(to statement: OpaquePointer, at index: Int32) {
        withUnsafeBytes { $0.bind(to: statement, at: index) }
    }
}

extension ArraySlice: SQLiteBindable where Element == UInt8 {
    func bind(to statement: OpaquePointer, at index: Int32) {
        withUnsafeBytes { $0.bind(to: statement, at: index) }
    }
}

extension Optional: SQLiteBindable where Wrapped: SQLiteBindable {
    func bind(to statement: OpaquePointer, at index: Int32) {
        if let value = self { value.bind(to: statement, at: index) } else { sqlite3_bind_null(statement, index) }
    }
}

/// Constants for binding: SQLite's `SQLITE_TRANSIENT`.
///
/// Thread-safety: constants only.
enum SQLiteBinding {
    /// `SQLITE_TRANSIENT` (a macro): SQLite copies the bytes before the call returns.
    static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
}

/// The closure a progress handler calls, kept alive while the handler is set.
///
/// Thread-safety: immutable; `tick` runs on the thread of the statement being stepped.
final class ProgressBox {
    let tick: () -> Void
    init(_ tick: @escaping () -> Void) { self.tick = tick }
}
