internal import CSodium
#if canImport(Glibc)
import Glibc
#endif
import LockboxCore

/// The vault's cryptography, over libsodium. This target is the only importer of CSodium.
///
/// Keys are ``SecretBytes`` made by ``Crypto/generateKey()`` or derived here; nonces are made
/// inside ``Crypto/seal(_:key:associatedData:)`` and are never a parameter; every failed
/// open is the same ``Crypto/OpenFailure``.
package enum Crypto {
    /// Bytes of every symmetric key the vault uses.
    package static let keyByteCount = 32
    /// Nonce and tag overhead of a sealed box: 24-byte nonce + 16-byte tag.
    package static let sealOverhead = 24 + 16
    private static let nonceByteCount = 24

    /// Any failure to open a sealed box. It carries no detail on purpose.
    package struct OpenFailure: Error {}

    private static let initialized: Bool = {
        precondition(sodium_init() >= 0, "libsodium failed to initialize")
        return true
    }()

    /// Called by every entry point; cheap after the first time.
    @inline(__always) static func ensureInitialized() {
        _ = initialized
    }

    /// The same, for this target's other files (``Curve25519``).
    @inline(__always) static func ensureSodium() {
        _ = initialized
    }

    /// A fresh random 256-bit key.
    package static func generateKey() -> SecretBytes {
        ensureInitialized()
        return SecretBytes(capacity: keyByteCount) { buffer in
            randombytes_buf(buffer.baseAddress!, keyByteCount)
            return keyByteCount
        }
    }

    /// `count` random bytes (identifiers, salts): not secret.
    package static func randomBytes(_ count: Int) -> [UInt8] {
        ensureInitialized()
        var bytes = [UInt8](repeating: 0, count: count)
        bytes.withUnsafeMutableBytes { randombytes_buf($0.baseAddress!, count) }
        return bytes
    }

    /// Fills `buffer` with random bytes (not secret).
    package static func fillRandom(_ buffer: UnsafeMutableRawBufferPointer) {
        ensureInitialized()
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        randombytes_buf(base, buffer.count)
    }

    /// Seals `plaintext` with XChaCha20-Poly1305 under `key`, binding `associatedData`.
    /// - Returns: nonce || ciphertext || tag.
    package static func seal(_ plaintext: UnsafeRawBufferPointer, key: SecretBytes, associatedData: [UInt8]) -> [UInt8] {
        associatedData.withUnsafeBytes { seal(plaintext, key: key, associatedData: $0) }
    }

    /// ``seal(_:key:associatedData:)-(UnsafeRawBufferPointer,_,[UInt8])`` with the associated
    /// data read in place.
    package static func seal(_ plaintext: UnsafeRawBufferPointer, key: SecretBytes, associatedData: UnsafeRawBufferPointer) -> [UInt8] {
        ensureInitialized()
        precondition(key.count == keyByteCount, "sealing key must be 32 bytes")
        var box = [UInt8](repeating: 0, count: nonceByteCount + plaintext.count + 16)
        box.withUnsafeMutableBufferPointer { output in
            let nonce = output.baseAddress!
            randombytes_buf(nonce, nonceByteCount)
            key.withUnsafeBytes { keyBytes in
                var written: UInt64 = 0
                let result = crypto_aead_xchacha20poly1305_ietf_encrypt(
                    nonce + nonceByteCount, &written,
                    plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                    associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
                    nil, nonce, keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self))
                precondition(result == 0, "XChaCha20-Poly1305 encryption cannot fail")
            }
        }
        return box
    }

    /// Seals a secret (see ``seal(_:key:associatedData:)``).
    package static func seal(_ secret: SecretBytes, key: SecretBytes, associatedData: [UInt8]) -> [UInt8] {
        secret.withUnsafeBytes { seal($0, key: key, associatedData: associatedData) }
    }

    /// Seals a secret, the associated data read in place.
    package static func seal(_ secret: SecretBytes, key: SecretBytes, associatedData: UnsafeRawBufferPointer) -> [UInt8] {
        secret.withUnsafeBytes { seal($0, key: key, associatedData: associatedData) }
    }

    /// Seals plain bytes, the associated data read in place.
    package static func seal(_ bytes: [UInt8], key: SecretBytes, associatedData: UnsafeRawBufferPointer) -> [UInt8] {
        bytes.withUnsafeBytes { seal($0, key: key, associatedData: associatedData) }
    }

    /// Seals plain bytes that are not secret by themselves (metadata).
    package static func seal(_ bytes: [UInt8], key: SecretBytes, associatedData: [UInt8]) -> [UInt8] {
        bytes.withUnsafeBytes { seal($0, key: key, associatedData: associatedData) }
    }

    /// Opens a box made by `seal` into guarded memory.
    package static func open(_ box: [UInt8], key: SecretBytes, associatedData: [UInt8]) throws(OpenFailure) -> SecretBytes {
        ensureInitialized()
        guard box.count >= sealOverhead else { throw OpenFailure() }
        let plaintextCount = box.count - sealOverhead
        return try SecretBytes(capacity: plaintextCount) { (output: UnsafeMutableRawBufferPointer) throws(OpenFailure) -> Int in
            let opened = box.withUnsafeBytes { decrypt($0, into: output, key: key, associatedData: associatedData) }
            guard opened else { throw OpenFailure() }
            return plaintextCount
        }
    }

    /// Opens a box into protected memory and keeps only the part `extract` names in the
    /// plaintext (a value without its padding, say), moved to the front: no second copy of the
    /// plaintext is made. Nil from `extract` fails like a wrong tag.
    package static func open(
        _ box: [UInt8], key: SecretBytes, associatedData: [UInt8], extracting extract: (UnsafeRawBufferPointer) -> Range<Int>?
    ) throws(OpenFailure) -> SecretBytes {
        let opened = box.withUnsafeBytes { (box: UnsafeRawBufferPointer) -> SecretBytes? in
            try? open(box, key: key, associatedData: associatedData, extracting: extract)
        }
        guard let opened else { throw OpenFailure() }
        return opened
    }

    /// ``open(_:key:associatedData:extracting:)`` of a box read in place (a column of a row
    /// still in SQLite's buffers, say).
    package static func open(
        _ box: UnsafeRawBufferPointer, key: SecretBytes, associatedData: [UInt8], extracting extract: (UnsafeRawBufferPointer) -> Range<Int>?
    ) throws(OpenFailure) -> SecretBytes {
        let opened = associatedData.withUnsafeBytes { associatedData in
            try? open(box, key: key, associatedDataInPlace: associatedData, extracting: extract)
        }
        guard let opened else { throw OpenFailure() }
        return opened
    }

    /// ``open(_:key:associatedData:extracting:)-(UnsafeRawBufferPointer,_,_,_)`` with associated
    /// data read in place.
    package static func open(
        _ box: UnsafeRawBufferPointer, key: SecretBytes, associatedDataInPlace associatedData: UnsafeRawBufferPointer,
        extracting extract: (UnsafeRawBufferPointer) -> Range<Int>?
    ) throws(OpenFailure) -> SecretBytes {
        ensureInitialized()
        guard box.count >= sealOverhead else { throw OpenFailure() }
        let plaintextCount = box.count - sealOverhead
        return try SecretBytes(capacity: plaintextCount) { (output: UnsafeMutableRawBufferPointer) throws(OpenFailure) -> Int in
            let opened = decrypt(box, into: output, key: key, associatedData: associatedData)
            guard opened, let range = extract(UnsafeRawBufferPointer(output)), range.upperBound <= plaintextCount else {
                throw OpenFailure()
            }
            if range.lowerBound > 0 && !range.isEmpty {
                memmove(output.baseAddress!, output.baseAddress! + range.lowerBound, range.count)
            }
            // SecretBytes wipes what lies past the count returned.
            return range.count
        }
    }

    /// Opens a box whose contents are not secret by themselves (metadata) into an array.
    package static func openBytes(_ box: [UInt8], key: SecretBytes, associatedData: [UInt8]) throws(OpenFailure) -> [UInt8] {
        ensureInitialized()
        guard box.count >= sealOverhead else { throw OpenFailure() }
        var output = [UInt8](repeating: 0, count: box.count - sealOverhead)
        let opened = output.withUnsafeMutableBytes { buffer in
            box.withUnsafeBytes { decrypt($0, into: buffer, key: key, associatedData: associatedData) }
        }
        guard opened else { throw OpenFailure() }
        return output
    }

    /// Decrypts and verifies; on failure nothing is written that could be mistaken for
    /// plaintext (libsodium verifies the tag before decrypting).
    private static func decrypt(
        _ box: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
        key: SecretBytes, associatedData: [UInt8]
    ) -> Bool {
        associatedData.withUnsafeBytes { decrypt(box, into: output, key: key, associatedData: $0) }
    }

    private static func decrypt(
        _ box: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
        key: SecretBytes, associatedData: UnsafeRawBufferPointer
    ) -> Bool {
        guard key.count == keyByteCount else { return false }
        let boxStart = box.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let result = key.withUnsafeBytes { keyBytes in
            var written: UInt64 = 0
            // An empty plaintext still needs a valid pointer for the output.
            var scratch: UInt8 = 0
            let target = output.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? withUnsafeMutablePointer(to: &scratch) { $0 }
            return crypto_aead_xchacha20poly1305_ietf_decrypt(
                target, &written, nil,
                boxStart + nonceByteCount, UInt64(box.count - nonceByteCount),
                associatedData.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(associatedData.count),
                boxStart, keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return result == 0
    }

    /// Keyed BLAKE2b-256 of `input`: lookup digests that reveal equality, not values.
    package static func keyedDigest(_ input: [UInt8], key: SecretBytes) -> [UInt8] {
        input.withUnsafeBytes { keyedDigest($0, key: key) }
    }

    /// ``keyedDigest(_:key:)-([UInt8],_)`` of bytes read in place (a part of a larger buffer,
    /// without copying it).
    package static func keyedDigest(_ input: UnsafeRawBufferPointer, key: SecretBytes) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        digest.withUnsafeMutableBytes { keyedDigest(input, key: key, into: $0) }
        return digest
    }

    /// BLAKE2b-256 of public bytes (a ciphertext another blob's associated data binds).
    package static func digest(_ input: [UInt8]) -> [UInt8] {
        input.withUnsafeBytes { digest($0) }
    }

    /// ``digest(_:)-([UInt8])`` of bytes read in place.
    package static func digest(_ input: UnsafeRawBufferPointer) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        digest.withUnsafeMutableBytes { Self.digest(input, into: $0) }
        return digest
    }

    /// Keyed BLAKE2b-256 of a secret input, read in place from its guarded memory.
    package static func keyedDigest(_ input: SecretBytes, key: SecretBytes) -> [UInt8] {
        ensureInitialized()
        var digest = [UInt8](repeating: 0, count: 32)
        input.withUnsafeBytes { inputBytes in
            key.withUnsafeBytes { keyBytes in
                _ = crypto_generichash(
                    &digest, 32, inputBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(inputBytes.count),
                    keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), keyBytes.count)
            }
        }
        return digest
    }

    /// A fresh X25519 key pair for sealing to a public key (access control: anyone may seal an
    /// item key for the user; only the user's verification releases the secret half).
    package static func generateKeyPair() -> (publicKey: [UInt8], secretKey: SecretBytes) {
        ensureInitialized()
        var publicKey = [UInt8](repeating: 0, count: 32)
        let secretKey = SecretBytes(capacity: 32) { buffer in
            _ = crypto_box_keypair(&publicKey, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self))
            return 32
        }
        return (publicKey, secretKey)
    }

    /// Seals `bytes` so that only the holder of `publicKey`'s secret half can open them
    /// (libsodium's anonymous sealed box).
    package static func seal(_ bytes: [UInt8], toPublicKey publicKey: [UInt8]) -> [UInt8] {
        ensureInitialized()
        precondition(publicKey.count == 32, "a public key is 32 bytes")
        var box = [UInt8](repeating: 0, count: bytes.count + 48)
        let result = crypto_box_seal(&box, bytes, UInt64(bytes.count), publicKey)
        precondition(result == 0, "sealing to a public key cannot fail")
        return box
    }

    /// Opens a box made by ``seal(_:toPublicKey:)``.
    package static func open(_ box: [UInt8], publicKey: [UInt8], secretKey: SecretBytes) throws(OpenFailure) -> [UInt8] {
        ensureInitialized()
        guard box.count >= 48, publicKey.count == 32, secretKey.count == 32 else { throw OpenFailure() }
        var output = [UInt8](repeating: 0, count: box.count - 48)
        let result = secretKey.withUnsafeBytes { secret in
            crypto_box_seal_open(&output, box, UInt64(box.count), publicKey, secret.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        guard result == 0 else { throw OpenFailure() }
        return output
    }

    /// A 256-bit key bound to both `key` and `secret`: keyed BLAKE2b of `context || secret`.
    /// Used where a class key must need two things at once (the master key and this
    /// machine's device secret).
    package static func combine(_ key: SecretBytes, with secret: SecretBytes, context: String) -> SecretBytes {
        ensureInitialized()
        let label = Array(context.utf8)
        // The input (label, then the secret) is assembled in guarded memory.
        let input = SecretBytes(capacity: label.count + secret.count) { buffer in
            buffer.copyBytes(from: label)
            secret.withUnsafeBytes { bytes in
                UnsafeMutableRawBufferPointer(rebasing: buffer[label.count...]).copyMemory(from: bytes)
            }
            return label.count + secret.count
        }
        return SecretBytes(capacity: keyByteCount) { output in
            key.withUnsafeBytes { keyBytes in
                input.withUnsafeBytes { inputBytes in
                    _ = crypto_generichash(
                        output.baseAddress!.assumingMemoryBound(to: UInt8.self), keyByteCount,
                        inputBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(inputBytes.count),
                        keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), keyBytes.count)
                }
            }
            return keyByteCount
        }
    }

    /// Derives an independent 256-bit subkey from `key` for the purpose named by `context`
    /// (exactly 8 ASCII bytes) and `identifier`.
    package static func deriveKey(from key: SecretBytes, context: StaticString, identifier: UInt64) -> SecretBytes {
        ensureInitialized()
        precondition(context.utf8CodeUnitCount == 8, "a key-derivation context is 8 bytes")
        return SecretBytes(capacity: keyByteCount) { output in
            key.withUnsafeBytes { master in
                context.withUTF8Buffer { contextBytes in
                    contextBytes.withMemoryRebound(to: CChar.self) { contextChars in
                        let result = crypto_kdf_derive_from_key(
                            output.baseAddress!.assumingMemoryBound(to: UInt8.self), keyByteCount, identifier,
                            contextChars.baseAddress!, master.baseAddress!.assumingMemoryBound(to: UInt8.self))
                        precondition(result == 0, "key derivation cannot fail with valid sizes")
                    }
                }
            }
            return keyByteCount
        }
    }
}
