import FoundationEssentials
import LockboxCore

// The async counterparts, as the item store has them (`vault.async`): each runs the blocking
// call (SQLite, and for an access-controlled key the user's passphrase and Argon2id) on a
// thread outside Swift's cooperative pool.

extension SoftwareKeyStore {
    /// ``generate(_:)``, off the cooperative pool.
    public func generate(_ specification: KeySpecification) async throws(LockboxError) -> ManagedKey {
        try await BlockingCall.run { () throws(LockboxError) in try self.generate(specification) }
    }

    /// ``keys(applicationTag:label:)``, off the cooperative pool.
    public func keys(applicationTag: Data? = nil, label: String? = nil) async throws(LockboxError) -> [ManagedKey] {
        try await BlockingCall.run { () throws(LockboxError) in try self.keys(applicationTag: applicationTag, label: label) }
    }
}

extension ManagedKey {
    /// ``sign(_:context:)``, off the cooperative pool.
    public func sign(_ message: Data, context: AuthenticationContext? = nil) async throws(LockboxError) -> Data {
        try await BlockingCall.run { () throws(LockboxError) in try self.sign(message, context: context) }
    }

    /// ``encrypt(_:authenticating:context:)-(SecretBytes,_,_)``, off the cooperative pool.
    public func encrypt(_ plaintext: SecretBytes, authenticating associatedData: Data = Data(), context: AuthenticationContext? = nil)
        async throws(LockboxError) -> Data
    {
        try await BlockingCall.run { () throws(LockboxError) in try self.encrypt(plaintext, authenticating: associatedData, context: context) }
    }

    /// ``decrypt(_:authenticating:context:)``, off the cooperative pool.
    public func decrypt(_ box: Data, authenticating associatedData: Data = Data(), context: AuthenticationContext? = nil)
        async throws(LockboxError) -> SecretBytes
    {
        try await BlockingCall.run { () throws(LockboxError) in try self.decrypt(box, authenticating: associatedData, context: context) }
    }

    /// ``sharedSecret(with:context:)``, off the cooperative pool.
    public func sharedSecret(with peer: PublicKey, context: AuthenticationContext? = nil) async throws(LockboxError) -> SecretBytes {
        try await BlockingCall.run { () throws(LockboxError) in try self.sharedSecret(with: peer, context: context) }
    }

    /// ``delete(context:)``, off the cooperative pool.
    public func delete(context: AuthenticationContext? = nil) async throws(LockboxError) {
        try await BlockingCall.run { () throws(LockboxError) in try self.delete(context: context) }
    }
}
