import Foundation
import Lockbox
import LockboxCore
import LockboxKeys
import LockboxTestSupport
import LockboxVault
import Testing

/// A vault and its key store, in a fresh temporary directory.
struct KeyFixture {
    let vault: VaultFixture
    let keys: SoftwareKeyStore

    /// The unlocked keys stay in this process unless another process must read the vault:
    /// the kernel keyring is shared by every process of the user, and Lockbox keeps only a
    /// bounded number of vaults' keys there, so parallel test runs could evict a fixture's.
    init(cache: UnlockCache = .processMemory) throws {
        vault = try VaultFixture { $0.unlockCache = cache }
        keys = SoftwareKeyStore(vault: vault.vault)
    }

    func generate(
        _ algorithm: KeyAlgorithm, _ purposes: KeyPurposes, tag: String = "com.example.key", label: String? = nil,
        configure: (inout KeySpecification) -> Void = { _ in }
    ) throws -> ManagedKey {
        var specification = KeySpecification(algorithm: algorithm, purposes: purposes)
        specification.applicationTag = Data(tag.utf8)
        specification.label = label
        configure(&specification)
        return try keys.generate(specification)
    }

    /// A file in the fixture's directory holding `bytes`.
    func write(_ bytes: some Sequence<UInt8>, to name: String) throws -> String {
        let path = vault.directory.file(name)
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    func read(_ name: String) throws -> Data {
        try Data(contentsOf: URL(fileURLWithPath: vault.directory.file(name)))
    }

    /// The private bytes as stored (the key API's own path), for canary checks.
    func storedValue(of key: ManagedKey) throws -> [UInt8] {
        var query = Query(.key, returning: [.data])
        query.persistentReference = key.persistentReference
        let value = try #require(try vault.vault.keyMaterial(matching: query).first?.data)
        return value.withUnsafeBytes { Array($0) }
    }
}

/// Runs a peer program, failing the test with its name when it is missing or fails.
@discardableResult
func peer(_ program: String, _ arguments: [String], input: [UInt8] = []) throws -> ProcessResult {
    let path = ["/usr/bin/", "/bin/", "/usr/local/bin/"].map { $0 + program }.first { FileManager.default.isExecutableFile(atPath: $0) }
    let executable = try #require(path, "the test peer \(program) is not installed (scripts/bootstrap --test installs it)")
    let result = try run(executable, arguments, input: input)
    #expect(result.status == 0, "\(program) \(arguments.joined(separator: " ")) failed: \(result.standardError)")
    return result
}

/// Runs Python with `script`; `cryptography` must be importable.
func python(_ script: String, input: [UInt8] = []) throws -> ProcessResult {
    let result = try run("/usr/bin/env", ["python3", "-c", "import cryptography\n" + script], input: input)
    #expect(result.status == 0, "python3 (with the cryptography package, Debian's python3-cryptography) failed: \(result.standardError)")
    return result
}

func hex(_ bytes: some Sequence<UInt8>) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

/// Answers a presence check with the fixture's passphrase, counting the times it was asked.
final class PassphraseVerifier: PresenceVerifier, @unchecked Sendable {
    private let lock = NSLock()
    private var asked = 0
    let cancel: Bool

    init(cancel: Bool = false) { self.cancel = cancel }

    var count: Int { lock.withLock { asked } }

    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        lock.withLock { asked += 1 }
        if cancel { throw LockboxError(.userCanceled, "cancelled") }
        return SecretBytes(utf8: VaultFixture.passphraseText)
    }
}
