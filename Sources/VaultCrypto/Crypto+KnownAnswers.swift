internal import CSodium
import LockboxCore

// Entry points that exist only so that the known-answer tests can hold libsodium to published
// vectors (Tests/LockboxVaultTests/KnownAnswerTests.swift). The vault never calls them: it seals
// only through `Crypto.seal`, which draws its own nonce, and derives keys only through
// `PassphraseKeyDerivation`, which enforces the parameter floor.
extension Crypto {
    /// XChaCha20-Poly1305 with the caller's nonce. For known-answer tests only: a nonce used
    /// twice under one key breaks the cipher, which is why ``seal(_:key:associatedData:)``
    /// never takes one.
    /// - Returns: nonce || ciphertext || tag, the layout ``open(_:key:associatedData:)`` reads.
    package static func sealForKnownAnswerTest(
        _ plaintext: [UInt8], key: [UInt8], nonce: [UInt8], associatedData: [UInt8]
    ) -> [UInt8] {
        ensureInitialized()
        precondition(key.count == keyByteCount && nonce.count == 24, "XChaCha20-Poly1305 takes a 32-byte key and a 24-byte nonce")
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count + 16)
        var written: UInt64 = 0
        let result = crypto_aead_xchacha20poly1305_ietf_encrypt(
            &ciphertext, &written, plaintext, UInt64(plaintext.count), associatedData, UInt64(associatedData.count),
            nil, nonce, key)
        precondition(result == 0 && written == UInt64(ciphertext.count), "XChaCha20-Poly1305 encryption cannot fail")
        return nonce + ciphertext
    }

    /// BLAKE2b (libsodium's `crypto_generichash`) with any output length and an optional key,
    /// for known-answer tests only.
    package static func genericHashForKnownAnswerTest(_ input: [UInt8], key: [UInt8], outputByteCount: Int) -> [UInt8] {
        ensureInitialized()
        var digest = [UInt8](repeating: 0, count: outputByteCount)
        let result = key.withUnsafeBufferPointer { keyBytes in
            crypto_generichash(&digest, outputByteCount, input, UInt64(input.count), keyBytes.baseAddress, keyBytes.count)
        }
        precondition(result == 0, "BLAKE2b output and key lengths out of range")
        return digest
    }

    /// Argon2id v1.3 (libsodium's `crypto_pwhash_argon2id`, one lane) without the vault's
    /// parameter floor, for known-answer tests only.
    /// - Returns: nil when libsodium refuses the parameters (as for an output under 16 bytes).
    package static func argon2idForKnownAnswerTest(
        password: [UInt8], salt: [UInt8], operations: UInt64, memoryBytes: Int, outputByteCount: Int
    ) -> [UInt8]? {
        ensureInitialized()
        precondition(salt.count == Int(crypto_pwhash_argon2id_SALTBYTES), "Argon2id in libsodium takes a 16-byte salt")
        var output = [UInt8](repeating: 0, count: outputByteCount)
        // One byte more than the password, so that an empty one still has an address.
        let characters = password.map { CChar(bitPattern: $0) } + [0]
        let result = crypto_pwhash_argon2id(
            &output, UInt64(outputByteCount), characters, UInt64(password.count), salt,
            operations, memoryBytes, crypto_pwhash_argon2id_ALG_ARGON2ID13)
        return result == 0 ? output : nil
    }
}
