internal import CCrypto
import LockboxCore

/// AES-256-GCM over OpenSSL, in CryptoKit's combined layout: `nonce (12) || ciphertext || tag (16)`.
/// The nonce is random and made inside ``seal(_:key:authenticating:)``, never a parameter.
package enum AESGCM {
    package static let keyByteCount = 32
    package static let nonceByteCount = 12
    package static let tagByteCount = 16

    /// A fresh random 256-bit key from OpenSSL's generator.
    package static func generateKey() throws(LockboxError) -> SecretBytes {
        try SecretBytes(capacity: keyByteCount) { (buffer) throws(LockboxError) -> Int in
            guard RAND_bytes(buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(keyByteCount)) == 1 else {
                throw OpenSSLFailure.error("RAND_bytes")
            }
            return keyByteCount
        }
    }

    package static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: SecretBytes, authenticating associatedData: [UInt8]
    ) throws(LockboxError) -> [UInt8] {
        precondition(key.count == keyByteCount, "an AES-256 key is 32 bytes")
        var box = [UInt8](repeating: 0, count: nonceByteCount + plaintext.count + tagByteCount)
        guard RAND_bytes(&box, Int32(nonceByteCount)) == 1 else { throw OpenSSLFailure.error("RAND_bytes") }
        let cipher = try CipherOperation()
        let sealed = key.withUnsafeBytes { keyBytes in
            box.withUnsafeMutableBufferPointer { output -> Bool in
                let nonce = output.baseAddress!
                let body = nonce + nonceByteCount
                var written: Int32 = 0
                var finalWritten: Int32 = 0
                guard EVP_EncryptInit_ex(cipher.pointer, EVP_aes_256_gcm(), nil, keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), nonce) == 1,
                    EVP_EncryptUpdate(cipher.pointer, nil, &written, associatedData, Int32(associatedData.count)) == 1,
                    plaintext.count == 0
                        || EVP_EncryptUpdate(
                            cipher.pointer, body, &written, plaintext.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(plaintext.count)) == 1,
                    EVP_EncryptFinal_ex(cipher.pointer, body + Int(written), &finalWritten) == 1,
                    Int(written) + Int(finalWritten) == plaintext.count || plaintext.count == 0,
                    EVP_CIPHER_CTX_ctrl(cipher.pointer, lockbox_evp_ctrl_gcm_get_tag, Int32(tagByteCount), body + plaintext.count) == 1
                else { return false }
                return true
            }
        }
        guard sealed else { throw OpenSSLFailure.error("EVP_EncryptFinal_ex") }
        return box
    }

    /// Opens a box made by ``seal(_:key:authenticating:)`` (or by CryptoKit's `AES.GCM`).
    /// - Throws: one opaque `decode` error for any failure: wrong key, tampered box, wrong
    ///   associated data, too short.
    package static func open(_ box: [UInt8], key: SecretBytes, authenticating associatedData: [UInt8]) throws(LockboxError) -> SecretBytes {
        let failure = LockboxError(
            .decode, "The ciphertext failed authentication: it was modified, or made with another key or associated data.")
        guard key.count == keyByteCount, box.count >= nonceByteCount + tagByteCount else { throw failure }
        let plaintextCount = box.count - nonceByteCount - tagByteCount
        let cipher = try CipherOperation()
        var tag = Array(box[(box.count - tagByteCount)...])
        return try SecretBytes(capacity: plaintextCount) { (output) throws(LockboxError) -> Int in
            let opened = key.withUnsafeBytes { keyBytes in
                box.withUnsafeBufferPointer { input -> Bool in
                    let nonce = input.baseAddress!
                    let target = output.baseAddress?.assumingMemoryBound(to: UInt8.self)
                    var written: Int32 = 0
                    var finalWritten: Int32 = 0
                    var scratch = [UInt8](repeating: 0, count: 16)
                    guard EVP_DecryptInit_ex(cipher.pointer, EVP_aes_256_gcm(), nil, keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), nonce) == 1,
                        EVP_DecryptUpdate(cipher.pointer, nil, &written, associatedData, Int32(associatedData.count)) == 1,
                        plaintextCount == 0
                            || EVP_DecryptUpdate(cipher.pointer, target, &written, nonce + nonceByteCount, Int32(plaintextCount)) == 1,
                        EVP_CIPHER_CTX_ctrl(cipher.pointer, lockbox_evp_ctrl_gcm_set_tag, Int32(tagByteCount), &tag) == 1
                    else { return false }
                    let finalTarget = plaintextCount == 0 ? nil : target! + Int(written)
                    return scratch.withUnsafeMutableBufferPointer { spare in
                        EVP_DecryptFinal_ex(cipher.pointer, finalTarget ?? spare.baseAddress!, &finalWritten) == 1
                    }
                }
            }
            // On failure SecretBytes wipes whatever was written before the tag was checked.
            guard opened else {
                ERR_clear_error()
                throw failure
            }
            return plaintextCount
        }
    }
}

/// Message digests (not secret inputs).
package enum MessageDigest {
    /// SHA-1: Apple's `kSecAttrApplicationLabel` of a public key. Not used for security.
    package static func sha1(_ bytes: [UInt8]) -> [UInt8] { digest(bytes, EVP_sha1(), count: 20) }

    package static func sha256(_ bytes: [UInt8]) -> [UInt8] { digest(bytes, EVP_sha256(), count: 32) }

    private static func digest(_ bytes: [UInt8], _ type: OpaquePointer?, count: Int) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: count)
        var written: UInt32 = 0
        let result = EVP_Digest(bytes, bytes.count, &output, &written, type, nil)
        precondition(result == 1 && Int(written) == count, "a message digest cannot fail")
        return output
    }
}
