import FoundationEssentials
import LockboxCore
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

/// The failed-passphrase counter: one throttle for every passphrase check (unlock, change and
/// removal of the passphrase, user verification for access-controlled items), shared by every
/// process through the vault file.
///
/// The record is authenticated with a key from this machine's device secret, so editing or
/// deleting it in the file does not reset it: on a machine that has used the vault before (its
/// state directory remembers it), a record that fails its check counts as the longest delay
/// until the next successful check. The count is also mirrored in the state directory, and the
/// higher of the two applies, so putting back an older (authentic) record does not reset it.
///
/// The record names the device key that wrote it. One written under another device key (the
/// same vault used with another `XDG_STATE_HOME`: a sandbox, a service manager) cannot be
/// checked here, and is no sign of tampering: its count is taken as it stands, and the mirror
/// still keeps every failure counted here. Before, such a record made the next unlock here wait
/// the longest delay.
extension Vault {
    struct Attempts {
        var failures: Int
        var lastFailure: Double
    }

    static let tamperedFailureCount = 8

    private static func attemptsKey(_ state: State) -> SecretBytes {
        // Without the device secret (its TPM does not unseal it here) the record is bound to
        // the device identifier alone: the mirrored count in the state directory still applies.
        let secret = state.device.availableSecret ?? SecretBytes(utf8: "lockbox.unavailable-device:" + state.device.identifier)
        return Crypto.combine(secret, with: SecretBytes(copying: state.header.vaultID), context: "lockbox.attempts.v2")
    }

    /// The MAC of a record; `writer` is the device identifier a record of the second format
    /// names (nil: the first format, which names none).
    private static func attemptsMAC(_ attempts: Attempts, writer: String?, state: State) -> [UInt8] {
        var encoder = FieldEncoder()
        if let writer {
            encoder.string("lockbox.attempts.v3")
            encoder.bytes(state.header.vaultID)
            encoder.string(writer)
        } else {
            encoder.string("lockbox.attempts.v2")
            encoder.bytes(state.header.vaultID)
        }
        encoder.integer(attempts.failures)
        encoder.double(attempts.lastFailure)
        return Crypto.keyedDigest(encoder.bytes, key: attemptsKey(state))
    }

    /// The bytes of a MAC: a record's `mac` column is the MAC, followed (second format) by the
    /// identifier of the device key that wrote it.
    private static let attemptsMACLength = 32

    /// What a stored record is worth here.
    private enum AttemptsStanding {
        /// Written under this device key (or in the first format) and checked.
        case authentic
        /// Written under another device key: not checkable here, taken as it stands.
        case anotherDevice
        /// Missing, or failing its check.
        case unchecked
    }

    private static func standing(_ record: Attempts, mac: [UInt8], state: State) -> AttemptsStanding {
        guard mac.count >= attemptsMACLength else { return .unchecked }
        let digest = Array(mac.prefix(attemptsMACLength))
        guard mac.count > attemptsMACLength else {
            return IntegrityState.equal(digest, attemptsMAC(record, writer: nil, state: state)) ? .authentic : .unchecked
        }
        let writer = String(decoding: mac.dropFirst(attemptsMACLength), as: UTF8.self)
        guard writer == state.device.identifier else { return .anotherDevice }
        return IntegrityState.equal(digest, attemptsMAC(record, writer: writer, state: state)) ? .authentic : .unchecked
    }

    /// A count beyond any real one: a larger stored value is clamped, never trusted to overflow.
    static let maximumFailureCount = 1_000

    func readAttempts(_ state: State) throws(LockboxError) -> Attempts {
        try readAttemptsRecord(state).attempts
    }

