import LockboxCore

/// Makes storage operations fail on purpose, for the fault-injection tests: the Nth operation
/// (counting statements executed and steps taken), once or from then on.
package final class StorageFaults {
    package enum Kind: Sendable {
        case diskFull
        case ioError
        case busy
    }

    package let kind: Kind
    package let failingOperation: Int
    package let persistent: Bool
    package private(set) var operations = 0
    /// The SQL of each operation counted, in order: where a test wants a fault to land.
    package private(set) var statements: [String] = []

    package init(kind: Kind, failingOperation: Int, persistent: Bool) {
        self.kind = kind
        self.failingOperation = failingOperation
        self.persistent = persistent
    }

    func check(_ sql: String?) throws(LockboxError) {
        // Rolling back must still work, or a fault could never be recovered from.
        if let sql, sql == "ROLLBACK" { return }
        operations += 1
        statements.append(sql ?? "")
        let hit = persistent ? operations >= failingOperation : operations == failingOperation
        guard hit else { return }
        switch kind {
        case .diskFull:
            throw LockboxError(.io, "The disk is full (injected fault). Free space, then try again; that file was not changed.")
        case .ioError:
            throw LockboxError(.io, "I/O error (injected fault). Check the disk, then try again; that file was not changed.")
        case .busy:
            throw LockboxError(.io, "The keychain is busy (injected fault): another process holds it. Try again.")
        }
    }
}
