// The facade: applications `import Lockbox` and get the model and the default backend.
@_exported import LockboxCore
@_exported import LockboxVault
