internal import CCrypto
import LockboxCore

/// The pieces of Apple's ECIES (`SecKeyCreateEncryptedData` with the
/// `eciesEncryption...X963SHA*AESGCM` algorithms) that the AES-256-GCM box of ``AESGCM`` does not
/// cover: AES-GCM with a key of 16 or 32 bytes and a caller-given 16-byte IV (Apple's KDF makes
/// both), and the SHA-2 digests of the ANSI X9.63 KDF.
package enum GCMWithDerivedIV {
    package static let tagByteCount = 16

    /// `ciphertext || tag` of `plaintext` under `key` (16 or 32 bytes) and `iv`.
    package static func seal(_ plaintext: [UInt8], key: SecretBytes, iv: [UInt8]) throws(LockboxError) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: plaintext.count + tagByteCount)
        let cipher = try CipherOperation()
        let sealed = key.withUnsafeBytes { keyBytes in
            output.withUnsafeMutableBufferPointer { buffer -> Bool in
                var written: Int32 = 0
                var finalWritten: Int32 = 0
                let body = buffer.baseAddress!
                guard EVP_EncryptInit_ex(cipher.pointer, Self.cipher(forKeyBytes: keyBytes.count), nil, nil, nil) == 1,
                    EVP_CIPHER_CTX_ctrl(cipher.pointer, lockbox_evp_ctrl_gcm_set_ivlen, Int32(iv.count), nil) == 1,
                    EVP_EncryptInit_ex(cipher.pointer, nil, nil, keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), iv) == 1,
                    plaintext.isEmpty || EVP_EncryptUpdate(cipher.pointer, body, &written, plaintext, Int32(plaintext.count)) == 1,
                    EVP_EncryptFinal_ex(cipher.pointer, body + Int(written), &finalWritten) == 1,
                    EVP_CIPHER_CTX_ctrl(cipher.pointer, lockbox_evp_ctrl_gcm_get_tag, Int32(tagByteCount), body + plaintext.count) == 1
                else { return false }
                return true
            }
        }
        guard sealed else {
            ERR_clear_error()
            throw LockboxError(LockboxError.Code(rawValue: -2070), "AES-GCM encryption failed in OpenSSL (errSecInternalComponent).")
        }
        return output
    }

    /// The plaintext of `ciphertext || tag`.
    /// - Throws: one opaque `decode` error for any failure to authenticate.
    package static func open(_ box: [UInt8], key: SecretBytes, iv: [UInt8]) throws(LockboxError) -> SecretBytes {
        let failure = LockboxError(.decode, "The ciphertext failed authentication: it was modified, or made for another key.")
        guard box.count >= tagByteCount else { throw failure }
        let count = box.count - tagByteCount
        var tag = Array(box[count...])
        let cipher = try CipherOperation()
        return try SecretBytes(capacity: count) { (output) throws(LockboxError) -> Int in
            let opened = key.withUnsafeBytes { keyBytes -> Bool in
                var written: Int32 = 0
                var finalWritten: Int32 = 0
                var spare = [UInt8](repeating: 0, count: 16)
                let target = output.baseAddress?.assumingMemoryBound(to: UInt8.self)
                guard EVP_DecryptInit_ex(cipher.pointer, Self.cipher(forKeyBytes: keyBytes.count), nil, nil, nil) == 1,
                    EVP_CIPHER_CTX_ctrl(cipher.pointer, lockbox_evp_ctrl_gcm_set_ivlen, Int32(iv.count), nil) == 1,
                    EVP_DecryptInit_ex(cipher.pointer, nil, nil, keyBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), iv) == 1,
                    count == 0 || EVP_DecryptUpdate(cipher.pointer, target, &written, box, Int32(count)) == 1,
                    EVP_CIPHER_CTX_ctrl(cipher.pointer, lockbox_evp_ctrl_gcm_set_tag, Int32(tagByteCount), &tag) == 1
                else { return false }
                return spare.withUnsafeMutableBufferPointer { scratch in
                    EVP_DecryptFinal_ex(cipher.pointer, count == 0 ? scratch.baseAddress! : target! + Int(written), &finalWritten) == 1
                }
            }
            guard opened else {
                ERR_clear_error()
                throw failure
            }
            return count
        }
    }

    private static func cipher(forKeyBytes count: Int) -> OpaquePointer? {
        precondition(count == 16 || count == 32, "an ECIES AES key is 16 or 32 bytes")
        return count == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm()
    }
}

