internal import CSodium
import LockboxCore

/// Argon2id parameters for turning a passphrase into a key.
///
/// The default is libsodium's MODERATE (3 passes, 256 MiB). ``interactive`` (2 passes, 64 MiB)
/// is the lowest Lockbox accepts: a header asking for less is treated as tampered.
package struct PassphraseKeyDerivation: Sendable, Hashable {
    package var operationsLimit: UInt64
    package var memoryLimit: UInt64
    package var salt: [UInt8]

    package static let saltByteCount = 16

    package static let minimumOperations: UInt64 = UInt64(crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE)
    package static let minimumMemory: UInt64 = UInt64(crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE)

    package enum Strength: String, Sendable, CaseIterable {
        /// 2 passes, 64 MiB: libsodium's INTERACTIVE, the floor.
        case interactive
        /// 3 passes, 256 MiB: libsodium's MODERATE, the default.
        case moderate
        /// 4 passes, 1 GiB: libsodium's SENSITIVE.
        case sensitive
    }

    /// Fresh parameters of the given strength with a random salt.
    package init(strength: Strength) {
        switch strength {
        case .interactive:
            operationsLimit = UInt64(crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE)
            memoryLimit = UInt64(crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE)
        case .moderate:
            operationsLimit = UInt64(crypto_pwhash_argon2id_OPSLIMIT_MODERATE)
            memoryLimit = UInt64(crypto_pwhash_argon2id_MEMLIMIT_MODERATE)
        case .sensitive:
            operationsLimit = UInt64(crypto_pwhash_argon2id_OPSLIMIT_SENSITIVE)
            memoryLimit = UInt64(crypto_pwhash_argon2id_MEMLIMIT_SENSITIVE)
        }
        salt = Crypto.randomBytes(Self.saltByteCount)
    }

    package init(operationsLimit: UInt64, memoryLimit: UInt64, salt: [UInt8]) {
        self.operationsLimit = operationsLimit
        self.memoryLimit = memoryLimit
        self.salt = salt
    }

    /// True when these parameters are at least the floor Lockbox accepts.
    package var meetsMinimum: Bool {
        operationsLimit >= Self.minimumOperations && memoryLimit >= Self.minimumMemory
            && salt.count == Self.saltByteCount
            // An upper bound keeps an edited header from making unlock allocate without limit.
            && memoryLimit <= 4 << 30 && operationsLimit <= 64
    }

    /// Derives a 256-bit key from `passphrase`. Slow on purpose.
    package func deriveKey(from passphrase: SecretBytes) -> SecretBytes? {
        precondition(meetsMinimum, "Argon2id parameters below the floor must be rejected before deriving")
        _ = Crypto.generateKey()  // makes sure libsodium is initialized
        var succeeded = false
        let key = SecretBytes(capacity: Crypto.keyByteCount) { output in
            passphrase.withUnsafeBytes { password in
                var empty: CChar = 0
                let passwordStart = password.baseAddress?.assumingMemoryBound(to: CChar.self)
                    ?? withUnsafeMutablePointer(to: &empty) { UnsafePointer($0) }
                let result = crypto_pwhash_argon2id(
                    output.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(Crypto.keyByteCount),
                    passwordStart, UInt64(password.count),
                    salt, operationsLimit, Int(memoryLimit), crypto_pwhash_argon2id_ALG_ARGON2ID13)
                succeeded = result == 0
            }
            return Crypto.keyByteCount
        }
        // Argon2id fails only when it cannot allocate its memory.
        return succeeded ? key : nil
    }

    /// The parameters as bytes for the header (authenticated as associated data).
    package func encoded() -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("argon2id13")
        encoder.integer(Int(operationsLimit))
        encoder.integer(Int(memoryLimit))
        encoder.bytes(salt)
        return encoder.bytes
    }

    package init?(decoding bytes: [UInt8]) {
        var decoder = FieldDecoder(bytes)
        guard let algorithm = try? decoder.string(), algorithm == "argon2id13",
            let operations = try? decoder.integer(), operations > 0,
            let memory = try? decoder.integer(), memory > 0,
            let salt = try? decoder.bytes(), decoder.isAtEnd
        else { return nil }
        self.init(operationsLimit: UInt64(operations), memoryLimit: UInt64(memory), salt: salt)
    }
}
