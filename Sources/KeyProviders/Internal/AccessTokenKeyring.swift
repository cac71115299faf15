import LockboxCore
import VaultCrypto

/// OAuth access tokens shared between a user's processes in the kernel keyring: the storage
/// under `LockboxAuthKeyring`'s cache and the `lockbox token` fast path, which reads it without
/// the HTTP stack.
///
/// One `user` key per session in the `lockbox` keyring (see ``KernelKeyring``), described
/// `lockbox:oauth:v1:<digest>`, where the digest (keyed BLAKE2b, truncated) covers a namespace
/// (the keychain's lock directory) and the session's identity (issuer, client and account). The
/// kernel forgets it when its timeout passes, at reboot, or when it is removed. The payload:
///
/// | bytes | field |
/// |---|---|
/// | 1 | format version, 1 |
/// | 8 | expiry, Unix milliseconds, big endian |
/// | 8 | fresh until (expiry minus the refresh leeway), Unix milliseconds |
/// | 1 + n | token type, length-prefixed |
/// | 2 + n | scope, space-separated, length-prefixed (big endian) |
/// | 2 + n | identity, length-prefixed: a reader checks it is the session it asked for |
/// | rest | the access token |
package enum AccessTokenKeyring {
    /// An access token with what a reader needs beside it.
    package struct Entry: Sendable {
        package var token: SecretBytes
        package var tokenType: String
        package var expiresAtMilliseconds: Int64
        package var freshUntilMilliseconds: Int64
        package var scope: String
        package var identity: String

        package init(
            token: SecretBytes, tokenType: String, expiresAtMilliseconds: Int64, freshUntilMilliseconds: Int64, scope: String,
            identity: String
        ) {
            self.token = token
            self.tokenType = tokenType
            self.expiresAtMilliseconds = expiresAtMilliseconds
            self.freshUntilMilliseconds = freshUntilMilliseconds
            self.scope = scope
            self.identity = identity
        }
    }

    /// The prefix of every access-token key's description.
    package static let descriptionPrefix = "lockbox:oauth:v1:"
    private static let formatVersion: UInt8 = 1
    // Not a secret: the digest only keeps descriptions short and free of URLs.
    private static let descriptionKey = SecretBytes(utf8: "lockbox access-token cache v1")

    /// The key description of a session's token.
    package static func description(namespace: String, identity: String) -> String {
        let input = Array(namespace.utf8) + [0] + Array(identity.utf8)
        return descriptionPrefix + Array(Crypto.keyedDigest(input, key: descriptionKey).prefix(16)).hexString
    }

    /// Stores `entry`, replacing the session's previous one, for `timeout` seconds (at least 1).
    package static func store(_ entry: Entry, namespace: String, timeout: UInt32) throws(KernelKeyring.Failure) {
        precondition(timeout > 0, "an access token is cached with a timeout")
        let type = Array(entry.tokenType.utf8.prefix(255))
        let scope = Array(entry.scope.utf8.prefix(0xFFFF))
        let identity = Array(entry.identity.utf8.prefix(0xFFFF))
        let size = 1 + 8 + 8 + 1 + type.count + 2 + scope.count + 2 + identity.count + entry.token.count
        let payload = SecretBytes(capacity: size) { buffer in
            var writer = Writer(buffer: buffer)
            writer.append([formatVersion])
            writer.append(bigEndian: UInt64(bitPattern: entry.expiresAtMilliseconds))
            writer.append(bigEndian: UInt64(bitPattern: entry.freshUntilMilliseconds))
            writer.append([UInt8(type.count)])
            writer.append(type)
            writer.append(length16: scope.count)
            writer.append(scope)
            writer.append(length16: identity.count)
            writer.append(identity)
            entry.token.withUnsafeBytes { writer.append($0) }
            return writer.offset
        }
        _ = try KernelKeyring.store(payload, description: description(namespace: namespace, identity: entry.identity), timeout: timeout)
    }

    /// The session's cached token, or nil when there is none (or it is damaged, or stored for
    /// another identity under a colliding description: never served).
    package static func read(namespace: String, identity: String) throws(KernelKeyring.Absence) -> Entry? {
        let serial: KernelKeyring.Serial
        do {
            serial = try KernelKeyring.find(description(namespace: namespace, identity: identity))
        } catch {
            if case .missing = error { return nil }
            throw error
        }
        let payload: SecretBytes
        do {
            payload = try KernelKeyring.read(serial)
        } catch {
            if case .missing = error { return nil }
            throw error
        }
        guard let entry = decode(payload), entry.identity == identity else { return nil }
        return entry
    }

    /// Removes the session's cached token; no error when there is none.
    package static func remove(namespace: String, identity: String) throws(KernelKeyring.Failure) {
        try KernelKeyring.remove(description: description(namespace: namespace, identity: identity))
    }

    private static func decode(_ payload: SecretBytes) -> Entry? {
        payload.withUnsafeBytes { bytes -> Entry? in
            var reader = Reader(bytes: bytes)
            guard reader.byte() == formatVersion, let expires = reader.uint64(), let fresh = reader.uint64(),
                let typeLength = reader.byte(), let type = reader.bytes(Int(typeLength)),
                let scopeLength = reader.uint16(), let scope = reader.bytes(Int(scopeLength)),
                let identityLength = reader.uint16(), let identity = reader.bytes(Int(identityLength))
            else { return nil }
            let token = SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[reader.offset...]))
            guard !token.isEmpty else { return nil }
            return Entry(
                token: token, tokenType: String(decoding: type, as: UTF8.self), expiresAtMilliseconds: Int64(bitPattern: expires),
                freshUntilMilliseconds: Int64(bitPattern: fresh), scope: String(decoding: scope, as: UTF8.self),
                identity: String(decoding: identity, as: UTF8.self))
        }
    }

    private struct Writer {
        let buffer: UnsafeMutableRawBufferPointer
        var offset = 0

        mutating func append(_ bytes: some Collection<UInt8>) {
            for byte in bytes {
                buffer[offset] = byte
                offset += 1
            }
        }

        mutating func append(bigEndian value: UInt64) {
            append((0..<8).map { UInt8(truncatingIfNeeded: value >> (56 - 8 * $0)) })
        }

        mutating func append(length16 value: Int) {
            append([UInt8(truncatingIfNeeded: value >> 8), UInt8(truncatingIfNeeded: value)])
        }
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var offset = 0

        mutating func byte() -> UInt8? {
            guard offset < bytes.count else { return nil }
            defer { offset += 1 }
            return bytes[offset]
        }

        mutating func bytes(_ count: Int) -> [UInt8]? {
            guard count <= bytes.count - offset else { return nil }
            defer { offset += count }
            return Array(bytes[offset..<offset + count])
        }

        mutating func uint16() -> UInt16? {
            bytes(2).map { UInt16($0[0]) << 8 | UInt16($0[1]) }
        }

        mutating func uint64() -> UInt64? {
            bytes(8).map { $0.reduce(0) { $0 << 8 | UInt64($1) } }
        }
    }
}
