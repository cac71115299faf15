// swift-tools-version: 6.2
// A package outside Lockbox's own targets that depends on it as a client does (by path here;
// `.package(url: "https://github.com/lockbox-swift/lockbox.git", from: "0.1.0")` elsewhere) and
// builds the documented examples of every library product. scripts/consumer-package writes the
// examples' sources from README.md, docs/AUTH.md, docs/SECITEM.md and docs/KEYS.md, builds and runs them.
import PackageDescription

// On Linux, Lockbox's `Security` and `LocalAuthentication` products stand in for Apple's
// frameworks; on Apple platforms the system's are used and these dependencies drop out.
let security: Target.Dependency = .product(name: "Security", package: "Lockbox", condition: .when(platforms: [.linux]))
let localAuthentication: Target.Dependency = .product(
    name: "LocalAuthentication", package: "Lockbox", condition: .when(platforms: [.linux]))

let package = Package(
    name: "LockboxConsumer",
    platforms: [.macOS(.v15)],
    dependencies: [.package(name: "Lockbox", path: "../..")],
    targets: [
        // README.md: reading a secret, with the three outcomes a program meets.
        .executableTarget(name: "ReadmeRead", dependencies: [.product(name: "Lockbox", package: "Lockbox")]),
        // README.md: add or update.
        .executableTarget(name: "ReadmeStore", dependencies: [.product(name: "Lockbox", package: "Lockbox")]),
        // docs/SECITEM.md: Apple's SecItem API, through `import Security`.
        .executableTarget(name: "SecItemExample", dependencies: [security]),
        // Keychain code as iOS libraries write it, compiled unchanged (docs/SECITEM.md,
        // "Zero-edit"): a wrapper store, a DPoP key store, LocalAuthentication, a file that imports
        // only Foundation. Its tests run over a vault.
        .target(name: "KeychainWrapper", dependencies: [security, localAuthentication]),
        .testTarget(
            name: "KeychainWrapperTests",
            dependencies: ["KeychainWrapper", security, localAuthentication, .product(name: "Lockbox", package: "Lockbox")]),
        // Bundle.main.bundleIdentifier and the access groups from files beside the executable.
        .executableTarget(name: "BundleProbe", dependencies: [security]),
        // docs/AUTH.md: the OAuth 2.0 lifecycle (built; running it needs an authorization server).
        .executableTarget(
            name: "AuthExample",
            dependencies: [.product(name: "Lockbox", package: "Lockbox"), .product(name: "LockboxAuth", package: "Lockbox")]),
        // docs/KEYS.md: managed keys.
        .executableTarget(
            name: "KeysExample",
            dependencies: [.product(name: "Lockbox", package: "Lockbox"), .product(name: "LockboxKeys", package: "Lockbox")]),
        // Every type a public API names can be named by a client: a library product imports it.
        .executableTarget(
            name: "PublicTypes",
            dependencies: [
                .product(name: "Lockbox", package: "Lockbox"), .product(name: "LockboxCore", package: "Lockbox"),
                .product(name: "LockboxAuth", package: "Lockbox"),
            ]),
    ]
)
