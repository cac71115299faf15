import LockboxCore

/// What a credential helper run produced: the bytes for stdout, a message for stderr, and
/// the exit status. The executables write these out; tests read them directly.
///
/// `standardOutput` may hold a secret (a `get` answer): write it, then call ``wipe()``.
public struct HelperOutcome: Sendable {
    public var standardOutput: [UInt8]
    public var standardError: String
    public var exitStatus: Int32

    public init(standardOutput: [UInt8] = [], standardError: String = "", exitStatus: Int32 = 0) {
        self.standardOutput = standardOutput
        self.standardError = standardError
        self.exitStatus = exitStatus
    }

    /// Zeroes the output bytes once they have been written.
    public mutating func wipe() {
        standardOutput.wipe()
        standardOutput.removeAll()
    }
}
