import CSQLite
import Posix

/// An SQLite failure: the result code, SQLite's message and the statement that failed.
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
    public init(path: String, create: Bool = false) throws(SQLiteError) {
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(db)
            throw SQLiteError(code: rc, message: message, sql: nil)
        }
        handle = db
    }

    deinit { sqlite3_close_v2(handle) }

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
public enum CacheDatabase {
    /// SQLite `application_id` of an mtmfs cache ("MTMC").
    public static let applicationID: Int32 = 0x4D54_4D43

    /// Creates an empty cache database in WAL mode, durable before it returns.
    public static func createEmpty(at path: String) throws(SQLiteError) {
        let db = try SQLiteDatabase(path: path, create: true)
        try db.execute("PRAGMA journal_mode=WAL; PRAGMA application_id=\(applicationID);")
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

    /// Binds the arguments (Int64, String, [UInt8], UnsafeRawBufferPointer, nil) in order.
    @discardableResult
    func bind(_ values: Any?...) -> Statement {
        bindArray(values)
        return self
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
    var lastInsertedRow: Int64 { sqlite3_last_insert_rowid(handle) }
}
