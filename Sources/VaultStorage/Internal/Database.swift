internal import CSQLite
internal import CWriteAheadBuffer
import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// One SQLite connection to a vault file. This target is the only importer of CSQLite.
///
/// Not thread-safe by itself: the vault serializes access. Several processes may open the same
/// file: writes take `BEGIN IMMEDIATE` and wait up to the busy timeout for each other.
package final class Database {
    private let handle: OpaquePointer
    private var statements: [StatementKey: Statement] = [:]
    /// The file, for messages.
    package let path: String
    /// Injected storage faults, for the fault-injection campaign.
    package var faults: StorageFaults?

    /// Opens (and with `create`, creates) the database at `path` with the vault's settings:
    /// WAL, `synchronous=FULL`, `secure_delete=ON`, and a busy timeout.
    ///
    /// - Parameters:
    ///   - pageSize: the page size of a database created now (SQLite's default when nil); an
    ///     existing file keeps its own.
    ///   - gatheringLogWrites: writes of the write-ahead log go through a VFS that hands each
    ///     commit's frames to the file in one `pwrite` instead of two per page, before the same
    ///     `fdatasync` (CWriteAheadBuffer): the same bytes, synced at the same moments.
    ///     Other connections read frames once the wal-index names them, which SQLite does after
    ///     the commit's sync (which flushes the gathered writes) only with `synchronous=FULL`,
    ///     the setting made here: a connection that lowers it must not gather.
    package init(
        path: String, create: Bool, pageSize: Int? = nil, gatheringLogWrites: Bool = false,
        busyTimeoutMilliseconds: Int32 = 10_000
    ) throws(LockboxError) {
        Self.configureProcess
        self.path = path
        var connection: OpaquePointer?
        var flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE
        if create { flags |= SQLITE_OPEN_CREATE }
        var vfs: UnsafePointer<CChar>?
        if gatheringLogWrites {
            let registered = lockbox_register_write_ahead_buffer()
            guard registered == SQLITE_OK else {
                throw Database.error(code: registered, message: "could not register the log-writing VFS", path: path, operation: "sqlite3_vfs_register")
            }
            vfs = lockbox_write_ahead_buffer_vfs
        }
        let result = sqlite3_open_v2(path, &connection, flags, vfs)
        guard result == SQLITE_OK, let connection else {
            let systemError = connection.map { sqlite3_system_errno($0) } ?? 0
            if let connection { sqlite3_close_v2(connection) }
            if result & 0xff == SQLITE_CANTOPEN && (systemError == EACCES || systemError == EPERM) {
                // There, but not this user's to open (chmod 000, say): out of reach, never missing.
                throw LockboxError(
                    .io,
                    "Cannot open \(path): \(String(cString: strerror(systemError))). It is there, but this user may not read and "
                        + "write it: give it back to its owner's use (`chmod 600 \(path)`), or check who owns it.",
                    cause: .systemCall("open", errno: systemError))
            }
            if result & 0xff == SQLITE_CANTOPEN && systemError != EMFILE && systemError != ENFILE {
                throw LockboxError(.noSuchKeychain, "No keychain at \(path). Create one with `lockbox init`.")
            }
            throw Database.error(code: result, message: "could not open", path: path, operation: "sqlite3_open_v2", systemError: systemError)
        }
        handle = connection
        sqlite3_busy_timeout(handle, busyTimeoutMilliseconds)
        do {
            // WAL lets readers proceed while a writer commits; FULL makes every acknowledged
            // write survive power loss; secure_delete overwrites deleted cells.
            if let pageSize { try execute("PRAGMA page_size=\(pageSize)") }
            try execute("PRAGMA journal_mode=WAL")
            try execute("PRAGMA synchronous=FULL")
            try execute("PRAGMA secure_delete=ON")
            try execute("PRAGMA trusted_schema=OFF")
            try execute("PRAGMA cell_size_check=ON")
        } catch {
            // Every stored property is set by now, so `deinit` runs after this throw and closes
            // the connection: closing it here too would close a freed connection (or one that
            // another thread's open has since been given at the same address).
            throw error
        }
    }

    /// SQLite's process-wide settings, made once before its first connection opens: no memory
    /// statistics (a global mutex taken around every allocation, for counters Lockbox never
    /// reads). If SQLite was already initialized in this process, nothing changes.
    private static let configureProcess: Void = {
        _ = lockbox_sqlite3_disable_memory_statistics()
    }()

    deinit {
        stepped.removeAll()
        beginImmediate = nil
        beginDeferred = nil
        commitStatement = nil
        statements.removeAll()
        sqlite3_close_v2(handle)
    }

    /// Runs SQL without results (schema changes, pragmas).
    package func execute(_ sql: String) throws(LockboxError) {
        try faults?.check(sql)
        var message: UnsafeMutablePointer<CChar>?
        let result = sqlite3_exec(handle, sql, nil, nil, &message)
        let text = message.map { String(cString: $0) } ?? ""
        sqlite3_free(message)
        guard result == SQLITE_OK else {
            throw Database.error(code: result, message: text, path: path, operation: "sqlite3_exec", systemError: sqlite3_system_errno(handle))
        }
    }

    /// A prepared statement, cached by its SQL text and reset for reuse.
    package func statement(_ sql: String) throws(LockboxError) -> Statement {
        if let cached = statements[StatementKey(sql)] {
            cached.reset()
            return cached
        }
        var raw: OpaquePointer?
        let result = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &raw, nil)
        guard result == SQLITE_OK, let raw else {
            throw Database.error(
                code: result, message: String(cString: sqlite3_errmsg(handle)), path: path, operation: "sqlite3_prepare_v3",
                systemError: sqlite3_system_errno(handle))
        }
        let statement = Statement(raw, database: self)
        statements[StatementKey(sql)] = statement
        return statement
    }

    /// A statement cache key that hashes the text's length and its last bytes only (where the
    /// vault's statements differ), not the whole text: a lookup runs several times per read
    /// and write. Equality still compares the whole text.
    private struct StatementKey: Hashable {
        let sql: String

        init(_ sql: String) { self.sql = sql }

        func hash(into hasher: inout Hasher) {
            let utf8 = sql.utf8
            hasher.combine(utf8.count)
            let hashed: Void? = utf8.withContiguousStorageIfAvailable { text in
                hasher.combine(bytes: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: text[max(0, text.count - 32)...])))
            }
            if hashed == nil { for byte in utf8.suffix(32) { hasher.combine(byte) } }
        }
    }

    /// Resets every statement stepped since the last reset, ending any read snapshot a partly
    /// stepped one holds.
    package func resetStatements() {
        for statement in stepped { statement.reset() }
        stepped.removeAll(keepingCapacity: true)
    }

    /// Statements stepped since the last ``resetStatements()``.
    fileprivate var stepped: [Statement] = []

    /// Runs `body` in a write transaction (`BEGIN IMMEDIATE`): committed when it returns,
    /// rolled back when it throws.
    package func writeTransaction<T>(_ body: () throws(LockboxError) -> T) throws(LockboxError) -> T {
        try transaction(.immediate, body)
    }

    /// Runs `body` in a read transaction: one consistent snapshot across its statements.
    package func readTransaction<T>(_ body: () throws(LockboxError) -> T) throws(LockboxError) -> T {
        try transaction(.deferred, body)
    }

    private enum Begin {
        case immediate, deferred
    }

    // Prepared once and kept outside the statement cache: every operation runs them.
    private var beginImmediate: Statement?
    private var beginDeferred: Statement?
    private var commitStatement: Statement?

    private func kept(_ slot: inout Statement?, _ sql: String) throws(LockboxError) -> Statement {
        if let statement = slot { return statement }
        let statement = try statement(sql)
        slot = statement
        return statement
    }

    /// Counts the transactions begun on this connection; with ``isInTransaction``, says whether
    /// something learned from the file belongs to the snapshot of the transaction running now.
    package private(set) var transactionSerial = 0

    /// True while a transaction of ``readTransaction(_:)`` or ``writeTransaction(_:)`` runs.
    package private(set) var isInTransaction = false

    /// True while a transaction of ``writeTransaction(_:)`` runs: its snapshot began with
    /// `BEGIN IMMEDIATE` and is the latest (``pagerDataVersion`` already says whether another
    /// connection committed), where a deferred one begins at its first read.
    package private(set) var isInWriteTransaction = false

    private func transaction<T>(_ begin: Begin, _ body: () throws(LockboxError) -> T) throws(LockboxError) -> T {
        // Prepared once and kept: compiling BEGIN and COMMIT again costs more than a small read.
        let start =
            switch begin {
            case .immediate: try kept(&beginImmediate, "BEGIN IMMEDIATE")
            case .deferred: try kept(&beginDeferred, "BEGIN DEFERRED")
            }
        try start.run()
        start.reset()
        transactionSerial &+= 1
        isInTransaction = true
        isInWriteTransaction = begin == .immediate
        defer {
            isInTransaction = false
            isInWriteTransaction = false
        }
        do {
            let value = try body()
            let commit = try kept(&commitStatement, "COMMIT")
            try commit.run()
            commit.reset()
            return value
        } catch {
            let result = sqlite3_exec(handle, "ROLLBACK", nil, nil, nil)
            // SQLite may have rolled back already (after SQLITE_FULL, SQLITE_IOERR ...): then
            // ROLLBACK fails harmlessly. A transaction still open is not harmless.
            if result != SQLITE_OK && sqlite3_get_autocommit(handle) == 0 {
                throw Database.error(
                    code: result, message: String(cString: sqlite3_errmsg(handle)), path: path, operation: "ROLLBACK")
            }
            throw error
        }
    }

    /// SQLite's count of changes to the file as this connection has seen them
    /// (`SQLITE_FCNTL_DATA_VERSION`): it moves at this connection's own commits, and when a
    /// read transaction starts after another connection committed. Read while a statement
    /// holds its read snapshot, it says whether that snapshot is the one a value noted earlier
    /// described, without a statement of its own. Unlike `PRAGMA data_version`, it also moves
    /// at this connection's commits (and at another's checkpoint): a changed value proves
    /// nothing was missed, never the reverse.
    package var pagerDataVersion: UInt32 {
        var version: UInt32 = 0
        let result = sqlite3_file_control(handle, "main", SQLITE_FCNTL_DATA_VERSION, &version)
        // Only an unknown database name fails; "main" always exists.
        precondition(result == SQLITE_OK, "SQLITE_FCNTL_DATA_VERSION failed with \(result)")
        return version
    }

    /// `PRAGMA user_version`: the vault's schema version.
    package var userVersion: Int {
        get throws(LockboxError) {
            let statement = try statement("PRAGMA user_version")
            defer { statement.reset() }
            guard try statement.step() else { return 0 }
            return statement.integer(0) ?? 0
        }
    }

    /// `PRAGMA integrity_check` result ("ok" when healthy).
    package func integrityCheck() throws(LockboxError) -> String {
        let statement = try statement("PRAGMA integrity_check")
        var lines: [String] = []
        while try statement.step() { lines.append(statement.text(0) ?? "") }
        return lines.joined(separator: "\n")
    }

    /// Makes SQLite refuse any string or blob longer than `bytes` (its `SQLITE_LIMIT_LENGTH`),
    /// at bind time.
    package func limitValueLength(to bytes: Int32) {
        sqlite3_limit(handle, SQLITE_LIMIT_LENGTH, bytes)
    }

    /// Rows changed by the last statement.
    package var changes: Int { Int(sqlite3_changes(handle)) }
    /// Rows this connection has inserted, updated or deleted since it opened (with
    /// `PRAGMA data_version` for other connections' writes: together, whether anything changed).
    package var totalChanges: Int { Int(sqlite3_total_changes64(handle)) }

    /// Leaves the write-ahead log in place when this connection closes, instead of
    /// checkpointing it (with its syncs) then: for a small file opened and closed at every use
    /// whose log is synced at checkpoints only. Its pages reach the file at the next automatic
    /// checkpoint; until then every connection reads them from the log.
    package func keepWriteAheadLogOnClose() throws(LockboxError) {
        let result = lockbox_sqlite3_keep_wal_on_close(handle)
        guard result == SQLITE_OK else { throw lastError(result, operation: "sqlite3_db_config") }
    }

    /// Moves the WAL's content into the file and truncates the WAL, so that pages holding
    /// deleted or replaced values do not linger there. Best effort, and outside the injected
    /// faults: a reader holding an old snapshot past the busy timeout leaves the WAL as it is
    /// until the next checkpoint, and the operation has already committed.
    package func truncateWriteAheadLog() {
        _ = sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_TRUNCATE, nil, nil)
    }

    /// Moves the whole write-ahead log into the file and empties the log, or throws: for a file
    /// about to be closed and renamed, which must not leave part of itself behind in its log.
    package func moveWriteAheadLogIntoFile() throws(LockboxError) {
        var frames: Int32 = -1
        var moved: Int32 = -1
        let result = sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_TRUNCATE, &frames, &moved)
        guard result == SQLITE_OK else { throw lastError(result, operation: "sqlite3_wal_checkpoint_v2") }
        guard frames == moved else {
            throw LockboxError(.io, "The write-ahead log of \(path) could not be moved into it (another connection is reading it). Try again.")
        }
    }

    /// Turns off (or back on, at SQLite's 1,000 pages) the checkpoint a commit runs when the
    /// write-ahead log has grown past its limit; ``checkpointWriteAheadLog()`` then moves it.
    package func setAutomaticCheckpoint(_ isOn: Bool) {
        sqlite3_wal_autocheckpoint(handle, isOn ? 1000 : 0)
    }

    /// Moves the write-ahead log's content into the file without waiting for readers (a
    /// passive checkpoint). Best effort, as ``truncateWriteAheadLog()``: what a reader still
    /// needs stays for the next checkpoint.
    package func checkpointWriteAheadLog() {
        _ = sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
    }

    /// The name of the VFS this connection goes through ("unix", or the one
    /// `gatheringLogWrites` chose).
    package var vfsName: String? {
        var pointer: UnsafeMutableRawPointer?
        guard sqlite3_file_control(handle, "main", SQLITE_FCNTL_VFS_POINTER, &pointer) == SQLITE_OK, let pointer else { return nil }
        return String(cString: pointer.assumingMemoryBound(to: sqlite3_vfs.self).pointee.zName)
    }

    /// The device and inode of the file SQLite opened, read from its own descriptor, so the
    /// caller can confirm it is the file that was checked. Nil when the VFS is not SQLite's
    /// default `unix` one.
    package var openedFileIdentity: (device: UInt64, inode: UInt64)? {
        guard let vfs = sqlite3_vfs_find(nil), String(cString: vfs.pointee.zName) == "unix" else { return nil }
        var pointer: UnsafeMutableRawPointer?
        guard sqlite3_file_control(handle, "main", SQLITE_FCNTL_FILE_POINTER, &pointer) == SQLITE_OK, let file = pointer else {
            return nil
        }
        // The unix VFS's file object starts with three pointers (methods, VFS, inode record),
        // then the descriptor.
        let descriptor = file.load(fromByteOffset: 3 * MemoryLayout<UnsafeRawPointer>.stride, as: Int32.self)
        var info = stat()
        guard descriptor >= 0, fstat(descriptor, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { return nil }
        return (UInt64(info.st_dev), UInt64(info.st_ino))
    }

    fileprivate func lastError(_ code: Int32, operation: String) -> LockboxError {
        Database.error(
            code: code, message: String(cString: sqlite3_errmsg(handle)), path: path, operation: operation,
            systemError: sqlite3_system_errno(handle))
    }

    /// Maps SQLite's result codes to Lockbox's, keeping the extended result code as the
    /// error's cause. The message never includes bound values (SQLite's own messages name
    /// tables, columns and constraints, never values).
    /// - Parameter systemError: the `errno` of SQLite's last failed system call on the
    ///   connection (`sqlite3_system_errno`), when known: a file that cannot be opened because
    ///   the process has too many open is said to be so, not to have wrong permissions.
    package static func error(code: Int32, message: String, path: String, operation: String, systemError: Int32 = 0) -> LockboxError {
        let error = mappedError(code: code, message: message, path: path, systemError: systemError)
        return LockboxError(error.code, error.message, cause: .sqlite(operation, extendedCode: code))
    }

    /// Whether `error` is SQLite finding a file damaged: not a database, corrupt, or short of
    /// the tables its schema has (one dropped outside Lockbox).
    package static func isDamage(_ error: LockboxError) -> Bool {
        guard let code = error.sqliteExtendedCode else { return false }
        return [SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_ERROR].contains(code & 0xff)
    }

    private static func mappedError(code: Int32, message: String, path: String, systemError: Int32) -> LockboxError {
        // Whatever SQLite made of it: the process (or the system) ran out of file descriptors.
        if code & 0xff == SQLITE_CANTOPEN || code & 0xff == SQLITE_IOERR, systemError == EMFILE || systemError == ENFILE {
            return LockboxError(
                .io,
                "Too many files are open (\(systemError == EMFILE ? "this process's limit, `ulimit -n`" : "the system's limit")) "
                    + "to use \(path). Raise the limit or close other programs, then try again; that file was not changed.")
        }
        // The shared-memory file (-shm) could not grow, which even a read may need: a full disk.
        if code == SQLITE_IOERR | (19 << 8) {
            return LockboxError(
                .io, "The disk holding \(path) is full (its shared-memory file cannot grow). Free space, then try again; that file was not changed.")
        }
        switch code & 0xff {
        case SQLITE_BUSY, SQLITE_LOCKED:
            return LockboxError(
                .io,
                "The keychain at \(path) is busy: another process kept it locked past the timeout. Try again.")
        case SQLITE_FULL:
            return LockboxError(.io, "The disk holding \(path) is full. Free space, then try again; that file was not changed.")
        case SQLITE_IOERR:
            // The extended code says which operation failed (a read, a lock, the shared memory),
            // the system's error why: both are what a report of it needs.
            let reason = systemError != 0 ? ": " + String(cString: strerror(systemError)) : ""
            return LockboxError(
                .io,
                "Reading or writing \(path) failed (I/O error, SQLite code \(code)\(reason)). Check the disk; that file was not changed.")
        case SQLITE_CORRUPT, SQLITE_NOTADB:
            return LockboxError.integrity("The keychain file \(path)")
        case SQLITE_READONLY, SQLITE_PERM, SQLITE_AUTH:
            return LockboxError(.io, "The keychain at \(path) cannot be written: check its permissions.")
        case SQLITE_CONSTRAINT:
            // Duplicates are refused before SQLite sees them (the vault's writer looks the primary
            // key up first, schema 4 has no UNIQUE index of it): a constraint that fires is a
            // fault in Lockbox or a file edited outside it, never "duplicate item".
            return LockboxError(
                .io,
                "A write to the keychain at \(path) broke a rule of its schema (\(message)); nothing was changed. "
                    + "If the file was edited outside Lockbox, restore it from a backup; otherwise report this as a bug.")
        case SQLITE_CANTOPEN:
            return LockboxError(.io, "The keychain at \(path) cannot be opened: check the path and its permissions.")
        default:
            return LockboxError(.io, "Storage error \(code) on \(path): \(message).")
        }
    }
}

