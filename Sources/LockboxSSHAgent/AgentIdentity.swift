import FoundationEssentials
import LockboxCore
import LockboxKeys

/// A key the agent offers: its public half, a comment, and a way to sign with it. Made from
/// any store's keys through their public API, so hardware-backed keys plug in the same way.
package struct AgentIdentity: Sendable {
    package var publicKey: PublicKey
    package var comment: String
    /// Signs a message; the result is the key's native signature (DER for ECDSA P-256, 64
    /// bytes for Ed25519), the form `ManagedKey.sign` returns.
    package var sign: @Sendable (_ message: Data, _ context: AuthenticationContext) throws(LockboxError) -> Data

    package init(
        publicKey: PublicKey, comment: String,
        sign: @escaping @Sendable (_ message: Data, _ context: AuthenticationContext) throws(LockboxError) -> Data
    ) {
        self.publicKey = publicKey
        self.comment = comment
        self.sign = sign
    }

    /// The SSH public key blob (RFC 5656 section 3.1, RFC 8709 section 4).
    package var keyBlob: [UInt8] { SSHKeyBlob.encode(publicKey) ?? [] }
}

/// Where the agent's keys come from.
package protocol AgentKeySource: Sendable {
    /// The keys to offer, in a stable order.
    /// - Throws: `interactionNotAllowed` when the keychain is locked (never an empty list).
    func identities() throws(LockboxError) -> [AgentIdentity]
}

/// The managed keys of a ``SoftwareKeyStore`` made for the agent: application tag
/// ``applicationTag``, algorithm Ed25519 or P-256, the `sign` purpose.
package struct ManagedKeySource: AgentKeySource {
    /// The application tag of the keys `lockbox ssh-agent generate` makes.
    package static let applicationTag = Data("org.lockbox.ssh-agent".utf8)

    package let store: SoftwareKeyStore

    package init(store: SoftwareKeyStore) {
        self.store = store
    }

    package func identities() throws(LockboxError) -> [AgentIdentity] {
        try store.keys(applicationTag: Self.applicationTag).compactMap { key in
            guard key.algorithm == .ed25519 || key.algorithm == .p256, let publicKey = key.publicKey else { return nil }
            // A key without the sign purpose is still listed by the store but never offered.
            guard key.purposes.contains(.sign) else { return nil }
            // `ssh-add -L` prints the comment as it comes: it is given on one line.
            return AgentIdentity(publicKey: publicKey, comment: PrintableText.oneLine(key.label ?? "")) { (message, context) throws(LockboxError) in
                try key.sign(message, context: context)
            }
        }
    }
}

/// SSH encodings of public keys and signatures.
package enum SSHKeyBlob {
    package static func algorithmName(_ algorithm: KeyAlgorithm) -> String? {
        switch algorithm {
        case .ed25519: "ssh-ed25519"
        case .p256: "ecdsa-sha2-nistp256"
        case .x25519, .aes256GCM: nil
        }
    }

    package static func encode(_ key: PublicKey) -> [UInt8]? {
        guard let name = algorithmName(key.algorithm) else { return nil }
        var blob: [UInt8] = []
        WireWriter.appendString(Array(name.utf8), to: &blob)
        if key.algorithm == .p256 { WireWriter.appendString(Array("nistp256".utf8), to: &blob) }
        WireWriter.appendString(Array(key.rawRepresentation), to: &blob)
        return blob
    }

    /// The SSH signature blob: `string algorithm, string signature`, where an ECDSA signature
    /// is `mpint r, mpint s` (RFC 5656 section 3.1.2) and an Ed25519 one the 64 bytes.
    /// - Throws: `decode` when a P-256 signature is not the DER the key store makes.
    package static func signature(_ native: Data, algorithm: KeyAlgorithm) throws(LockboxError) -> [UInt8] {
        guard let name = algorithmName(algorithm) else {
            throw LockboxError(.param, "SSH has no signature format for \(algorithm) keys.")
        }
        var blob: [UInt8] = []
        WireWriter.appendString(Array(name.utf8), to: &blob)
        switch algorithm {
        case .ed25519:
            WireWriter.appendString(Array(native), to: &blob)
        default:
            guard let (r, s) = DERSignature.integers(Array(native)) else {
                throw LockboxError(.decode, "The key store returned a P-256 signature that is not DER.")
            }
            var inner: [UInt8] = []
            WireWriter.appendPositiveMPInt(r, to: &inner)
            WireWriter.appendPositiveMPInt(s, to: &inner)
            WireWriter.appendString(inner, to: &blob)
        }
        return blob
    }
}

/// The two INTEGERs of a DER ECDSA signature (`SEQUENCE { r INTEGER, s INTEGER }`).
package enum DERSignature {
    package static func integers(_ der: [UInt8]) -> (r: ArraySlice<UInt8>, s: ArraySlice<UInt8>)? {
        var index = 0
        func length() -> Int? {
            guard index < der.count else { return nil }
            let first = der[index]
            index += 1
            if first < 0x80 { return Int(first) }
            // Lengths over 127 (0x81 NN) do not occur in a P-256 signature, but are valid DER.
            guard first == 0x81, index < der.count, der[index] >= 0x80 else { return nil }
            defer { index += 1 }
            return Int(der[index])
        }
        func integer() -> ArraySlice<UInt8>? {
            guard index < der.count, der[index] == 0x02 else { return nil }
            index += 1
            guard let count = length(), count > 0, count <= 33, index + count <= der.count else { return nil }
            defer { index += count }
            let value = der[index..<index + count]
            // Non-negative, minimally encoded.
            guard value.first! & 0x80 == 0 else { return nil }
            if count > 1, value.first! == 0, value[value.startIndex + 1] & 0x80 == 0 { return nil }
            return value
        }
        guard der.first == 0x30 else { return nil }
        index = 1
        guard let total = length(), index + total == der.count else { return nil }
        guard let r = integer(), let s = integer(), index == der.count else { return nil }
        return (r, s)
    }
}
