// The facade: applications `import Lockbox` and get the model and the default backend.
@_exported import LockboxCore
@_exported import LockboxVault
// `Keychain.Options.secretService` is a `SecretServiceStore.Configuration`: a client that
// imports Lockbox can name it, and use the backend directly.
@_exported import SecretService
// `Keychain.open()` may return the broker's store (`lockboxd`): a client can name it.
@_exported import LockboxBroker