/// A prepared statement. Bind with 1-based indexes; read columns with 0-based ones.
package final class Statement {
    private let handle: OpaquePointer
    private unowned let database: Database

    fileprivate init(_ handle: OpaquePointer, database: Database) {
        self.handle = handle
        self.database = database
    }

    deinit {
        sqlite3_finalize(handle)
        if let arena {
            wipe(UnsafeMutableRawBufferPointer(start: arena, count: arenaCapacity))
            free(arena)
        }
    }

    /// Bound values are copied here and read by SQLite in place (SQLITE_STATIC) until the next
    /// reset, instead of each being copied into an allocation of its own (a write binds about
    /// sixteen). A value that does not fit gets its own copy (SQLITE_TRANSIENT), and the arena
    /// is made larger at the next reset.
    private var arena: UnsafeMutableRawPointer?
    private var arenaCapacity = 0
    private var arenaUsed = 0
    private var arenaWanted = 1_024

    private func arenaCopy(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawPointer? {
        if arena == nil, let allocated = malloc(arenaWanted) {
            arena = allocated
            arenaCapacity = arenaWanted
        }
        guard let arena, bytes.count <= arenaCapacity - arenaUsed else {
            arenaWanted = min(max(arenaWanted, arenaUsed + bytes.count) * 2, 1 << 20)
            return nil
        }
        let start = arena + arenaUsed
        if let source = bytes.baseAddress, bytes.count > 0 { start.copyMemory(from: source, byteCount: bytes.count) }
        arenaUsed += (bytes.count + 7) & ~7
        return UnsafeRawPointer(start)
    }

    /// Called once SQLite holds no pointer into the arena (its bindings cleared).
    private func releaseArena() {
        guard let arena else { return }
        // Bound values may be anything a caller stored: they do not linger here.
        wipe(UnsafeMutableRawBufferPointer(start: arena, count: min(arenaUsed, arenaCapacity)))
        arenaUsed = 0
        if arenaWanted > arenaCapacity {
            free(arena)
            self.arena = nil
            arenaCapacity = 0
        }
    }

    /// Stepped since its last reset (so it may hold a read snapshot).
    fileprivate var isStepped = false
    /// Bound since its last reset.
    private var isBound = false

    package func reset() {
        // A statement neither stepped nor bound since its last reset is reset already.
        guard isStepped || isBound else { return }
        // sqlite3_reset returns the last step's error, already thrown by step(); clearing
        // bindings cannot fail.
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        releaseArena()
        bindFailure = nil
        isStepped = false
        isBound = false
    }

    // SQLITE_TRANSIENT: SQLite copies the bound bytes before the call returns.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    /// The first failed bind since the last reset, thrown by the next ``step()``: binding
    /// never fails silently, and callers bind without a `try` per column.
    private var bindFailure: LockboxError?

    /// The funnel for `sqlite3_bind_*`: a wrong index or a misuse is a bug in Lockbox and
    /// crashes; anything else (a value too big, no memory) is kept and thrown at `step()`.
    private func checkBind(_ index: Int32, _ result: Int32) {
        isBound = true
        guard result != SQLITE_OK else { return }
        precondition(
            result != SQLITE_RANGE && result != SQLITE_MISUSE,
            "sqlite3_bind_* parameter \(index) failed with \(result): the statement and its bindings disagree")
        if bindFailure == nil {
            bindFailure = database.lastError(result, operation: "sqlite3_bind")
        }
    }

    package func bind(_ index: Int32, _ value: [UInt8]?) {
        guard let value else {
            checkBind(index, sqlite3_bind_null(handle, index))
            return
        }
        value.withUnsafeBytes { bind(index, bytes: $0) }
    }

    /// Binds a blob copied from `bytes` (the caller's buffer is not used after this returns).
    package func bind(_ index: Int32, bytes: UnsafeRawBufferPointer) {
        let result: Int32
        if let copy = arenaCopy(bytes) {
            // The arena's pointer is never null, so an empty blob stays a blob.
            result = sqlite3_bind_blob64(handle, index, copy, sqlite3_uint64(bytes.count), nil)
        } else {
            // A zero-length blob still needs a non-null pointer to stay a blob.
            var empty: UInt8 = 0
            result = withUnsafeMutablePointer(to: &empty) { emptyPointer in
                sqlite3_bind_blob64(
                    handle, index, bytes.baseAddress ?? UnsafeRawPointer(emptyPointer), sqlite3_uint64(bytes.count), Statement.transient)
            }
        }
        checkBind(index, result)
    }

    package func bind(_ index: Int32, _ value: String?) {
        guard let value else {
            checkBind(index, sqlite3_bind_null(handle, index))
            return
        }
        var text = value
        let result = text.withUTF8 { utf8 -> Int32 in
            // Up to the first NUL, as SQLite reads a C string.
            let length = utf8.firstIndex(of: 0) ?? utf8.count
            let bytes = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(utf8)[0..<length])
            if let copy = arenaCopy(bytes) {
                return sqlite3_bind_text64(
                    handle, index, copy.assumingMemoryBound(to: CChar.self), sqlite3_uint64(length), nil, UInt8(SQLITE_UTF8))
            }
            return sqlite3_bind_text(handle, index, value, -1, Statement.transient)
        }
        checkBind(index, result)
    }

    package func bind(_ index: Int32, _ value: Int?) {
        guard let value else {
            checkBind(index, sqlite3_bind_null(handle, index))
            return
        }
        checkBind(index, sqlite3_bind_int64(handle, index, Int64(value)))
    }

    package func bind(_ index: Int32, _ value: Double?) {
        guard let value else {
            checkBind(index, sqlite3_bind_null(handle, index))
            return
        }
        checkBind(index, sqlite3_bind_double(handle, index, value))
    }

    /// Advances to the next row. Returns false when done.
    @discardableResult
    package func step() throws(LockboxError) -> Bool {
        if let bindFailure { throw bindFailure }
        if let faults = database.faults { try faults.check(sqlite3_sql(handle).map { String(cString: $0) }) }
        if !isStepped {
            isStepped = true
            database.stepped.append(self)
        }
        let result = sqlite3_step(handle)
        switch result {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            let error = database.lastError(result, operation: "sqlite3_step")
            sqlite3_reset(handle)
            throw error
        }
    }

    /// Runs to completion (for INSERT/UPDATE/DELETE).
    package func run() throws(LockboxError) {
        while try step() {}
    }

    /// The storage class of a column of the current row, as stored. Ask it before any other
    /// accessor of the column: those may convert the value (a number read as text or bytes).
    package func storageClass(_ column: Int32) -> StorageClass {
        switch sqlite3_column_type(handle, column) {
        case SQLITE_INTEGER: .integer
        case SQLITE_FLOAT: .real
        case SQLITE_TEXT: .text
        case SQLITE_BLOB: .blob
        default: .null
        }
    }

    package func blob(_ column: Int32) -> [UInt8]? {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL else { return nil }
        let count = Int(sqlite3_column_bytes(handle, column))
        guard count > 0, let start = sqlite3_column_blob(handle, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: start, count: count))
    }

    /// ``borrowedBlob(_:)`` of a column the schema declares NOT NULL, one call fewer: a NULL
    /// (a file whose schema was rebuilt outside Lockbox) reads as no bytes.
    package func borrowedBlob(notNull column: Int32) -> UnsafeRawBufferPointer {
        let start = sqlite3_column_blob(handle, column)
        let count = Int(sqlite3_column_bytes(handle, column))
        return UnsafeRawBufferPointer(start: count > 0 ? start : nil, count: count)
    }

    package func text(_ column: Int32) -> String? {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL, let start = sqlite3_column_text(handle, column) else {
            return nil
        }
        return String(cString: start)
    }

    /// The bytes ``blob(_:)`` copies, read in place: valid until the next step or reset of this
    /// statement. Nil for NULL.
    package func borrowedBlob(_ column: Int32) -> UnsafeRawBufferPointer? {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL else { return nil }
        guard let start = sqlite3_column_blob(handle, column) else { return UnsafeRawBufferPointer(start: nil, count: 0) }
        return UnsafeRawBufferPointer(start: start, count: Int(sqlite3_column_bytes(handle, column)))
    }

    /// The UTF-8 bytes ``text(_:)`` decodes (up to the first NUL, not yet checked or repaired),
    /// read in place: valid until the next step or reset of this statement. Nil for NULL.
    package func borrowedText(_ column: Int32) -> UnsafeRawBufferPointer? {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL, let start = sqlite3_column_text(handle, column) else {
            return nil
        }
        return UnsafeRawBufferPointer(start: start, count: strlen(UnsafeRawPointer(start).assumingMemoryBound(to: CChar.self)))
    }

    package func integer(_ column: Int32) -> Int? {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL else { return nil }
        return Int(sqlite3_column_int64(handle, column))
    }

    package func double(_ column: Int32) -> Double? {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL else { return nil }
        return sqlite3_column_double(handle, column)
    }
}

/// SQLite's storage classes: what a value is stored as, which SQL comparisons depend on (a text
/// and a blob of the same bytes are not equal).
package enum StorageClass: Sendable {
    case integer, real, text, blob, null
}
