import LockboxCore

extension Vault {
    /// Asks the user through `context` now, as reading an access-controlled item would, and
    /// remembers the verification in `context` for its reuse window: `LAContext.evaluatePolicy`.
    /// A verification still remembered answers at once.
    /// - Throws: `authFailed` for a wrong passphrase or a keychain without one;
    ///   `interactionNotAllowed` when the context cannot ask; `userCanceled`.
    public func verifyUser(through context: AuthenticationContext, reason: String) throws(LockboxError) {
        let realm = try withState { state throws(LockboxError) -> String in
            guard state.header.presencePublicKey != nil, state.header.hasPassphrase else {
                throw LockboxError(
                    .authFailed, "This keychain has no passphrase to verify the user with. Set one with `lockbox set-passphrase`.")
            }
            return state.header.vaultID.hexString
        }
        if context.rememberedProof(realm: realm) != nil { return }
        guard !context.interactionNotAllowed, let verifier = context.verifier else {
            throw LockboxError(
                .interactionNotAllowed, "Verifying the user needs the passphrase, and no interaction is allowed here.")
        }
        // Asked and derived outside the vault's lock, as for an item (`withStateVerifyingUser`).
        let passphrase = try verifier.passphrase(for: AuthenticationRequest(reason: reason, accessControl: .userPresence))
        let verified = try checkPassphrase(passphrase, failure: "User verification failed: the passphrase is wrong")
        guard let secretKey = verified.presence else {
            throw LockboxError(.authFailed, "User verification failed: the passphrase is wrong.")
        }
        // Kept for the context's reuse window (none when it has no window).
        context.remember(secretKey, realm: realm)
    }
}

extension Vault {
    /// A passphrase verified as user presence: what opens access-controlled items, for the
    /// vault whose realm it names.
    package struct VerifiedPresence: Sendable {
        /// The vault's identity, as ``AuthenticationContext`` remembers proofs under it.
        package let realm: String
        /// The presence key the passphrase unwrapped.
        package let secretKey: SecretBytes
    }

    /// Checks `passphrase` as the user's verification for someone who cannot ask here (the
    /// broker, for a client that asked its user): a wrong one counts in the failed-attempt
    /// back-off, as every passphrase check does.
    /// - Throws: `authFailed` for a wrong passphrase or a keychain without one.
    package func verifyPresence(passphrase: SecretBytes) throws(LockboxError) -> VerifiedPresence {
        let realm = try withState { state throws(LockboxError) -> String in
            guard state.header.presencePublicKey != nil, state.header.hasPassphrase else {
                throw LockboxError(
                    .authFailed, "This keychain has no passphrase to verify the user with. Set one with `lockbox set-passphrase`.")
            }
            return state.header.vaultID.hexString
        }
        let verified = try checkPassphrase(passphrase, failure: "User verification failed: the passphrase is wrong")
        guard let secretKey = verified.presence else {
            throw LockboxError(.authFailed, "User verification failed: the passphrase is wrong.")
        }
        return VerifiedPresence(realm: realm, secretKey: secretKey)
    }
}
