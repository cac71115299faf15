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
