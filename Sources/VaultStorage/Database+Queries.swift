import LockboxCore

extension Database {
    /// `PRAGMA data_version`: changes whenever another connection commits to the file (not
    /// for this connection's own commits), so results derived from the file can be cached
    /// until it moves.
    package var dataVersion: Int {
        get throws(LockboxError) {
            let statement = try statement("PRAGMA data_version")
            defer { statement.reset() }
            guard try statement.step(), let value = statement.integer(0) else { return 0 }
            return value
        }
    }

    /// Runs a query expected to give at most one row; the statement is reset before this
    /// returns, so no read snapshot outlives the call.
    package func firstRow<T>(
        _ sql: String, bind: (Statement) -> Void = { _ in }, read: (Statement) throws(LockboxError) -> T
    ) throws(LockboxError) -> T? {
        let statement = try statement(sql)
        defer { statement.reset() }
        bind(statement)
        guard try statement.step() else { return nil }
        return try read(statement)
    }

}
