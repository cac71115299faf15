#if !canImport(Darwin)
import Foundation
import Lockbox

/// The keychain access groups an application holds: Apple's entitlements, declared beside the
/// executable or through the API.
///
/// **File.** `NAME.entitlements` beside the executable `NAME` (or `lockbox.entitlements` there),
/// a property list with Apple's entitlement keys, so the file Xcode keeps for the iOS build
/// works unchanged:
///
/// ```xml
/// <plist version="1.0"><dict>
///     <key>application-identifier</key><string>TEAMID.com.example.app</string>
///     <key>keychain-access-groups</key>
///     <array><string>TEAMID.com.example.shared</string></array>
/// </dict></plist>
/// ```
///
/// The groups, in Apple's order: `keychain-access-groups`, then `application-identifier`, then
/// `com.apple.security.application-groups`. The first is where items without
/// `kSecAttrAccessGroup` go; a group outside the list is `errSecMissingEntitlement` (-34018).
/// Without `application-identifier` the identifier is `Bundle.main.bundleIdentifier` (an
/// `Info.plist` beside the executable with `CFBundleIdentifier`). The file names what one
/// executable may use, keyed by nothing else, so a broker that checks a client's executable
/// can read the same file for it. See docs/SECITEM.md, "Access groups".
public struct KeychainEntitlements: Sendable, Hashable {
    /// `application-identifier`.
    public var applicationIdentifier: String?
    /// `keychain-access-groups`.
    public var keychainAccessGroups: [String]
    /// `com.apple.security.application-groups`.
    public var applicationGroups: [String]

    public init(applicationIdentifier: String?, keychainAccessGroups: [String] = [], applicationGroups: [String] = []) {
        self.applicationIdentifier = applicationIdentifier
        self.keychainAccessGroups = keychainAccessGroups
        self.applicationGroups = applicationGroups
    }

    /// The groups in Apple's order, without repeats or empty names; the first is the default.
    public var accessGroups: [String] {
        var seen = Set<String>()
        return (keychainAccessGroups + [applicationIdentifier].compactMap { $0 } + applicationGroups).filter {
            !$0.isEmpty && seen.insert($0).inserted
        }
    }

    /// Reads an entitlements property list.
    /// - Throws: `param` when the file is not a property-list dictionary with string values
    ///   under those keys; `io` when it cannot be read.
    public init(contentsOf url: URL) throws(LockboxError) {
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw LockboxError(.io, "The entitlements file \(url.path) could not be read.")
        }
        guard let plist = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any] else {
            throw LockboxError(.param, "The entitlements file \(url.path) is not a property-list dictionary.")
        }
        func strings(_ key: String) throws(LockboxError) -> [String] {
            guard let value = plist[key] else { return [] }
            guard let list = value as? [Any], list.allSatisfy({ $0 is String }) else {
                throw LockboxError(.param, "In \(url.path), \(key) must be an array of strings.")
            }
            return list.compactMap { $0 as? String }
        }
        if let identifier = plist["application-identifier"], !(identifier is String) {
            throw LockboxError(.param, "In \(url.path), application-identifier must be a string.")
        }
        self.init(
            applicationIdentifier: plist["application-identifier"] as? String,
            keychainAccessGroups: try strings("keychain-access-groups"),
            applicationGroups: try strings("com.apple.security.application-groups"))
    }

    /// The main executable's entitlements: its entitlements file when there is one, else its
    /// bundle identifier alone; nil when it has neither (every group is then allowed, and items
    /// go to the vault's default group).
    /// - Throws: the file's error, when a file exists and is malformed.
    public static func forMainExecutable() throws(LockboxError) -> KeychainEntitlements? {
        let bundleIdentifier = Bundle.main.bundleIdentifier
        if let executable = Bundle.main.executableURL {
            let directory = executable.deletingLastPathComponent()
            for name in [executable.lastPathComponent + ".entitlements", "lockbox.entitlements"] {
                let candidate = directory.appendingPathComponent(name)
                // Not followed: a symbolic link whose target is missing is an error below, never
                // the absence of a file (which would leave every group open).
                if (try? FileManager.default.attributesOfItem(atPath: candidate.path)) != nil {
                    var entitlements = try KeychainEntitlements(contentsOf: candidate)
                    if entitlements.applicationIdentifier == nil { entitlements.applicationIdentifier = bundleIdentifier }
                    return entitlements
                }
            }
        }
        return bundleIdentifier.map { KeychainEntitlements(applicationIdentifier: $0) }
    }
}
#endif
