// swift-tools-version: 6.2
import PackageDescription

let strict: [SwiftSetting] = [.treatAllWarnings(as: .error)]
// The Swift runtime and Foundation linked into the binary: for programs started once per secret
// (`lockbox`, the git and docker credential helpers), loading them as shared libraries is most
// of the start. The compile needs the flag too, so that the modules autolink the static archives.
let staticRuntime: [SwiftSetting] = strict + [.unsafeFlags(["-static-stdlib"], .when(platforms: [.linux]))]
let staticRuntimeLink: [LinkerSetting] = [.unsafeFlags(["-static-stdlib"], .when(platforms: [.linux]))]
// libsodium, SQLite and libkeyutils are linked from their static archives (Debian's -dev
// packages ship them; `-l:libNAME.a` names the archive): as shared libraries, relocating and
// binding them (SQLite alone binds 1,600 symbols at load) costs each short-lived process more
// than its whole read. The price: a security update of one of them needs a rebuild of Lockbox,
// like any statically linked program. Not an unsafe flag, so packages can depend on Lockbox.
func staticArchive(_ library: String) -> [LinkerSetting] {
    [.linkedLibrary(":lib\(library).a", .when(platforms: [.linux]))]
}

let package = Package(
    name: "Lockbox",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Lockbox", targets: ["Lockbox"]),
        .library(name: "LockboxCore", targets: ["LockboxCore"]),
        .library(name: "KeychainCompatibility", targets: ["KeychainCompatibility"]),
        .library(name: "LocalAuthentication", targets: ["LocalAuthentication"]),
        .library(name: "LockboxAuth", targets: ["LockboxAuth"]),
        .library(name: "LockboxAuthKeyring", targets: ["LockboxAuthKeyring"]),
        .library(name: "LockboxKeys", targets: ["LockboxKeys"]),
        .library(name: "LockboxAuthKeys", targets: ["LockboxAuthKeys"]),
        .library(name: "LockboxSync", targets: ["LockboxSync"]),
        .library(name: "LockboxFleet", targets: ["LockboxFleet"]),
        .library(name: "LockboxBrokerIdentity", targets: ["LockboxBrokerIdentity"]),
        .executable(name: "lockbox", targets: ["LockboxCLI"]),
        .executable(name: "lockbox-oauth", targets: ["LockboxOAuthCLI"]),
        .executable(name: "lockbox-keys", targets: ["LockboxKeysCLI"]),
        .executable(name: "lockbox-ssh-agent", targets: ["LockboxSSHAgentCLI"]),
        .executable(name: "lockbox-sync", targets: ["LockboxSyncCLI"]),
        .executable(name: "lockbox-sync-bench", targets: ["LockboxSyncBenchmark"]),
        .executable(name: "lockbox-bench", targets: ["LockboxBenchmark"]),
        .executable(name: "lockbox-stress", targets: ["LockboxStress"]),
        .executable(name: "lockbox-campaign", targets: ["LockboxCampaign"]),
        .executable(name: "lockbox-peer-bench", targets: ["LockboxPeerBenchmark"]),
        .executable(name: "lockbox-key-bench", targets: ["LockboxKeyBenchmark"]),
        .executable(name: "lockbox-dpop-bench", targets: ["LockboxDPoPBenchmark"]),
        .executable(name: "lockbox-broker-bench", targets: ["LockboxBrokerBenchmark"]),
        .executable(name: "lockboxd", targets: ["LockboxBrokerDaemon"]),
        .executable(name: "git-credential-lockbox", targets: ["GitCredentialHelper"]),
        .executable(name: "docker-credential-lockbox", targets: ["DockerCredentialHelper"]),
    ],
    targets: [
        // C libraries from Debian's -dev packages; each is imported by exactly one Swift target,
        // which links the package's static archive (see `staticArchive`).
        .systemLibrary(name: "CSodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CKeyutils", providers: [.apt(["libkeyutils-dev"])]),
        // OpenSSL's libcrypto, for P-256 and AES-GCM (managed keys). Linked as a shared library,
        // unlike the three above: see `KeyCrypto`.
        .systemLibrary(name: "CCrypto", providers: [.apt(["libssl-dev"])]),
        // libcurl, for the CLI's HTTP transport: linked as a shared library, which
        // FoundationNetworking already loads into lockbox-oauth.
        .systemLibrary(name: "CCurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        // PostgreSQL's client library, for sync (the only CLibPQ importer is LockboxSync).
        // Linked as a shared library: libpq.a would pull in OpenSSL, Kerberos and LDAP.
        .systemLibrary(name: "CLibPQ", providers: [.apt(["libpq-dev"])]),

        // The model and the backend SPI. No C imports.
        .target(name: "LockboxCore", swiftSettings: strict),

        // The vault's parts: crypto (the only CSodium importer), storage (the only CSQLite
        // importer), key providers (the only CKeyutils importer), and the store itself.
        .target(
            name: "VaultCrypto", dependencies: ["CSodium", "LockboxCore"], swiftSettings: strict,
            linkerSettings: staticArchive("sodium")),
        // A VFS over SQLite's own that hands a commit's write-ahead log frames to the file in
        // one write (VaultStorage's Database; C, because a VFS is a table of C callbacks).
        .target(name: "CWriteAheadBuffer"),
        .target(
            name: "VaultStorage", dependencies: ["CSQLite", "CWriteAheadBuffer", "LockboxCore"], swiftSettings: strict,
            linkerSettings: staticArchive("sqlite3")),
        .target(
            name: "KeyProviders", dependencies: ["CKeyutils", "LockboxCore", "VaultCrypto"], swiftSettings: strict,
            linkerSettings: staticArchive("keyutils")),
        .target(
            name: "LockboxVault",
            dependencies: ["LockboxCore", "VaultCrypto", "VaultStorage", "KeyProviders", "TPMAccess"],
            swiftSettings: strict),

        // Managed keys' cryptography over OpenSSL (the only CCrypto importer): P-256 ECDSA and
        // ECDH, AES-256-GCM, SHA-1/SHA-256. libcrypto is linked as a shared library, not from
        // libcrypto.a: OpenSSL gets security fixes several times a year, and Debian's libssl3
        // update then reaches every program without a rebuild; only the targets that use keys
        // link it, so the `lockbox` start (docs/PERFORMANCE.md) does not pay for its loading.
        .target(
            name: "KeyCrypto", dependencies: ["CCrypto", "LockboxCore"], swiftSettings: strict,
            linkerSettings: [.linkedLibrary("crypto", .when(platforms: [.linux]))]),
        // The tss2 ESAPI functions (TPM 2.0), declared by Debian's libtss2-dev headers and opened
        // with dlopen on first use: the libraries (and the libcrypto they load) are mapped only by
        // a process that reaches a TPM, so every program may link TPMAccess, the static `lockbox`
        // included, which reads a TPM-sealed device key.
        .target(name: "CTss2Loader", linkerSettings: [.linkedLibrary("dl")]),
        // A TPM 2.0 through ESAPI (the only CTss2Loader importer): keys made inside it,
        // signatures, secrets sealed to it (the vault's TPM unlock slot and device key).
        .target(name: "TPMAccess", dependencies: ["CTss2Loader", "LockboxCore"], swiftSettings: strict),
        // Keys in Lockbox's own terms (generate for a purpose, sign, encrypt, agree, export the
        // public half), stored as vault items of class `.key`.
        .target(
            name: "LockboxKeys", dependencies: ["LockboxCore", "LockboxVault", "VaultCrypto", "KeyCrypto", "TPMAccess"],
            swiftSettings: strict),

        // The SSH agent protocol over managed keys: the parser, the answers, the socket.
        .target(name: "LockboxSSHAgent", dependencies: ["LockboxCore", "LockboxKeys"], swiftSettings: strict),
        // End-to-end encrypted sync of synchronizable items through PostgreSQL (docs/SYNC.md).
        .target(
            name: "LockboxSync", dependencies: ["CLibPQ", "LockboxCore", "LockboxVault", "VaultCrypto", "VaultStorage"], swiftSettings: strict),

        // A fleet's OAuth session in a sync group's database: LockboxAuth's store, cache and lock.
        .target(
            name: "LockboxFleet", dependencies: ["LockboxAuth", "LockboxSync", "LockboxCore", "VaultCrypto"], swiftSettings: strict),
        // The fleet test's worker: one process of one machine asking for tokens.
        .executableTarget(
            name: "lockbox-fleet-worker", dependencies: ["LockboxFleet", "LockboxAuth", "LockboxCurlTransport", "LockboxSync", "Lockbox"],
            path: "Sources/LockboxFleetWorker", swiftSettings: strict),

        // libsecret's functions, declared from its documented ABI and opened with dlopen on first
        // use: nothing links libsecret or GLib, so binaries start without them.
        .target(name: "CLibSecretLoader", linkerSettings: [.linkedLibrary("dl")]),
        // The desktop keychain backend (the only CLibSecretLoader importer).
        .target(name: "SecretService", dependencies: ["CLibSecretLoader", "LockboxCore"], swiftSettings: strict),
        // git and docker credential-helper protocols over any ItemStore.
        .target(name: "CredentialHelpers", dependencies: ["LockboxCore", "CProcessHardening"], swiftSettings: strict),
        .executableTarget(
            name: "GitCredentialHelper", dependencies: ["CredentialHelpers", "Lockbox"],
            swiftSettings: staticRuntime, linkerSettings: staticRuntimeLink),
        .executableTarget(
            name: "DockerCredentialHelper", dependencies: ["CredentialHelpers", "Lockbox"],
            swiftSettings: staticRuntime, linkerSettings: staticRuntimeLink),

        // The OAuth 2.0 credential lifecycle, over the small TokenStore interface.
        .target(name: "LockboxAuth", dependencies: ["LockboxCore"], swiftSettings: strict),
        // LockboxAuth's shared access-token cache in the kernel keyring, over KeyProviders (the
        // one CKeyutils importer): apart, so that LockboxAuth depends on LockboxCore only.
        .target(
            name: "LockboxAuthKeyring", dependencies: ["LockboxAuth", "KeyProviders", "LockboxCore"], swiftSettings: strict),
        // An HTTPTransport over libcurl (the only CCurl importer) whose waits sleep in poll(2):
        // URLSession on Linux keeps most of a core busy while a server takes its time.
        .target(name: "LockboxCurlTransport", dependencies: ["CCurl", "LockboxAuth", "LockboxCore"], swiftSettings: strict),
        // Managed keys as LockboxAuth's DPoP signers: the one place that knows both.
        .target(name: "LockboxAuthKeys", dependencies: ["LockboxCore", "LockboxAuth", "LockboxKeys", "LockboxBroker"], swiftSettings: strict),

        // The broker's wire protocol, its server and its client store (docs/BROKER.md). No key
        // API: the daemon adds the key operations, so that clients never load libcrypto.
        .target(name: "LockboxBroker", dependencies: ["LockboxCore", "LockboxVault"], swiftSettings: strict),
        // `lockboxd`, the per-user broker: holds the unlocked keys and serves the vault.
        .executableTarget(
            name: "LockboxBrokerDaemon",
            dependencies: ["Lockbox", "LockboxBroker", "LockboxBrokerIdentity", "LockboxKeys", "KeyCrypto", "CProcessHardening"],
            swiftSettings: strict),

        // The facade applications import.
        .target(name: "Lockbox", dependencies: ["LockboxCore", "LockboxVault", "SecretService", "LockboxBroker"], swiftSettings: strict),

        // Apple's SecItem API (SecItemAdd, kSec* keys, errSec* codes) on Linux, over any ItemStore.
        // SecKey over LockboxKeys; LAContext (LocalAuthentication) as kSecUseAuthenticationContext.
        .target(
            name: "KeychainCompatibility",
            dependencies: ["Lockbox", "LockboxKeys", "KeyCrypto", "VaultCrypto"],
            swiftSettings: strict),
        // Apple's LocalAuthentication (`LAContext`, `LAError`) over Lockbox's presence check.
        .target(name: "LocalAuthentication", dependencies: ["KeychainCompatibility", "Lockbox"], swiftSettings: strict),

        // Who is at the other end of the broker's socket (SO_PEERCRED, pidfd, /proc), which access
        // groups the policy grants it, and the broker's systemd user units. The C side holds the
        // calls Swift cannot make (struct ucred, syscall(2)).
        .target(name: "CPeerIdentity"),
        .target(name: "LockboxBrokerIdentity", dependencies: ["LockboxCore", "CPeerIdentity"], swiftSettings: strict),

        // prctl(2) is variadic and cannot be called from Swift: a few lines of C do it.
        .target(name: "CProcessHardening"),
        // The CLI's argument parser, apart from the executable so the fuzzer can link it.
        .target(name: "LockboxCommandLine", dependencies: ["Lockbox"], swiftSettings: strict),
        // `lockbox` starts for every secret a script or helper reads, so it links the Swift
        // runtime and Foundation statically and leaves the HTTP stack to `lockbox-oauth`, which
        // it runs for the OAuth verbs (docs/PERFORMANCE.md, "Process start"). Tests run the built
        // binaries (`swift build` makes them) rather than depend on these targets: a test target
        // that depends on an executable target links its objects, and so its link flags.
        .executableTarget(
            name: "LockboxCLI", dependencies: ["Lockbox", "LockboxCommandLine", "KeyProviders", "CProcessHardening", "LockboxBrokerIdentity"],
            swiftSettings: staticRuntime, linkerSettings: staticRuntimeLink),
        .executableTarget(
            name: "LockboxOAuthCLI",
            dependencies: [
                "Lockbox", "LockboxCommandLine", "LockboxAuth", "LockboxAuthKeyring", "LockboxAuthKeys", "LockboxKeys", "LockboxCurlTransport",
                "CProcessHardening",
            ],
            swiftSettings: strict),
        // The key verbs and the TPM unlock, which `lockbox` runs for them: only they load
        // libcrypto, and the tss2 libraries (which `lockbox` opens itself only to unseal a
        // TPM-sealed device key).
        .executableTarget(
            name: "LockboxKeysCLI", dependencies: ["Lockbox", "LockboxBroker", "LockboxCommandLine", "LockboxKeys", "CProcessHardening"],
            swiftSettings: strict),
        // `lockbox ssh-agent` runs this program, as the OAuth verbs run `lockbox-oauth`: only it
        // loads libcrypto and Foundation.
        .executableTarget(
            name: "LockboxSSHAgentCLI",
            dependencies: ["Lockbox", "LockboxCommandLine", "LockboxKeys", "LockboxSSHAgent", "CProcessHardening"],
            swiftSettings: strict),
        // `lockbox sync` runs this program: only it loads libpq.
        .executableTarget(
            name: "LockboxSyncCLI", dependencies: ["Lockbox", "LockboxCommandLine", "LockboxSync", "CProcessHardening"],
            swiftSettings: strict),
        // Sync against a plain COPY of the same rows, and an incremental sync (docs/SYNC.md).
        .executableTarget(
            name: "LockboxSyncBenchmark", dependencies: ["LockboxSync", "LockboxVault", "VaultStorage", "VaultCrypto", "Lockbox"], swiftSettings: strict),
        .executableTarget(
            name: "LockboxBenchmark",
            dependencies: ["Lockbox", "VaultCrypto", "VaultStorage"],
            swiftSettings: strict),
        .executableTarget(name: "LockboxStress", dependencies: ["Lockbox", "LockboxAuth"], swiftSettings: strict),
        // The crash, fault-injection and leak campaigns (docs/RELIABILITY.md), and their driver.
        .target(
            name: "LockboxCampaigns", dependencies: ["Lockbox", "LockboxAuth", "LockboxSync", "VaultStorage"], swiftSettings: strict),
        .executableTarget(name: "LockboxCampaign", dependencies: ["LockboxCampaigns"], swiftSettings: strict),
        // Managed-key signatures against OpenSSL's and libsodium's in-process calls (docs/KEYS.md).
        .executableTarget(
            name: "LockboxKeyBenchmark", dependencies: ["LockboxKeys", "KeyCrypto", "VaultCrypto", "LockboxVault"],
            swiftSettings: strict),
        // A DPoP proof against the signature inside it (docs/AUTH.md).
        .executableTarget(
            name: "LockboxDPoPBenchmark", dependencies: ["LockboxAuth", "LockboxAuthKeys", "LockboxKeys", "LockboxCore", "LockboxVault"],
            swiftSettings: strict),
        // A read through lockboxd against the embedded read, ssh-agent and the Secret Service
        // (scripts/bench-broker, docs/BROKER.md).
        .executableTarget(name: "LockboxBrokerBenchmark", dependencies: ["Lockbox"], swiftSettings: strict),
        // The in-process side of scripts/compare-peers (docs/PERFORMANCE.md).
        .executableTarget(name: "LockboxPeerBenchmark", dependencies: ["Lockbox"], swiftSettings: strict),
        .executableTarget(
            name: "lockbox-auth-worker", dependencies: ["LockboxAuth", "Lockbox"], path: "Sources/LockboxAuthWorker",
            swiftSettings: strict),

        // Every test process gets a temporary HOME and XDG directories before `main`, so no test
        // writes into the real home (see Tests/CTestIsolation/test_isolation.c).
        .target(name: "CTestIsolation", path: "Tests/CTestIsolation"),
        // Temporary directories, canaries and process helpers shared by the test targets.
        .target(
            name: "LockboxTestSupport", dependencies: ["Lockbox", "TPMAccess", "CTestIsolation"], path: "Tests/LockboxTestSupport",
            swiftSettings: strict),
        // Test targets depend on no executable target (that would link its objects and its link
        // flags into the tests): the tests run the programs that `swift build --build-tests`
        // makes beside them (lockbox, lockbox-stress, lockbox-auth-worker, the helpers).
        .testTarget(name: "LockboxCoreTests", dependencies: ["LockboxCore", "LockboxTestSupport"], swiftSettings: strict),
        .testTarget(
            name: "LockboxVaultTests",
            dependencies: ["LockboxVault", "VaultCrypto", "VaultStorage", "KeyProviders", "Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "ItemStoreBehaviourTests", dependencies: ["Lockbox", "SecretService", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "SecretServiceTests",
            dependencies: ["SecretService", "CredentialHelpers", "Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxAuthTests",
            dependencies: [
                "LockboxAuth", "LockboxAuthKeyring", "LockboxAuthKeys", "LockboxKeys", "KeyProviders", "Lockbox", "LockboxBroker",
                "LockboxTestSupport",
            ],
            swiftSettings: strict),
        .testTarget(
            name: "KeychainCompatibilityTests",
            dependencies: ["KeychainCompatibility", "Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "LocalAuthenticationTests",
            dependencies: ["LocalAuthentication", "KeychainCompatibility", "Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "ReliabilityTests",
            dependencies: ["LockboxCampaigns", "LockboxTestSupport", "VaultStorage"],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxKeysTests",
            dependencies: [
                "LockboxKeys", "KeyCrypto", "VaultCrypto", "LockboxVault", "Lockbox", "KeychainCompatibility", "LockboxTestSupport", "TPMAccess",
            ],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxAuthKeysTests",
            dependencies: ["LockboxAuthKeys", "LockboxAuth", "LockboxKeys", "Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxSSHAgentTests",
            dependencies: ["LockboxSSHAgent", "LockboxKeys", "Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxSyncTests",
            dependencies: ["LockboxSync", "LockboxFleet", "LockboxAuth", "LockboxVault", "LockboxKeys", "Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxBrokerTests",
            dependencies: ["LockboxBroker", "Lockbox", "LockboxVault", "LockboxKeys", "KeychainCompatibility", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxBrokerIdentityTests", dependencies: ["LockboxBrokerIdentity", "LockboxTestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "LockboxCLITests",
            dependencies: ["Lockbox", "LockboxTestSupport"],
            swiftSettings: strict),
    ]
)

// `import Security` on Linux: a module of that name re-exports KeychainCompatibility, so Keychain
// code compiles with no edit (docs/SECITEM.md, "Zero-edit"). Declared on Linux only: on Apple
// platforms the name is the system's framework.
#if os(Linux)
package.products.append(.library(name: "Security", targets: ["Security"]))
package.targets.append(.target(name: "Security", dependencies: ["KeychainCompatibility"], swiftSettings: strict))
#endif

// The libFuzzer harness (Fuzz/, docs/FUZZING.md) exists only in the instrumented build that
// scripts/fuzz makes with LOCKBOX_FUZZ=1 and `-sanitize=fuzzer`: its `main` calls libFuzzer's
// driver, which only that build links, and it imports internals with @testable (debug only).
if Context.environment["LOCKBOX_FUZZ"] == "1" {
    package.products.append(.executable(name: "lockbox-fuzz", targets: ["LockboxFuzz"]))
    package.targets.append(
        .executableTarget(
            name: "LockboxFuzz",
            dependencies: [
                "LockboxCore", "LockboxVault", "VaultCrypto", "CredentialHelpers", "LockboxAuth", "LockboxCommandLine", "LockboxKeys",
                "TPMAccess",
                "LockboxSSHAgent", "LockboxBroker",
            ],
            path: "Fuzz/Sources"))
}
