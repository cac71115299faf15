import Lockbox

extension Keychain.Opened {
    /// Where the OAuth commands keep their cross-process lock files: beside the vault file.
    package func oauthLockDirectory(explicitPath: String?) -> String {
        (vault?.path ?? broker?.vaultPath ?? Keychain.vaultPath(explicit: explicitPath)) + ".oauth-locks"
    }

    /// The shared access-token cache's namespace: the lock directory, with the backend named when
    /// it is not the vault. A session in the desktop keyring and one in the vault at the same path
    /// are different sessions (maybe different accounts on the server) and must never answer with
    /// each other's token. (Paths hold no NUL, so the two never meet.)
    package func accessTokenCacheNamespace(explicitPath: String?) -> String {
        let directory = oauthLockDirectory(explicitPath: explicitPath)
        // The broker serves the vault file itself: the same sessions as the embedded vault.
        return backend == .vault || backend == .broker ? directory : directory + "\u{0}" + backend.rawValue
    }
}
