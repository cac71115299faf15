// Types that public APIs name, each named here from a client with only the products imported.
import Lockbox
import LockboxAuth
import LockboxCore

var options = Keychain.Options(backend: .secretService)
let configuration: SecretServiceStore.Configuration = SecretServiceStore.Configuration(collection: "session")
options.secretService = configuration
let vaultConfiguration: Vault.Configuration = options.vault
let store: any ItemStore.Type = SecretServiceStore.self
let tokenStore: any TokenStore.Type = ItemStoreTokenStore.self
let status: VaultStatus.Type = VaultStatus.self
print("public types: \(options.secretService.collection), \(vaultConfiguration.maximumValueSize), \(store), \(tokenStore), \(status)")
