internal import CLibPQ
import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// One libpq connection (the only CLibPQ importer). Parameters go separately from the SQL text
/// (`PQsendQueryParams`): text as text, bytes as `bytea` in the binary format. The connection string
/// may name a password file (`passfile=`); libpq's messages never carry the password.
package final class PostgresConnection {
    private let connection: OpaquePointer
    /// How long a statement waits for the server's reply (``defaultReplyTimeout``).
    private var replyTimeout: Duration
    /// Set once the server stopped answering: the connection is not used again.
    private var isClosed = false

    /// A parameter or a column: text, or nil for SQL NULL.
    package enum Value {
        case text(String)
        case bytes([UInt8])
        case integer(Int64)
        /// A one-dimensional array (``texts(_:)``, ``integers(_:)``, ``byteStrings(_:)``), sent in
        /// the binary format.
        case array(Array)
        case null

        /// A `text[]` parameter.
        static func texts(_ values: [String]) -> Value { .array(Array(elementType: 25, arrayType: 1009, values.map { Swift.Array($0.utf8) })) }
        /// A `bigint[]` parameter.
        static func integers(_ values: [Int64]) -> Value {
            .array(Array(elementType: 20, arrayType: 1016, values.map { value in (0..<8).reversed().map { UInt8(truncatingIfNeeded: value >> ($0 * 8)) } }))
        }
        /// A `bytea[]` parameter.
        static func byteStrings(_ values: [[UInt8]]) -> Value { .array(Array(elementType: byteaType, arrayType: 1001, values)) }

        /// An array's elements in PostgreSQL's binary array format (no nulls).
        package struct Array {
            let elementType: UInt32
            let arrayType: UInt32
            let elements: [[UInt8]]

            init(elementType: UInt32, arrayType: UInt32, _ elements: [[UInt8]]) {
                self.elementType = elementType
                self.arrayType = arrayType
                self.elements = elements
            }

            /// Dimensions, a flag for nulls, the element type, the one dimension's length and
            /// lower bound, then each element's length and bytes; integers big endian.
            var encoded: [UInt8] {
                var bytes: [UInt8] = []
                bytes.reserveCapacity(20 + elements.reduce(0) { $0 + 4 + $1.count })
                func append(_ value: UInt32) { for shift in [24, 16, 8, 0] { bytes.append(UInt8(truncatingIfNeeded: value >> UInt32(shift))) } }
                append(1)
                append(0)
                append(elementType)
                append(UInt32(elements.count))
                append(1)
                for element in elements {
                    append(UInt32(element.count))
                    bytes += element
                }
                return bytes
            }
        }
    }

    /// The type of a `bytea` parameter (`pg_type.oid`, fixed in PostgreSQL's catalog).
    static let byteaType: UInt32 = 17

    /// Seconds a connection attempt may take when neither the connection string
    /// (`connect_timeout=`) nor `PGCONNECT_TIMEOUT` says: libpq's own default is to wait
    /// forever, so a server that accepts the connection and never answers would hang a sync or
    /// a status.
    package static let defaultConnectTimeout = 10

    package init(_ conninfo: String, replyTimeout: Duration = defaultReplyTimeout) throws(LockboxError) {
        self.replyTimeout = replyTimeout
        // Keywords before the expanded connection string are defaults it can override.
        var keywords = ["dbname"]
        var values = [conninfo]
        // Not when a timeout is given another way, or may be (a service file's entry: libpq
        // reads it only for what the keywords leave unset).
        let given = Self.options(of: conninfo) ?? [:]
        let timeoutGiven = Self.environmentValue("PGCONNECT_TIMEOUT") != nil || Self.environmentValue("PGSERVICE") != nil
            || !(given["connect_timeout"] ?? "").isEmpty || !(given["service"] ?? "").isEmpty
        if !timeoutGiven {
            keywords.insert("connect_timeout", at: 0)
            values.insert(String(Self.defaultConnectTimeout), at: 0)
        }
        for (keyword, value) in Self.transportDefaults(given, environment: Self.environmentValue) {
            keywords.insert(keyword, at: 0)
            values.insert(value, at: 0)
        }
        let keywordPointers = keywords.map { strdup($0) }
        let valuePointers = values.map { strdup($0) }
        defer {
            keywordPointers.forEach { free($0) }
            valuePointers.forEach { free($0) }
        }
        let connection = (keywordPointers.map { UnsafePointer($0) } + [nil]).withUnsafeBufferPointer { keywordBuffer in
            (valuePointers.map { UnsafePointer($0) } + [nil]).withUnsafeBufferPointer { valueBuffer in
                PQconnectdbParams(keywordBuffer.baseAddress, valueBuffer.baseAddress, 1)
            }
        }
        guard let connection else {
            throw LockboxError(.allocate, "Cannot allocate a PostgreSQL connection.")
        }
        // The server's notices and warnings are never printed: libpq's default printed each to
        // standard error as it came, so a hostile server (a trigger raising a warning, say)
        // could send terminal sequences, or text dressed as Lockbox's own advice. What a sync
        // needs from the server comes in its errors, which are shown with control characters
        // replaced (``printable(_:)``).
        PQsetNoticeProcessor(connection, { _, _ in }, nil)
        // Checked before `self.connection` is set: once it is, a throw runs `deinit`, which
        // finishes the connection.
        guard PQstatus(connection) == CONNECTION_OK else {
            let reason = Self.message(connection)
            PQfinish(connection)
            if reason.contains("certificate verify failed") || reason.contains("does not match host name") {
                throw LockboxError(
                    .notAvailable,
                    "The sync database's TLS certificate was not accepted (\(reason)). The certificate must be signed by the CA "
                        + "the connection string names (sslrootcert=FILE; else ~/.postgresql/root.crt or the system's CAs) and name "
                        + "the host connected to. The local keychain is unaffected.")
            }
            if reason.contains("root certificate file") || reason.contains("host name must be specified") {
                throw LockboxError(
                    .notAvailable,
                    "The sync database's server cannot be verified (\(reason)). A server elsewhere is reached with TLS verified "
                        + "unless the connection string says otherwise: give its host name (host=NAME, as its certificate names it) "
                        + "and its CA (sslrootcert=FILE, or install ca-certificates), or choose sslmode=... explicitly. "
                        + "The local keychain is unaffected.")
            }
            throw LockboxError(
                .notAvailable,
                "Cannot reach the sync database (\(reason)). The local keychain is unaffected; check the connection string and that the server runs, then sync again.")
        }
        self.connection = connection
        // The server's notices (such as "already exists, skipping") are not for the user. A lock
        // another session holds (a stuck transaction, a hostile administrator) ends a wait after
        // `lockTimeout` instead of never, unless the connection's options set a timeout of their own.
        // A transaction this process leaves idle that long (a sync stopped with Ctrl-Z, a
        // debugger) is ended by the server, with the locks it held, so that it does not stop
        // every other device's sync (unless the options set a timeout of their own).
        try execute(
            """
            SELECT set_config('client_min_messages', 'warning', false),
                set_config('lock_timeout', CASE current_setting('lock_timeout') WHEN '0' THEN $1 ELSE current_setting('lock_timeout') END, false),
                set_config('idle_in_transaction_session_timeout',
                    CASE current_setting('idle_in_transaction_session_timeout') WHEN '0' THEN $1 ELSE current_setting('idle_in_transaction_session_timeout') END, false)
            """, [.text(Self.lockTimeout)])
    }

    /// What a connection to another machine uses when neither its string nor the environment
    /// (`PGSSLMODE`, `PGSSLROOTCERT`, a service file) says: TLS with the server's certificate
    /// and name verified (`sslmode=verify-full`), where libpq's own default (`prefer`) tries
    /// TLS without verifying anything and falls back to no encryption without a word. A server
    /// on this machine (a Unix socket, `localhost`, a loopback address) keeps libpq's default.
    /// Verification trusts `~/.postgresql/root.crt` when there is one (libpq's rule), else the
    /// system's certificate authorities. An explicit `sslmode` is the user's choice, and
    /// ``transport`` says what it gave.
    static func transportDefaults(_ given: [String: String], environment: (String) -> String?) -> [(String, String)] {
        if !(given["service"] ?? "").isEmpty || environment("PGSERVICE") != nil { return [] }
        var defaults: [(String, String)] = []
        var mode = given["sslmode"].flatMap { $0.isEmpty ? nil : $0 } ?? environment("PGSSLMODE")
        if mode == nil && !isLocal(given, environment: environment) {
            defaults.append(("sslmode", "verify-full"))
            mode = "verify-full"
        }
        let rootGiven = !(given["sslrootcert"] ?? "").isEmpty || environment("PGSSLROOTCERT") != nil
        if mode == "verify-full" || mode == "verify-ca", !rootGiven, !hasOwnRootCertificate(),
            access(systemCertificates, R_OK) == 0
        {
            defaults.append(("sslrootcert", systemCertificates))
        }
        return defaults
    }

    /// A variable of the process's environment, nil when unset or empty.
    static func environmentValue(_ name: String) -> String? {
        guard let value = getenv(name), value.pointee != 0 else { return nil }
        return String(cString: value)
    }

    /// Debian's bundle of the system's certificate authorities (`ca-certificates`).
    static let systemCertificates = "/etc/ssl/certs/ca-certificates.crt"

    /// Whether every host the connection may use is on this machine: a Unix socket (none named,
    /// or a directory), `localhost`, or a loopback address, both as named (`host`, what the
    /// certificate is checked against) and as reached (`hostaddr`, when given).
    static func isLocal(_ given: [String: String], environment: (String) -> String?) -> Bool {
        func value(_ keyword: String, _ variable: String) -> String {
            if let value = given[keyword], !value.isEmpty { return value }
            return environment(variable) ?? ""
        }
        let names = value("host", "PGHOST").split(separator: ",", omittingEmptySubsequences: false)
            + value("hostaddr", "PGHOSTADDR").split(separator: ",", omittingEmptySubsequences: true)
        return names.allSatisfy { name in
            let host = name.trimmingCharacters(in: .whitespaces)
            if host.isEmpty || host.hasPrefix("/") || host.hasPrefix("@") || host.lowercased() == "localhost" { return true }
            var v4 = in_addr()
            if inet_pton(AF_INET, host, &v4) == 1 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
            var v6 = in6_addr()
            if inet_pton(AF_INET6, host, &v6) == 1 {
                return withUnsafeBytes(of: &v6) { bytes in bytes.prefix(15).allSatisfy { $0 == 0 } && bytes[15] == 1 }
            }
            return false
        }
    }

    /// Whether libpq would find a root certificate of the user's own (`~/.postgresql/root.crt`).
    private static func hasOwnRootCertificate() -> Bool {
        var homes: [String] = []
        if let home = getenv("HOME") { homes.append(String(cString: home)) }
        if let entry = getpwuid(getuid()), let home = entry.pointee.pw_dir { homes.append(String(cString: home)) }
        return homes.contains { access($0 + "/.postgresql/root.crt", F_OK) == 0 }
    }

    /// How this connection travels, for `lockbox sync status`: TLS and what of the server was
    /// verified, or that it is not encrypted.
    package var transport: String {
        guard PQsslInUse(connection) == 1 else { return "not encrypted" }
        let name = PQsslAttribute(connection, "protocol").map { String(cString: $0) } ?? "TLS"
        let mode = PQconninfo(connection).flatMap { Self.values(of: $0)["sslmode"] } ?? "prefer"
        switch mode {
        case "verify-full": return "\(name), the server's certificate and name verified"
        case "verify-ca": return "\(name), the server's certificate verified, not its name (sslmode=verify-ca)"
        default: return "\(name), the server not verified (sslmode=\(mode))"
        }
    }

    /// How long a statement may wait for a lock when the connection's options do not say
    /// (`options='-c lock_timeout=...'`, `PGOPTIONS`): longer than any honest holder keeps one (a
    /// push of a batch, a device removal re-sealing every record, a fleet machine's refresh
    /// with its HTTP timeouts), so that a lock never held up by one is a clear error instead of
    /// a wait without end.
    package static let lockTimeout = "2min"

    deinit { PQfinish(connection) }

    /// Whether a connection string or URI names a password, as libpq reads it (`password=`,
    /// or one in a URI's user information, or `sslpassword=`, the passphrase of the client's
    /// TLS key); nil when libpq cannot read it at all. A password belongs in a password file
    /// (`passfile=`, `PGPASSFILE`), and a key's passphrase with the key (an unencrypted key file
    /// of mode 0600), never on a command line or in a configuration file.
    package static func namesPassword(_ conninfo: String) -> Bool? {
        guard let options = options(of: conninfo) else { return nil }
        return !(options["password"] ?? "").isEmpty || !(options["sslpassword"] ?? "").isEmpty
    }

    /// The options a connection string or URI sets, as libpq reads it (no defaults, no
    /// environment); nil when libpq cannot read it.
    static func options(of conninfo: String) -> [String: String]? {
        var error: UnsafeMutablePointer<CChar>?
        guard let parsed = PQconninfoParse(conninfo, &error) else {
            if let error { PQfreemem(error) }
            return nil
        }
        return values(of: parsed)
    }

    /// The options libpq set in one of its option arrays, which this frees.
    private static func values(of options: UnsafeMutablePointer<PQconninfoOption>) -> [String: String] {
        defer { PQconninfoFree(options) }
        var values: [String: String] = [:]
        var option = options
        while let keyword = option.pointee.keyword {
            if let value = option.pointee.val { values[String(cString: keyword)] = String(cString: value) }
            option += 1
        }
        return values
    }

    private static func message(_ connection: OpaquePointer) -> String {
        guard let text = PQerrorMessage(connection) else { return "no message" }
        return printable(String(cString: text).split(whereSeparator: { $0.isNewline }).first.map(String.init) ?? "no message")
    }

    /// A message the server wrote, as it may be shown on a terminal and in logs: control
    /// characters (terminal escape sequences a hostile server could send) replaced.
    /// The start of every error of a statement the role has no privilege for.
    static let insufficientPrivilegeMessage = "The sync database's role lacks a privilege this needs"

    /// A statement refused for a privilege the connection's role lacks (SQLSTATE 42501).
    static func insufficientPrivilege(_ reason: String) -> LockboxError {
        LockboxError(
            .io,
            "\(insufficientPrivilegeMessage) (\(reason)); nothing was changed here, and trying again will not help. Have the "
                + "database's owner grant this role use of the Lockbox sync tables and their schema (USAGE on the schema; SELECT, "
                + "INSERT, UPDATE and DELETE on the lockbox_sync_* tables), or use a role that has them (docs/SYNC.md, \"Tables\").")
    }

    package static func printable(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.map { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) ? "?" : $0 }))
    }

    /// How long a statement may wait for the server's reply: longer than any lock wait the
    /// server allows (``lockTimeout``), so that only a server that stopped answering (or a
    /// connection cut somewhere on the way without a word) reaches it.
    package static let defaultReplyTimeout: Duration = .seconds(150)

    /// The error for a connection gone in the middle of a statement.
    private func lost(_ reason: String) -> LockboxError {
        LockboxError(
            .notAvailable,
            "The connection to the sync database was lost (\(reason)). The local keychain is unaffected; sync again when the database is reachable.")
    }

    /// Waits for the result of a statement just sent (`sent`: what `PQsendQueryParams`
    /// returned), never longer than `replyTimeout` without a byte from the server. The last
    /// result is kept, as `PQexec` keeps it. After a timeout the connection is closed: the
    /// server's reply, if it ever comes, has nowhere to go.
    private func awaitResult(_ sent: Int32) throws(LockboxError) -> OpaquePointer {
        guard !isClosed else { throw lost("closed after an earlier failure") }
        guard sent == 1 else { throw lost(Self.message(connection)) }
        let socket = PQsocket(connection)
        func wait(for events: Int16) throws(LockboxError) {
            var descriptor = pollfd(fd: socket, events: events, revents: 0)
            let milliseconds = Int32(replyTimeout.components.seconds * 1000 + replyTimeout.components.attoseconds / 1_000_000_000_000_000)
            while true {
                let ready = poll(&descriptor, 1, milliseconds)
                if ready > 0 { return }
                if ready < 0 && errno == EINTR { continue }
                isClosed = true
                throw LockboxError(
                    .notAvailable,
                    "The sync database stopped answering (no reply for \(replyTimeout.components.seconds) s). The local keychain is unaffected; sync again later.")
            }
        }
        // What the statement's parameters did not fit in the socket's buffer at once.
        while true {
            let flushed = PQflush(connection)
            if flushed == 0 { break }
            guard flushed > 0 else { throw lost(Self.message(connection)) }
            try wait(for: Int16(POLLIN | POLLOUT))
            guard PQconsumeInput(connection) == 1 else { throw lost(Self.message(connection)) }
        }
        var last: OpaquePointer?
        while true {
            while PQisBusy(connection) == 1 {
                try wait(for: Int16(POLLIN))
                guard PQconsumeInput(connection) == 1 else {
                    if let last { PQclear(last) }
                    throw lost(Self.message(connection))
                }
            }
            guard let result = PQgetResult(connection) else { break }
            if let last { PQclear(last) }
            last = result
        }
        guard let last else { throw lost(Self.message(connection)) }
        return last
    }

    /// Runs one statement; the rows of its result, each column as text (nil for NULL).
    @discardableResult
    /// ``execute(_:_:)``, waiting for the server's reply no longer than `limit` (a statement
    /// that may be given up on).
    package func execute(_ sql: String, _ parameters: [Value] = [], within limit: Duration) throws(LockboxError) -> [[String?]] {
        let usual = replyTimeout
        replyTimeout = limit
        defer { replyTimeout = usual }
        return try execute(sql, parameters)
    }

    @discardableResult
    package func execute(_ sql: String, _ parameters: [Value] = []) throws(LockboxError) -> [[String?]] {
        try run(sql, parameters, binary: false) { result, row, column in
            String(cString: PQgetvalue(result, row, column))
        }
    }

    /// Runs one statement and returns its rows in PostgreSQL's binary format, each column as
    /// its bytes (nil for NULL): `bytea` as stored, `text` as UTF-8, `bigint` as 8 bytes, big
    /// endian (``integer(binary:)``). A pull reads its records this way: no hex to decode, no
    /// intermediate strings.
    package func executeBinary(_ sql: String, _ parameters: [Value] = []) throws(LockboxError) -> [[[UInt8]?]] {
        try run(sql, parameters, binary: true) { result, row, column in
            let count = Int(PQgetlength(result, row, column))
            guard count > 0, let value = PQgetvalue(result, row, column) else { return [] }
            return [UInt8](UnsafeRawBufferPointer(start: value, count: count))
        }
    }

    private func run<Column>(
        _ sql: String, _ parameters: [Value], binary: Bool, column: (OpaquePointer, Int32, Int32) -> Column
    ) throws(LockboxError) -> [[Column?]] {
        // Text parameters as text; bytes as `bytea` in the binary format (no hex to make here
        // or to decode on the server: a push sends megabytes of records).
        var values: [UnsafeMutablePointer<CChar>?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        var types: [UInt32] = []
        values.reserveCapacity(parameters.count)
        defer { values.forEach { free($0) } }
        func appendBinary(_ bytes: [UInt8], type: UInt32) throws(LockboxError) {
            guard bytes.count <= Int32.max else {
                throw LockboxError(.param, "A value for the sync database is larger than PostgreSQL takes (1 GB). Nothing was sent.")
            }
            let copy = malloc(max(bytes.count, 1))!.assumingMemoryBound(to: CChar.self)
            bytes.withUnsafeBytes { source in
                if let base = source.baseAddress { memcpy(copy, base, bytes.count) }
            }
            values.append(copy)
            lengths.append(Int32(bytes.count))
            formats.append(1)
            types.append(type)
        }
        func appendText(_ text: String?) {
            values.append(text.flatMap { strdup($0) })
            lengths.append(0)
            formats.append(0)
            types.append(0)
        }
        for parameter in parameters {
            switch parameter {
            case .bytes(let bytes): try appendBinary(bytes, type: Self.byteaType)
            case .array(let array): try appendBinary(array.encoded, type: array.arrayType)
            case .text(let text): appendText(text)
            case .integer(let value): appendText(String(value))
            case .null: appendText(nil)
            }
        }
        let pointers = values.map { $0.map { UnsafePointer<CChar>($0) } }
        let result = try awaitResult(
            pointers.withUnsafeBufferPointer { buffer in
                PQsendQueryParams(
                    connection, sql, Int32(buffer.count), types, buffer.baseAddress, lengths, formats, binary ? 1 : 0)
            })
        defer { PQclear(result) }
        let status = PQresultStatus(result)
        guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else {
            let text = PQresultErrorMessage(result).map { String(cString: $0) } ?? ""
            let reason = Self.printable(text.split(whereSeparator: { $0.isNewline }).first.map(String.init) ?? "no message")
            if PQstatus(connection) == CONNECTION_BAD { throw lost(reason) }
            // lock_not_available: another session held what this one waited for.
            if PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map({ String(cString: $0) }) == "55P03" {
                throw LockboxError(
                    .io,
                    "Another device (or process) kept the sync group locked for longer than this connection waits (2 minutes, unless "
                        + "the connection string sets lock_timeout): a sync, join or device removal, or a fleet machine's token refresh, "
                        + "in progress or stopped midway (the database ends a stopped sync after 2 minutes idle). Nothing was changed "
                        + "here; try again later. If this keeps happening, look for a stopped sync on the other devices.")
            }
            // insufficient_privilege: waiting does not mend it.
            if PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map({ String(cString: $0) }) == "42501" {
                throw Self.insufficientPrivilege(reason)
            }
            throw LockboxError(.io, "The sync database refused a statement (\(reason)). Sync again later.")
        }
        var rows: [[Column?]] = []
        let rowCount = PQntuples(result)
        let columnCount = PQnfields(result)
        rows.reserveCapacity(Int(rowCount))
        for row in 0..<rowCount {
            var columns: [Column?] = []
            columns.reserveCapacity(Int(columnCount))
            for index in 0..<columnCount {
                columns.append(PQgetisnull(result, row, index) == 1 ? nil : column(result, row, index))
            }
            rows.append(columns)
        }
        return rows
    }

    /// Runs `COPY (...) TO STDOUT` and reads every row, as a plain dump would: the floor a
    /// sync's pull is measured against. Returns the rows' and the bytes' counts.
    package func copyOut(_ sql: String) throws(LockboxError) -> (rows: Int, bytes: Int) {
        guard let result = PQexec(connection, sql) else {
            throw LockboxError(.io, "The sync database did not answer (\(Self.message(connection))).")
        }
        let status = PQresultStatus(result)
        PQclear(result)
        guard status == PGRES_COPY_OUT else { throw LockboxError(.io, "COPY did not start (\(Self.message(connection))).") }
        var rows = 0
        var bytes = 0
        while true {
            var buffer: UnsafeMutablePointer<CChar>?
            let count = PQgetCopyData(connection, &buffer, 0)
            if count > 0 {
                rows += 1
                bytes += Int(count)
                PQfreemem(buffer)
                continue
            }
            if count == -2 { throw LockboxError(.io, "COPY failed (\(Self.message(connection))).") }
            break
        }
        while let finished = PQgetResult(connection) { PQclear(finished) }
        return (rows, bytes)
    }

    /// Runs `body` in a transaction: committed when it returns, rolled back when it throws.
    func transaction<T>(_ body: () throws(LockboxError) -> T) throws(LockboxError) -> T {
        try execute("BEGIN")
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            _ = try? execute("ROLLBACK")
            throw error
        }
    }

    /// A `bytea` column in hex form (`\x...`) as bytes.
    package static func bytes(_ text: String?) throws(LockboxError) -> [UInt8] {
        guard let text, text.hasPrefix("\\x") else { throw LockboxError.syncDatabase("A value the sync database gave") }
        let digits = Array(text.utf8.dropFirst(2))
        guard digits.count % 2 == 0 else { throw LockboxError.syncDatabase("A value the sync database gave") }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = hexValue(digits[index]), let low = hexValue(digits[index + 1]) else {
                throw LockboxError.syncDatabase("A value the sync database gave")
            }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// A `bigint` column in binary format (8 bytes, big endian).
    package static func integer(binary bytes: [UInt8]?) throws(LockboxError) -> Int64 {
        guard let bytes, bytes.count == 8 else { throw LockboxError.syncDatabase("A value the sync database gave") }
        return Int64(bitPattern: bytes.reduce(0) { $0 << 8 | UInt64($1) })
    }

    package static func integer(_ text: String?) throws(LockboxError) -> Int64 {
        guard let text, let value = Int64(text) else { throw LockboxError.syncDatabase("A value the sync database gave") }
        return value
    }
}
