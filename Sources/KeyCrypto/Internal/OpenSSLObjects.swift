internal import CCrypto
import LockboxCore

// Each OpenSSL object is owned by exactly one of these classes and freed in its `deinit`, on the
// success path and on every failure path alike. None of them leaves this target.

/// An `EVP_PKEY` (a key pair or a public key). OpenSSL clears private key material on free.
final class KeyObject {
    let pointer: OpaquePointer

    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { EVP_PKEY_free(pointer) }
}

/// An `EVP_PKEY_CTX`: the context of one key operation (generation, import, derivation).
final class KeyOperation {
    let pointer: OpaquePointer

    /// A context for algorithm `name` ("EC"), with no key yet.
    init(algorithm name: String) throws(LockboxError) {
        guard let pointer = EVP_PKEY_CTX_new_from_name(nil, name, nil) else { throw OpenSSLFailure.error("EVP_PKEY_CTX_new_from_name") }
        self.pointer = pointer
    }

    /// A context for operations with `key`.
    init(key: KeyObject) throws(LockboxError) {
        guard let pointer = EVP_PKEY_CTX_new_from_pkey(nil, key.pointer, nil) else { throw OpenSSLFailure.error("EVP_PKEY_CTX_new_from_pkey") }
        self.pointer = pointer
    }

    deinit { EVP_PKEY_CTX_free(pointer) }
}

/// An `EVP_MD_CTX`: one signature or verification.
final class DigestOperation {
    let pointer: OpaquePointer

    init() throws(LockboxError) {
        guard let pointer = EVP_MD_CTX_new() else { throw OpenSSLFailure.error("EVP_MD_CTX_new") }
        self.pointer = pointer
    }

    deinit { EVP_MD_CTX_free(pointer) }
}

/// An `EVP_CIPHER_CTX`: one AES-GCM seal or open. Freeing it clears the key schedule.
final class CipherOperation {
    let pointer: OpaquePointer

    init() throws(LockboxError) {
        guard let pointer = EVP_CIPHER_CTX_new() else { throw OpenSSLFailure.error("EVP_CIPHER_CTX_new") }
        self.pointer = pointer
    }

    deinit { EVP_CIPHER_CTX_free(pointer) }
}

/// A `BIGNUM` that may hold a private scalar: cleared on free.
final class SecretNumber {
    var pointer: OpaquePointer?

    init() {}

    deinit { BN_clear_free(pointer) }
}

/// OpenSSL failures that are not the caller's fault: the error queue is cleared (it is
/// per-thread and would otherwise grow), and the message names the call, never data.
enum OpenSSLFailure {
    static func error(_ operation: String) -> LockboxError {
        ERR_clear_error()
        return LockboxError(.io, "OpenSSL's libcrypto failed in \(operation). Check that libssl3 is installed and intact.")
    }
}