    /// The effective count, and whether the file holds an authentic record of it.
    private func readAttemptsRecord(_ state: State) throws(LockboxError) -> (attempts: Attempts, authentic: Bool) {
        let stored = try state.database.firstRow("SELECT failures, last_failure, mac FROM unlock_attempts WHERE id = 1") { row in
            (Attempts(failures: row.integer(0) ?? 0, lastFailure: row.double(1) ?? 0), row.blob(2))
        }
        var attempts: Attempts
        var authentic = false
        let standing = stored.map { record, mac in mac.map { Self.standing(record, mac: $0, state: state) } ?? .unchecked } ?? .unchecked
        if let (record, _) = stored, standing != .unchecked {
            attempts = record
            authentic = standing == .authentic
        } else if state.rememberedGeneration.exists {
            // This machine knows the vault: an unauthenticated or missing record is tampering.
            attempts = Attempts(
                failures: max(stored?.0.failures ?? 0, Self.tamperedFailureCount), lastFailure: configuration.clock.sinceEpoch().secondsValue)
        } else {
            attempts = stored?.0 ?? Attempts(failures: 0, lastFailure: 0)
        }
        let mirrored = readMirroredAttempts(state)
        attempts.failures = min(max(attempts.failures, mirrored.failures, 0), Self.maximumFailureCount)
        attempts.lastFailure = max(attempts.lastFailure.isFinite ? attempts.lastFailure : 0, mirrored.lastFailure)
        return (attempts, authentic && attempts.failures == (stored?.0.failures ?? 0))
    }

    private func readMirroredAttempts(_ state: State) -> Attempts {
        guard let bytes = Self.readSmallFile(state.rememberedGeneration.attemptsPath) else { return Attempts(failures: 0, lastFailure: 0) }
        let fields = String(decoding: bytes, as: UTF8.self).split(separator: " ")
        guard fields.count == 2, let failures = Int(fields[0]), let last = Double(fields[1]), last.isFinite else {
            return Attempts(failures: 0, lastFailure: 0)
        }
        return Attempts(failures: min(max(failures, 0), Self.maximumFailureCount), lastFailure: last)
    }

    func writeAttempts(_ attempts: Attempts, state: State) throws(LockboxError) {
        Self.writeSmallFile(state.rememberedGeneration.attemptsPath, Array("\(attempts.failures) \(attempts.lastFailure)".utf8))
        let statement = try state.database.statement(
            "INSERT OR REPLACE INTO unlock_attempts (id, failures, last_failure, mac) VALUES (1, ?, ?, ?)")
        statement.bind(1, attempts.failures)
        statement.bind(2, attempts.lastFailure)
        let writer = state.device.identifier
        statement.bind(3, Self.attemptsMAC(attempts, writer: writer, state: state) + Array(writer.utf8))
        try statement.run()
    }

    /// How long to wait before the next passphrase check (at most 30 s).
    func delayBeforeNextCheck(_ state: State) throws(LockboxError) -> Duration {
        let attempts = try readAttempts(state)
        let now = configuration.clock.sinceEpoch().secondsValue
        let wait = Double(Self.delay(afterFailures: attempts.failures)) - (now - attempts.lastFailure)
        return .milliseconds(Int64((min(max(wait, 0), 30) * 1000).rounded(.up)))
    }

    /// Counts a failed check; returns the new count.
    func recordFailedAttempt(_ state: State) throws(LockboxError) -> Int {
        try state.database.writeTransaction { () throws(LockboxError) -> Int in
            var attempts = try readAttempts(state)
            attempts.failures = min(attempts.failures + 1, Self.maximumFailureCount)
            attempts.lastFailure = configuration.clock.sinceEpoch().secondsValue
            try writeAttempts(attempts, state: state)
            return attempts.failures
        }
    }

    /// Resets the count after a successful check.
    func clearFailedAttempts(_ state: State) throws(LockboxError) {
        // Nothing to write when the count is zero and the file holds an authentic record of it.
        let current = try readAttemptsRecord(state)
        guard current.attempts.failures != 0 || !current.authentic else { return }
        try state.database.writeTransaction { () throws(LockboxError) in
            try writeAttempts(Attempts(failures: 0, lastFailure: 0), state: state)
        }
    }

    func wrongPassphrase(failures: Int, _ what: String) -> LockboxError {
        let wait = Self.delay(afterFailures: failures)
        return LockboxError(
            .authFailed,
            "\(what) (failed attempt \(failures)" + (wait > 0 ? "; the next attempt waits \(wait) s)." : ")."))
    }
}