/// The SHA digests the X9.63 KDF and Apple's `...X963SHA*` algorithms name.
package enum HashFunction: Sendable, CaseIterable {
    case sha1, sha224, sha256, sha384, sha512

    package var byteCount: Int {
        switch self {
        case .sha1: 20
        case .sha224: 28
        case .sha256: 32
        case .sha384: 48
        case .sha512: 64
        }
    }

    /// The digest of the concatenation of `parts` (the secret one read in place, not copied).
    package func hash(_ secret: SecretBytes?, _ parts: [UInt8]...) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: byteCount)
        guard let context = EVP_MD_CTX_new() else { preconditionFailure("OpenSSL could not allocate a digest context") }
        defer { EVP_MD_CTX_free(context) }
        var ok = EVP_DigestInit_ex(context, evp, nil) == 1
        if let secret {
            ok = ok && secret.withUnsafeBytes { EVP_DigestUpdate(context, $0.baseAddress, $0.count) == 1 }
        }
        for part in parts { ok = ok && EVP_DigestUpdate(context, part, part.count) == 1 }
        var written: UInt32 = 0
        ok = ok && EVP_DigestFinal_ex(context, &output, &written) == 1
        precondition(ok && Int(written) == byteCount, "a message digest cannot fail")
        return output
    }

    private var evp: OpaquePointer? {
        switch self {
        case .sha1: EVP_sha1()
        case .sha224: EVP_sha224()
        case .sha256: EVP_sha256()
        case .sha384: EVP_sha384()
        case .sha512: EVP_sha512()
        }
    }

    /// ANSI X9.63 KDF (SEC 1 §3.6.1): `hash(Z || counter (32-bit big-endian, from 1) || sharedInfo)`
    /// blocks, concatenated and cut to `count` bytes.
    package func x963(_ secret: SecretBytes, sharedInfo: [UInt8], count: Int) -> SecretBytes {
        SecretBytes(capacity: count) { buffer in
            var filled = 0
            var counter: UInt32 = 1
            while filled < count {
                var block = hash(secret, [UInt8(counter >> 24), UInt8((counter >> 16) & 0xff), UInt8((counter >> 8) & 0xff), UInt8(counter & 0xff)], sharedInfo)
                let take = min(block.count, count - filled)
                for index in 0..<take { buffer[filled + index] = block[index] }
                for index in block.indices { block[index] = 0 }
                filled += take
                counter += 1
            }
            return count
        }
    }
}

/// Apple's ECIES over P-256 (SecKey.h, `kSecKeyAlgorithmECIESEncryption...`): the key schedule,
/// and the opening of a message with the recipient's ECDH, wherever its private key is (in this
/// process, the keychain, or `lockboxd`).
package enum ECIES {
    /// The AES key (16 bytes for P-256) and IV: zero, or the 16 bytes after the key in the KDF's output.
    package static func keyAndIV(_ shared: SecretBytes, ephemeralPoint: [UInt8], hash: HashFunction, variableIV: Bool) -> (SecretBytes, [UInt8]) {
        let keyCount = 16
        guard variableIV else {
            return (hash.x963(shared, sharedInfo: ephemeralPoint, count: keyCount), [UInt8](repeating: 0, count: 16))
        }
        let both = hash.x963(shared, sharedInfo: ephemeralPoint, count: keyCount + 16)
        let key = both.withUnsafeBytes { SecretBytes(copying: $0[0..<keyCount]) }
        let iv = both.withUnsafeBytes { Array($0[keyCount...]) }
        return (key, iv)
    }

    /// The plaintext of `ephemeral public key (65) || ciphertext || tag (16)`; `agree` is ECDH
    /// of the recipient's private key with the ephemeral point (X9.63 form).
    /// - Throws: `decode` for a message too short or failing authentication (one opaque error).
    package static func open(
        _ message: [UInt8], hash: HashFunction, variableIV: Bool, agree: ([UInt8]) throws(LockboxError) -> SecretBytes
    ) throws(LockboxError) -> SecretBytes {
        guard message.count >= P256.publicKeyByteCount + GCMWithDerivedIV.tagByteCount else {
            throw LockboxError(.decode, "The ciphertext is too short to be an ECIES message.")
        }
        let ephemeralPoint = Array(message[0..<P256.publicKeyByteCount])
        let shared = try agree(ephemeralPoint)
        let (aesKey, iv) = keyAndIV(shared, ephemeralPoint: ephemeralPoint, hash: hash, variableIV: variableIV)
        return try GCMWithDerivedIV.open(Array(message[P256.publicKeyByteCount...]), key: aesKey, iv: iv)
    }

    /// The hash and IV of an ECIES algorithm's name
    /// (`algid:encrypt:ECIES:ECDH[C]:KDFX963:SHA256:AESGCM[-KDFIV]`); nil for another name.
    package static func scheme(named name: String) -> (hash: HashFunction, variableIV: Bool)? {
        let parts = name.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 7, parts[0] == "algid", parts[1] == "encrypt", parts[2] == "ECIES", parts[3] == "ECDH" || parts[3] == "ECDHC",
            parts[4] == "KDFX963", parts[6] == "AESGCM" || parts[6] == "AESGCM-KDFIV"
        else { return nil }
        let hash: HashFunction
        switch parts[5] {
        case "SHA1": hash = .sha1
        case "SHA224": hash = .sha224
        case "SHA256": hash = .sha256
        case "SHA384": hash = .sha384
        case "SHA512": hash = .sha512
        default: return nil
        }
        return (hash, parts[6] == "AESGCM-KDFIV")
    }
}
